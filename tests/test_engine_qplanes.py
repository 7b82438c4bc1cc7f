"""Quantized planes through the engine: a tier with ``quant = kivi(bits=4)`` and a planes
``ecc`` stores each block's metadata strict and its packed codes tolerant. Clean blocks read
back exactly as KIVI decodes them; damaged codes read back ``degraded`` (counted, every value
within its group's range, never repaired into "verified" by a read, verify or scrub);
metadata damaged beyond its code is a recompute."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
from rkvtest import local_config, random_kv

from rkv import Engine, EngineConfig, ModelSpec
from rkv.codec.stages import header_stages
from rkv.ecc import QuantPlanesCodec
from rkv.format.keys import as_token_array, block_key, chunk_keys
from rkv.format.record import decode_record
from rkv.quant import KiviQuantizer
from rkv.quant.kivi_groups import within_ranges

TOLERANT = "planes(high=rs(255,223),low=none,tolerant=1)"
SPEC = ModelSpec("test/qplanes", n_layers=2, n_kv_heads=2, head_dim=16, dtype="float16")
TOKENS = 32


def qconfig(ecc: str = TOLERANT) -> EngineConfig:
    cfg = local_config(TOKENS)
    return replace(cfg, tiers=tuple(replace(t, ecc=ecc, quant="kivi(bits=4)")
                                    for t in cfg.tiers))


def toks(seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(0, 50000, TOKENS).tolist()


def damage(e: Engine, t: list[int], layer: int, where: str, nbytes: int) -> bytes:
    """Overwrite ``nbytes`` bytes of one block's codes part (``where="codes"``) or the start
    of its metadata part (``"meta"``) in place; returns the block's key."""
    bkey = block_key(chunk_keys(as_token_array(t), SPEC.fingerprint(), TOKENS)[0], layer)
    tier = e.tiers["dram"]
    rec = bytearray(tier.get(bkey) or b"")
    dec = decode_record(bytes(rec))
    _, codec = header_stages(dec.header)
    assert isinstance(codec, QuantPlanesCodec)
    start = dec.header_bytes
    if where == "codes":
        start += codec.high.encoded_size(codec.head + codec.tail + 32)
    for i in range(nbytes):
        rec[start + 3 * i] ^= 0x5A
    tier.put(bkey, rec)
    return bkey


def test_round_trip_exact_then_damaged_codes_read_degraded(store_path: Path) -> None:
    q = KiviQuantizer(4)
    with Engine.open(store_path, qconfig()) as e:
        t = toks()
        kv = random_kv(SPEC, TOKENS)
        e.put(t, kv, model=SPEC)
        clean = e.get(t, model=SPEC)
        assert clean.ok and clean.counts["ok"] == 2
        for layer in range(2):     # exactly what KIVI decodes
            want = q.decode(q.encode(np.asarray(kv)[layer]), kv.shape[1:], "float16")
            assert np.array_equal(np.asarray(clean.kv)[layer].view(np.uint16),
                                  want.view(np.uint16))
        bkey = damage(e, t, 0, "codes", 20)
        before = e.tiers["dram"].get(bkey)
        got = e.get(t, model=SPEC)
        assert got.n_tokens == TOKENS and got.ok
        assert got.counts["degraded"] == 1 and got.counts["ok"] == 1
        assert got.blocks[0].status == "degraded"
        g = np.asarray(got.kv)
        assert 0 < np.count_nonzero(g[0] != np.asarray(clean.kv)[0]) <= 40
        assert within_ranges(g[0], np.asarray(kv)[0], q.group, 4).all()
        assert np.array_equal(g[1], np.asarray(clean.kv)[1])
        assert e.stats()["session"]["blocks_degraded"] == 1
        # never repaired: a read, a verify with repair, a scrub leave the record as it is
        assert e.tiers["dram"].get(bkey) == before
        rep = e.verify(repair=True)
        assert rep.degraded == 1 and rep.repaired == 0
        e.scrub()
        assert e.tiers["dram"].get(bkey) == before
        assert e.get(t, model=SPEC).counts["degraded"] == 1


def test_metadata_beyond_repair_is_a_recompute(store_path: Path) -> None:
    with Engine.open(store_path, qconfig()) as e:
        t = toks(1)
        e.put(t, random_kv(SPEC, TOKENS, 1), model=SPEC)
        damage(e, t, 0, "meta", 4)           # four bytes: corrected by rs(255,223)
        got = e.get(t, model=SPEC)
        assert got.ok and got.counts["corrected"] == 1
        damage(e, t, 1, "meta", 60)          # sixty in one codeword: lost, never degraded
        got = e.get(t, model=SPEC)
        assert got.counts["uncorrectable"] == 1 and got.counts["degraded"] == 0


def test_a_strict_codes_part_fails_as_a_recompute(store_path: Path) -> None:
    with Engine.open(store_path,
                     qconfig("planes(high=rs(255,223),low=rs(255,247),tolerant=0)")) as e:
        t = toks(2)
        e.put(t, random_kv(SPEC, TOKENS, 2), model=SPEC)
        damage(e, t, 0, "codes", 2)          # within rs(255,247)
        got = e.get(t, model=SPEC)
        assert got.ok and got.counts["corrected"] == 1
        damage(e, t, 0, "codes", 40)         # beyond it
        assert e.get(t, model=SPEC).counts["uncorrectable"] == 1


def test_split_widths_degrade_within_each_halfs_own_range(store_path: Path) -> None:
    """4-bit keys with 2-bit values under quantized planes: damaged codes read back
    degraded, keys within their 4-bit groups' ranges and values within their 2-bit ones."""
    q = KiviQuantizer(4, vbits=2)
    cfg = qconfig()
    cfg = replace(cfg, tiers=tuple(replace(t, quant="kivi(bits=4,vbits=2)")
                                   for t in cfg.tiers))
    with Engine.open(store_path, cfg) as e:
        t = toks(3)
        kv = random_kv(SPEC, TOKENS, seed=3)
        e.put(t, kv, model=SPEC)
        clean = e.get(t, model=SPEC)
        want = q.decode(q.encode(np.asarray(kv)[0]), kv.shape[1:], "float16")
        assert np.array_equal(np.asarray(clean.kv)[0].view(np.uint16), want.view(np.uint16))
        damage(e, t, 0, "codes", 40)
        got = e.get(t, model=SPEC)
        assert got.ok and got.blocks[0].status == "degraded"
        g = np.asarray(got.kv)[0]
        assert within_ranges(g, np.asarray(kv)[0], q.group, 4, 2).all()
