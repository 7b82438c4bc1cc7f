"""Byte planes after a quantizer as planner options: quantized planes (metadata strict, codes
tolerant), predicted with the block's own split, a degraded read charged
``degraded_factor(bits)`` times the block's KL at the fewest profiled bits, offered only with
a profile and only for whole ``kv`` blocks; and the engine writes what was planned."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from rkvtest import random_kv

from rkv import EngineConfig, ModelSpec, TierConfig
from rkv.codec.pipeline import Pipeline
from rkv.codec.stages import header_stages
from rkv.ecc import QuantPlanesCodec
from rkv.format.keys import as_token_array, block_key, chunk_keys
from rkv.format.record import decode_record
from rkv.placement import BlockInput, PlacementConfig, Planner, ReliabilityCache, TierInput
from rkv.placement.options import data_bytes, quantized_code, record_bytes
from rkv.placement.planner import degraded_factor
from rkv.reliability.analytic import predict
from rkv.store.engine import Engine

PLANES = "planes(high=rs(255,223),low=none)"
CODES = ("rs(255,239)", "rs(255,223)", PLANES)
MODEL = {"model": "raw-ber", "ber": 1e-3}


def kl(layer: int, kind: str, bits: int) -> float:
    return {16: 0.0, 8: 1e-4, 4: 2e-3, 2: 5e-3}[bits] * (1 + layer)


def _model() -> object:
    import faultmodels

    return faultmodels.get_model(MODEL)


def test_degraded_factor_is_the_error_variance_ratio() -> None:
    # uniform in the range against the true value (r^2/6) over s^2/12, s = r / (2^b - 1)
    assert degraded_factor(2) == 18.0 and degraded_factor(4) == 450.0
    assert degraded_factor(8) == 2 * 255 ** 2


def test_quantized_planes_are_predicted_with_the_blocks_own_split() -> None:
    b = BlockInput(0, "kv", 0, 256, 1.0, 1.0, 3, 64)
    code = quantized_code(b, 4, PLANES)
    pipe = Pipeline.parse("kivi(bits=4)", PLANES).for_block((2, 256, 3, 64), "float16")
    assert isinstance(pipe.codec, QuantPlanesCodec) and code == pipe.codec.spec
    nb = data_bytes(b, 4)
    strict, tol = pipe.codec.parts(nb)
    lay = pipe.quant.layout((2, 256, 3, 64), "float16")            # type: ignore[union-attr]
    assert tol.data_bytes == lay.copy_offsets[2] - lay.codes_offset and tol.tolerant
    assert strict.data_bytes == lay.total - tol.data_bytes + 32 and not strict.tolerant
    p = predict(code, nb, _model(), 1.0)
    whole = predict(pipe, nb, _model(), 1.0)
    assert p.p_degraded > 0.9 and abs(whole.p_degraded - p.p_degraded) < 1e-3
    assert p.p_due < predict("rs(255,239)", nb, _model(), 1.0).p_due
    assert record_bytes(b, 4, PLANES) == pipe.record_bytes((2, 256, 3, 64), "float16")
    # half blocks (k or v alone) have no record of their own to split
    assert quantized_code(BlockInput(0, "k", 0, 256, 1.0, 1.0, 3, 64), 4, PLANES) == ""


def test_quantized_planes_are_chosen_and_charged_the_degraded_kl() -> None:
    """rs(255,239) misses max_p_due; quantized planes meet it with fewer bytes than
    rs(255,223); their KL is the 4-bit KL plus P(degraded) x 18 x the 2-bit KL."""
    tier = TierInput("t", MODEL, 1 << 36, 10.0, 1.0)
    blocks = [BlockInput(layer, "kv", 0, 256, 1.0, 1.0, 3, 64) for layer in range(3)]
    b = blocks[0]
    nb = data_bytes(b, 4)
    code = quantized_code(b, 4, PLANES)
    limit = 1e-2
    assert predict("rs(255,239)", nb, _model(), 1.0).p_due > limit
    assert predict(code, nb, _model(), 1.0).p_due <= limit
    assert record_bytes(b, 4, PLANES) < record_bytes(b, 4, "rs(255,223)")
    deg = predict(code, nb, _model(), 1.0).p_degraded
    cfg = PlacementConfig(bits=(4,), codes=CODES, max_p_due=limit, quality_budget_kl=10.0,
                          recompute_us_per_token=0.0, capacity_cost={"t": 1e6})
    plan = Planner(cfg, profile=kl, cache=ReliabilityCache()).plan(blocks, [tier])
    for blk, got in zip(blocks, plan.blocks, strict=True):
        assert (got.bits, got.code) == (4, PLANES)
        base = kl(blk.layer, "k", 4) + kl(blk.layer, "v", 4)
        want = base + deg * 18.0 * (kl(blk.layer, "k", 2) + kl(blk.layer, "v", 2))
        assert abs(got.kl - want) <= 1e-9 * want
    # A budget the degraded charge does not fit: the strict code with more parity.
    tight = PlacementConfig(bits=(4,), codes=CODES, max_p_due=limit, quality_budget_kl=0.05,
                            recompute_us_per_token=0.0, capacity_cost={"t": 1e6})
    plan = Planner(tight, profile=kl, cache=ReliabilityCache()).plan(blocks, [tier])
    assert {(g.bits, g.code) for g in plan.blocks} == {(4, "rs(255,223)")}


def test_the_degraded_charge_uses_the_fewest_profiled_bits() -> None:
    """At the fewest bits the profile has (2, else 4, else 8), times that width's factor;
    unknown (inf, not offered) without a profile or without a lossy entry."""
    from rkv.placement.planner import _degraded_kl_quantized
    from rkv.profiles import QualityProfile

    only4 = QualityProfile({"0:k:4": 1e-3, "0:v:4": 2e-3})
    assert abs(_degraded_kl_quantized(only4, 0, "kv") - 450 * 3e-3) < 1e-12
    assert _degraded_kl_quantized(only4, 1, "kv") == float("inf")
    assert _degraded_kl_quantized(None, 0, "kv") == float("inf")


def test_half_blocks_are_not_offered_quantized_planes() -> None:
    tier = TierInput("t", MODEL, 1 << 36, 10.0, 1.0)
    blocks = [BlockInput(0, kind, 0, 64, 1.0, 1.0, 2, 32) for kind in ("k", "v")]
    cfg = PlacementConfig(bits=(16, 4), codes=(PLANES,), max_p_due=1.0,
                          quality_budget_kl=10.0, capacity_cost={"t": 1e9})
    planner = Planner(cfg, profile=kl, cache=ReliabilityCache())
    plan = planner.plan(blocks, [tier])
    assert all(g.bits == 16 for g in plan.blocks)
    t = next(iter(planner._templates.values()))
    assert set(t.bits.tolist()) == {16}


def test_the_engine_writes_quantized_planes_where_planned(tmp_path: Path) -> None:
    spec = ModelSpec("test/qplanes-placed", n_layers=2, n_kv_heads=3, head_dim=64,
                     dtype="float16")
    prof = tmp_path / "profile.json"
    prof.write_text(json.dumps({"model": "x", "kl": {f"{la}:{k}:{b}": 1e-5 * b
                                                     for la in range(2) for k in "kv"
                                                     for b in (2, 4)}}))
    tiers = (TierConfig("dram", medium="memory", path="t/dram", capacity_bytes=1 << 30,
                        fault_model="raw-ber"),)
    cfg = EngineConfig(chunk_tokens=256, tiers=tiers,
                       placement={"max_p_due": 1e-6, "bits": [4], "codes": list(CODES),
                                  "profile": str(prof), "quality_budget_kl": 1.0,
                                  "recompute_us_per_token": 0.0})
    tokens = list(range(256))
    kv = random_kv(spec, 256)
    with Engine.open(tmp_path / "s", cfg) as e:
        e.put(tokens, kv, model=spec)
        want = e.get(tokens, model=spec)
        assert want.ok and want.counts["ok"] == 2
        key = chunk_keys(as_token_array(tokens), spec.fingerprint(), 256)[0]
        bkey = block_key(key, 1)
        rec = bytearray(e.tiers["dram"].get(bkey) or b"")
        dec = decode_record(bytes(rec))
        quant, codec = header_stages(dec.header)
        assert quant is not None and quant.bits == 4 and isinstance(codec, QuantPlanesCodec)
        rec[dec.header_bytes + dec.header.payload_len - 2000] ^= 0x10   # in the codes
        e.tiers["dram"].put(bkey, rec)
        got = e.get(tokens, model=spec)
        assert got.counts["degraded"] == 1 and got.n_tokens == 256
        diff = np.asarray(got.kv, np.float64) - np.asarray(want.kv, np.float64)
        assert 0 < np.count_nonzero(diff) <= 2
