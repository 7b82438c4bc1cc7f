"""Shared test helpers (a module with a unique name, so test directories never shadow it)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
from hypothesis import strategies as st

from rkv import EngineConfig, ModelSpec, TierConfig
from rkv.tiers import Tier, TierWrapper

SMALL = ModelSpec("test/small", n_layers=3, n_kv_heads=2, head_dim=4, dtype="float16")


def local_config(chunk_tokens: int = 16, caps: tuple[int, int, int] | None = None,
                 policy: str = "prefix", **kw: object) -> EngineConfig:
    """Three tiers, all inside the store directory (tests never touch /dev/shm)."""
    caps = caps or (1 << 30, 1 << 30, 1 << 30)
    tiers = (
        TierConfig("dram", medium="memory", path="t/dram", capacity_bytes=caps[0],
                   policy=policy),
        TierConfig("cxl", medium="memory", path="t/cxl", capacity_bytes=caps[1],
                   policy=policy),
        TierConfig("nvme", medium="disk", path="t/nvme", capacity_bytes=caps[2],
                   policy=policy),
    )
    return EngineConfig(chunk_tokens=chunk_tokens, tiers=tiers, **kw)  # type: ignore[arg-type]


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    """The single ``rkv: error:`` line a failed command wrote to stderr (no traceback)."""
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert "Traceback" not in err and len(lines) == 1, err
    assert lines[0].startswith("rkv: error: "), err
    return lines[0]


def chunk_bytes(n: int = 16, spec: ModelSpec = SMALL) -> int:
    """Bytes one ``n``-token chunk of ``spec`` (float16) takes in a tier: all its layers'
    records."""
    from rkv.format.record import RecordHeader, array_record_size

    h = RecordHeader(key=bytes(32), layer=0, fingerprint=bytes(16),
                     shape=spec.block_shape(n), dtype=spec.dtype, data_len=0, payload_len=0)
    return array_record_size(h, 2 * n * spec.n_kv_heads * spec.head_dim * 2) * spec.n_layers


def random_kv(spec: ModelSpec, n: int, seed: int = 0) -> np.ndarray:
    from rkv.format.dtypes import numpy_dtype

    rng = np.random.default_rng(seed)
    x = rng.standard_normal((spec.n_layers, 2, n, spec.n_kv_heads, spec.head_dim))
    return x.astype(numpy_dtype(spec.dtype))



class HeldTier(TierWrapper):
    """Wraps a tier; a read waits until ``release`` is set, so a test holds a race window
    open deterministically. ``armed`` (when not None) limits that to the first read of each
    key in it; ``reading`` is set when a read is being held. ``get`` is never held."""

    def __init__(self, inner: Tier) -> None:
        super().__init__(inner)
        self.armed: set[bytes] | None = None
        self.reading, self.release = threading.Event(), threading.Event()

    def _hold(self, key: bytes) -> None:
        if self.armed is None or key in self.armed:
            if self.armed is not None:
                self.armed.discard(key)
            self.reading.set()
            assert self.release.wait(30)

    @contextmanager
    def _reader(self) -> Iterator[Any]:
        with self.inner.reader() as r:
            outer = self

            class R:
                def get(self, key: bytes) -> memoryview | None:
                    outer._hold(key)
                    return r.get(key)

            yield R()

    def reader(self) -> Any:
        return self._reader()

    def get(self, key: bytes) -> Any:
        return self.inner.get(key)


@st.composite
def prefix_requests(draw: st.DrawFn, max_requests: int = 30) -> list[tuple[int, ...]]:
    """Requests as paths in a growing trie of blocks, like the Mooncake trace: a request
    reuses a prefix of an earlier one and appends fresh blocks."""
    out: list[tuple[int, ...]] = []
    fresh = 0
    for _ in range(draw(st.integers(1, max_requests))):
        base: tuple[int, ...] = ()
        if out and draw(st.booleans()):
            prev = out[draw(st.integers(0, len(out) - 1))]
            base = prev[:draw(st.integers(1, len(prev)))]
        n_new = draw(st.integers(0 if base else 1, 5))
        out.append(base + tuple(range(fresh, fresh + n_new)))
        fresh += n_new
    return out


def tiny_llama() -> Any:
    """A small random Llama-style model (2 layers, 64 wide, vocab 97), in eval mode: for
    tests that need a real transformers model without weights (imports torch lazily)."""
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=256)
    model = transformers.LlamaForCausalLM(cfg)
    model.eval()
    return model
