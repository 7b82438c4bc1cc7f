"""A put's compute-bound blocks are encoded on the codec pool: the records are byte for byte
those of a one-thread put (same clock). Blocks of 256 KiB, so the pool is really used (a
batch under 256 KiB runs inline)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from rkvtest import random_kv

from rkv import Engine, EngineConfig, ModelSpec, TierConfig
from rkv.format.keys import as_token_array, block_key, chunk_keys


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


def test_a_batch_of_puts_across_tiers_reads_back_exactly(tmp_path: Path) -> None:
    """put_many of sequences whose blocks land in two RS tiers (the small top tier pushes
    planned writes down within the mutation): every record written from the encode batches
    is intact, whatever order the flush writes them in."""
    from rkv import parallel

    tiers = (TierConfig("a", medium="memory", path="t/a", capacity_bytes=3 << 20,
                        ecc="rs(255,239)"),
             TierConfig("b", medium="memory", path="t/b", capacity_bytes=1 << 30,
                        ecc="rs(255,223)"))
    seqs = [list(range(i * 1000, i * 1000 + 600)) for i in range(4)]
    kvs = [random_kv(SMALL, 600, seed=i) for i in range(4)]
    try:
        with Engine.open(tmp_path / "s", EngineConfig(chunk_tokens=256, tiers=tiers,
                                                      codec_threads=2)) as e:
            e.put_many(list(zip(seqs, kvs, strict=True)), model=SMALL)
            st = e.stats()["tiers"]
            assert st["a"]["blocks"] and st["b"]["blocks"]
            for s, kv in zip(seqs, kvs, strict=True):
                got = e.get(s, model=SMALL)
                assert got.ok and got.n_tokens == 600 and np.array_equal(got.kv, kv)
            assert e.verify().clean
    finally:
        parallel.configure(0)
