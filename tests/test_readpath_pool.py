"""A get decodes a chunk's damaged and quantized blocks together on the codec pool, with
the statuses, counts and bytes of one block at a time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rkv import Engine, ModelSpec, parallel
from rkv.errors import IntegrityError
from rkv.format.keys import as_token_array, block_key, chunk_keys
from rkv.store import readpath
from tests.rkvtest import local_config, random_kv

SPEC = ModelSpec("test/pool", n_layers=6, n_kv_heads=2, head_dim=32, dtype="float16")
CHUNK = 32


pytestmark = pytest.mark.usefixtures("codec_pool4")   # tests/conftest.py


def _store(tmp_path: Path, ecc: str, quant: str = "none") -> tuple[Engine, list[int],
                                                                   np.ndarray]:
    cfg = local_config(CHUNK, repair=False)
    cfg = cfg.with_tier("dram", ecc=ecc, quant=quant)
    e = Engine.open(tmp_path / "s", cfg)
    toks = list(range(3 * CHUNK))
    kv = random_kv(SPEC, len(toks), seed=1)
    e.put(toks, kv, model=SPEC)
    return e, toks, kv


def _damage(e: Engine, bkey: bytes, at: list[int], span: tuple[int, int] = (0, 0)) -> None:
    """Flip one byte at each percent position of ``at`` and every byte of ``span`` (percent)."""
    t = e.tiers["dram"]
    rec = bytearray(t.get(bkey) or b"")
    for pct in at:
        rec[len(rec) * pct // 100] ^= 0xFF
    for i in range(len(rec) * span[0] // 100, len(rec) * span[1] // 100):
        rec[i] ^= 0xFF
    t.put(bkey, bytes(rec))


def _keys(toks: list[int]) -> list[bytes]:
    return chunk_keys(as_token_array(toks), SPEC.fingerprint(), CHUNK)


def _outcome(e: Engine, toks: list[int]) -> tuple[Any, ...]:
    got = e.get(toks, model=SPEC)
    return (got.n_tokens, got.counts, [(b.chunk, b.layer, b.status, b.corrected, b.header_repairs,
                                        type(b.error).__name__) for b in got.blocks],
            None if got.kv is None else got.kv.tobytes())


@pytest.mark.parametrize(("ecc", "quant"), [("rs(255,239)", "none"),
                                            ("bch(m=13,t=8)", "none"),
                                            ("none", "kivi(bits=4)"),
                                            ("rs(255,239)", "kivi(bits=4)")])
def test_a_chunks_blocks_decode_together(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         ecc: str, quant: str) -> None:
    e, toks, kv = _store(tmp_path, ecc, quant)
    with e:
        keys = _keys(toks)
        # Correctable damage in several layers of chunk 1, a header copy in chunk 0, and an
        # uncorrectable mess in layer 4 of chunk 2 (the read stops there).
        for layer in (0, 2, 3, 5):
            _damage(e, block_key(keys[1], layer), [60])
        _damage(e, block_key(keys[0], 1), [1])
        _damage(e, block_key(keys[2], 4), [], span=(30, 90))
        batches: list[int] = []
        real = readpath.read_blocks

        def spy(blocks: Any, **kw: Any) -> Any:
            batches.append(len(blocks))
            return real(blocks, **kw)

        monkeypatch.setattr(readpath, "read_blocks", spy)
        pooled = _outcome(e, toks)
        monkeypatch.setattr(parallel, "MIN_PARALLEL_BYTES", 1 << 62)   # one at a time
        parallel.configure(1)
        serial = _outcome(e, toks)
    assert pooled == serial
    n, counts, blocks, _ = pooled
    if ecc != "none":
        assert n == 2 * CHUNK                   # chunk 2 is not trusted
        assert counts["uncorrectable"] == 1 and counts["corrected"] >= 5
    else:                                       # no ECC: chunk 1's flips are not corrected
        assert n == CHUNK and counts["uncorrectable"] == 4
    assert any(b[4] for b in blocks)            # the header copy was outvoted
    if quant == "none":                          # corrected means exact
        assert pooled[3] == np.ascontiguousarray(kv[:, :, :n]).tobytes()
    # Every layer that the fast check could not copy went through one call per chunk.
    if quant != "none":
        assert max(batches) == SPEC.n_layers    # quantized blocks are never fast-copied
    else:
        assert max(batches) >= 4


def test_strict_raises_the_first_bad_layer(tmp_path: Path) -> None:
    e, toks, _ = _store(tmp_path, "none")
    with e:
        keys = _keys(toks)
        _damage(e, block_key(keys[0], 4), [50])
        _damage(e, block_key(keys[0], 2), [50])
        with pytest.raises(IntegrityError) as info:
            e.get(toks, model=SPEC, strict=True)
        got = e.get(toks, model=SPEC)
        bad = [b for b in got.blocks if b.status == "uncorrectable"]
        assert [b.layer for b in bad] == [2, 4]
        assert str(info.value) == str(bad[0].error)      # layer 2's, not layer 4's
