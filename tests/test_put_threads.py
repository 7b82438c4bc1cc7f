"""A put's compute-bound blocks are encoded on the codec pool: the records are byte for byte
those of a one-thread put (same clock). Blocks of 256 KiB, so the pool is really used (a
batch under 256 KiB runs inline)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from rkvtest import random_kv

from rkv import Engine, EngineConfig, ModelSpec, TierConfig
from rkv.keys import as_token_array, block_key, chunk_keys


def records(path: Path, threads: int, ecc: str, quant: str, tokens: list[int],
            kv: np.ndarray) -> dict[bytes, bytes]:
    tier = TierConfig("t", medium="memory", path="t/t", capacity_bytes=1 << 30, ecc=ecc,
                      quant=quant)
    with Engine.open(path, EngineConfig(chunk_tokens=256, tiers=(tier,),
                                        codec_threads=threads)) as e:
        e.clock = lambda: 1_700_000_000 * 10**9
        e.put(tokens, kv, model=SMALL)
        got = e.get(tokens, model=SMALL)
        assert got.n_tokens == len(tokens) and got.ok
        keys = chunk_keys(as_token_array(tokens), SMALL.fingerprint(), 256)
        return {block_key(k, layer): bytes(e.tiers["t"].get(block_key(k, layer)) or b"")
                for k in keys for layer in range(SMALL.n_layers)}


SMALL = ModelSpec("test/wide", n_layers=3, n_kv_heads=4, head_dim=64, dtype="float16")


@pytest.mark.parametrize("ecc, quant", [("rs(255,239)", "none"), ("bch(m=13,t=8)", "none"),
                                        ("none", "kivi(bits=4)")])
def test_threaded_put_writes_the_serial_records(tmp_path: Path, ecc: str, quant: str
                                                ) -> None:
    from rkv import parallel

    tokens = list(range(7, 7 + 600))
    kv = random_kv(SMALL, 600, seed=3)
    try:
        one = records(tmp_path / "one", 1, ecc, quant, tokens, kv)
        four = records(tmp_path / "four", 4, ecc, quant, tokens, kv)
    finally:
        parallel.configure(0)
    assert one.keys() == four.keys() and all(one[k] == four[k] for k in one)
    assert all(one.values())
