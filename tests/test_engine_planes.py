"""Byte planes through the engine: a tolerant low plane reads back ``degraded`` (high bytes
exact, counted, never repaired into "verified"), a strict one as a recompute, the high plane
always verified; the layout follows the block's dtype; demotion keeps a degraded record."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from rkvtest import local_config, random_kv

from rkv import ConfigError, Engine, EngineConfig, ModelSpec
from rkv.codec.stages import header_codec
from rkv.ecc import PlanesCodec, QuantPlanesCodec
from rkv.format.keys import as_token_array, block_key, chunk_keys
from rkv.format.record import decode_record

TOLERANT = "planes(high=rs(255,223),low=none,tolerant=1)"
STRICT = "planes(high=rs(255,223),low=rs(255,247),tolerant=0)"


def spec_for(dtype: str) -> ModelSpec:
    return ModelSpec(f"test/planes-{dtype}", n_layers=2, n_kv_heads=2, head_dim=16,
                     dtype=dtype)


def planes_config(ecc: str) -> EngineConfig:
    cfg = local_config(16)
    return replace(cfg, tiers=tuple(replace(t, ecc=ecc) for t in cfg.tiers))


def toks(n: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(0, 50000, n).tolist()


def damage_low_plane(e: Engine, t: list[int], spec: ModelSpec, nbytes: int) -> bytes:
    """Flip ``nbytes`` bytes of the first block's low plane in place; returns its key."""
    bkey = block_key(chunk_keys(as_token_array(t), spec.fingerprint(), 16)[0], 0)
    tier = e.tiers["dram"]
    rec = bytearray(tier.get(bkey) or b"")
    dec = decode_record(rec)
    codec = header_codec(dec.header)
    assert isinstance(codec, PlanesCodec)
    h, _, _ = codec._sizes(dec.header.data_len)
    start = dec.header_bytes + codec.high.encoded_size(h + 32)
    for i in range(nbytes):
        rec[start + 3 * i] ^= 0x41
    tier.put(bkey, rec)
    return bkey


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_low_plane_damage_reads_degraded_with_high_bytes_exact(store_path: Path,
                                                               dtype: str) -> None:
    spec = spec_for(dtype)
    with Engine.open(store_path, planes_config(TOLERANT)) as e:
        t = toks(32)
        kv = random_kv(spec, 32)
        e.put(t, kv, model=spec)
        bkey = damage_low_plane(e, t, spec, 5)
        before = e.tiers["dram"].get(bkey)
        got = e.get(t, model=spec)
        assert got.n_tokens == 32 and got.ok
        assert got.counts["degraded"] == 1 and got.degraded == 1
        assert [b.status for b in got.blocks].count("ok") == 3
        w = kv.dtype.itemsize
        g8 = np.asarray(got.kv).view(np.uint8).reshape(-1, w)
        k8 = kv.view(np.uint8).reshape(-1, w)
        assert np.array_equal(g8[:, w - w // 2:], k8[:, w - w // 2:])
        assert 0 < int(np.sum(np.any(g8 != k8, axis=1))) <= 5
        # Not repaired: rewriting would make the noise look verified.
        assert e.tiers["dram"].get(bkey) == before
        assert e.stats()["session"]["blocks_degraded"] == 1
        assert e.get(t, model=spec).counts["degraded"] == 1
        rep = e.verify(repair=True)
        assert rep.degraded == 1 and rep.ok == 3 and rep.repaired == 0
        assert e.tiers["dram"].get(bkey) == before
        cfg = header_codec(decode_record(before or b"").header)
        assert cfg is not None and cfg.get_config()["width"] == w


def test_strict_low_plane_failure_is_a_recompute(store_path: Path) -> None:
    spec = spec_for("float16")
    with Engine.open(store_path, planes_config(STRICT)) as e:
        t = toks(32)
        kv = random_kv(spec, 32)
        e.put(t, kv, model=spec)
        damage_low_plane(e, t, spec, 2)        # within rs(255,247): corrected
        got = e.get(t, model=spec)
        assert got.ok and np.array_equal(got.kv, kv) and got.counts["corrected"] == 1
        damage_low_plane(e, t, spec, 30)       # beyond it
        got = e.get(t, model=spec)
        assert got.n_tokens == 0 and got.counts["uncorrectable"] == 1


def test_high_plane_damage_is_corrected_and_repaired(store_path: Path) -> None:
    spec = spec_for("float16")
    with Engine.open(store_path, planes_config(TOLERANT)) as e:
        t = toks(16)
        kv = random_kv(spec, 16)
        e.put(t, kv, model=spec)
        bkey = block_key(chunk_keys(as_token_array(t), spec.fingerprint(), 16)[0], 1)
        rec = bytearray(e.tiers["dram"].get(bkey) or b"")
        start = decode_record(rec).header_bytes
        for i in range(4):
            rec[start + 7 * i] ^= 0xFF          # top bytes of four values
        e.tiers["dram"].put(bkey, rec)
        got = e.get(t, model=spec)
        assert got.ok and np.array_equal(got.kv, kv) and got.counts["corrected"] == 1
        assert e.get(t, model=spec).counts["ok"] == 2     # repaired


def test_planes_after_a_quantizer_without_codes_is_a_config_error() -> None:
    """rowq has no tolerant codes region to tell from its metadata (KIVI does:
    tests/test_engine_qplanes.py)."""
    cfg = planes_config(TOLERANT)
    with pytest.raises(ConfigError, match="no codes to tell apart"):
        replace(cfg.tiers[0], quant="rowq(bits=4)")


def test_demotion_moves_a_degraded_record_as_it_is(store_path: Path) -> None:
    spec = spec_for("float16")
    base = planes_config(TOLERANT)
    with Engine.open(store_path, base) as e0:
        one = e0.put(toks(16, 0), random_kv(spec, 16), model=spec).bytes_written
        e0.clear()
    tiers = tuple(replace(t, capacity_bytes=c)
                  for t, c in zip(base.tiers, (one, 1 << 30, 1 << 30), strict=True))
    with Engine.open(store_path, replace(base, tiers=tiers, promote="never")) as e:
        t0, kv0 = toks(16, 0), random_kv(spec, 16, 0)
        e.put(t0, kv0, model=spec)
        bkey = damage_low_plane(e, t0, spec, 3)
        damaged = e.tiers["dram"].get(bkey)
        e.put(toks(16, 1), random_kv(spec, 16, 1), model=spec)     # demotes t0's chunk
        e.settle()
        assert e.tiers["dram"].get(bkey) is None
        # The payload as it was, byte for byte (not re-encoded, so still degraded); only the
        # header's write time is new (the record was written into another tier).
        before, after = decode_record(damaged or b""), decode_record(e.tiers["cxl"].get(bkey)
                                                                     or b"")
        assert bytes(after.payload) == bytes(before.payload)
        assert replace(after.header, written_ns=None) == replace(before.header, written_ns=None)
        assert after.header.written_ns is not None and before.header.written_ns is not None
        assert after.header.written_ns >= before.header.written_ns
        got = e.get(t0, model=spec)
        assert got.n_tokens == 16 and got.counts["degraded"] == 1


def test_a_quantized_block_demoted_into_planes_gets_quantized_planes(store_path: Path
                                                                      ) -> None:
    """Byte planes lay out values, not KIVI codes: a 4-bit block moving to a planes tier is
    re-encoded with the high code over its metadata and the low code over its packed codes
    (``qplanes``), and reads back."""
    spec = spec_for("float16")
    base = local_config(16)
    tiers = (replace(base.tiers[0], quant="kivi(bits=4)"), replace(base.tiers[1], ecc=STRICT),
             base.tiers[2])
    with Engine.open(store_path, replace(base, tiers=tiers)) as e0:
        one = e0.put(toks(16, 0), random_kv(spec, 16), model=spec).bytes_written
        e0.clear()
    tiers = tuple(replace(t, capacity_bytes=c)
                  for t, c in zip(tiers, (one, 1 << 30, 1 << 30), strict=True))
    with Engine.open(store_path, replace(base, tiers=tiers, promote="never")) as e:
        t0 = toks(16, 0)
        e.put(t0, random_kv(spec, 16, 0), model=spec)
        want = e.get(t0, model=spec).kv
        e.put(toks(16, 1), random_kv(spec, 16, 1), model=spec)     # demotes t0's chunk
        e.settle()
        bkey = block_key(chunk_keys(as_token_array(t0), spec.fingerprint(), 16)[0], 0)
        rec = e.tiers["cxl"].get(bkey)
        assert rec is not None
        codec = header_codec(decode_record(rec).header)
        planes = PlanesCodec.from_config(
            {"id": "planes", "high": "rs(255,223)", "low": "rs(255,247)", "tolerant": 0})
        assert isinstance(codec, QuantPlanesCodec)
        assert (codec.high, codec.low, codec.tolerant) == (planes.high, planes.low, False)
        got = e.get(t0, model=spec)
        assert got.ok and np.array_equal(np.asarray(got.kv), np.asarray(want))
