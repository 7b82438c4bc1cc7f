"""Byte planes as planner options (after a quantizer: test_placement_qplanes.py): P(DUE)
without the tolerant plane's failures, a degraded read charged the block's worst profiled KL,
and chosen when it is the cheapest layout meeting the target."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from rkvtest import random_kv

from rkv import EngineConfig, ModelSpec, TierConfig
from rkv.codec.stages import header_stages
from rkv.format.keys import as_token_array, block_key, chunk_keys
from rkv.format.record import decode_record
from rkv.placement import BlockInput, PlacementConfig, Planner, ReliabilityCache, TierInput
from rkv.placement.options import data_bytes, record_bytes
from rkv.reliability.analytic import predict
from rkv.store.engine import Engine

PLANES = "planes(high=rs(255,223),low=none)"
CODES = ("none", "rs(255,239)", "rs(255,223)", PLANES)
MODEL = {"model": "raw-ber", "ber": 1e-3}


def kl(layer: int, kind: str, bits: int) -> float:
    return {16: 0.0, 8: 1e-4, 4: 2e-3, 2: 5e-2}[bits] * (1 + layer)


def test_planes_is_the_cheapest_layout_meeting_max_p_due() -> None:
    tier = TierInput("t", MODEL, 1 << 36, 10.0, 1.0)
    blocks = [BlockInput(layer, "kv", 0, 256, 1.0, 1.0, 3, 64) for layer in range(3)]
    b = blocks[0]
    nb = data_bytes(b, 16)
    due = {c: predict(c, nb, _model(), 1.0).p_due for c in CODES}
    deg = predict(PLANES, nb, _model(), 1.0).p_degraded
    # The setting where planes pays: rs(255,239) misses the target, planes meets it with
    # about rs(255,239)'s parity, and rs(255,223) meets it with twice the parity.
    limit = 1e-2
    assert due["rs(255,239)"] > limit >= max(due[PLANES], due["rs(255,223)"])
    assert deg > 0.5
    assert record_bytes(b, 16, PLANES) < record_bytes(b, 16, "rs(255,223)")
    cfg = PlacementConfig(bits=(16, 4), codes=CODES, max_p_due=limit, quality_budget_kl=10.0,
                          recompute_us_per_token=0.0, capacity_cost={"t": 1e6})
    plan = Planner(cfg, profile=kl, cache=ReliabilityCache()).plan(blocks, [tier])
    for got in plan.blocks:
        assert got.bits == 4 or got.code == PLANES
    # Lossless bits only: planes at 16 bits, whose KL is the degraded read's expected cost,
    # P(degraded) x the block's KL at the fewest bits its profile has (2 here).
    only16 = PlacementConfig(bits=(16,), codes=CODES, max_p_due=limit,
                             quality_budget_kl=10.0, recompute_us_per_token=0.0,
                             capacity_cost={"t": 1e6})
    plan = Planner(only16, profile=kl, cache=ReliabilityCache()).plan(blocks, [tier])
    for blk, got in zip(blocks, plan.blocks, strict=True):
        assert (got.bits, got.code) == (16, PLANES)
        want = deg * (kl(blk.layer, "k", 2) + kl(blk.layer, "v", 2))
        assert abs(got.kl - want) <= 1e-9 * want
    # Without a profile a degraded read's cost is unknown: planes is not offered, the
    # strict code with twice the parity is taken.
    plan = Planner(only16, profile=None, cache=ReliabilityCache()).plan(blocks, [tier])
    assert {(b.bits, b.code) for b in plan.blocks} == {(16, "rs(255,223)")}


def _model() -> object:
    import faultmodels

    return faultmodels.get_model(MODEL)


def test_the_engine_writes_planes_where_planned_and_reads_them_degraded(tmp_path: Path
                                                                         ) -> None:
    """A raw-BER DRAM tier, max_p_due = 1e-6: the checksum alone misses it; planes (high
    plane under rs(255,247), low plane bare) meets it with half rs(255,247)'s parity; the
    profile bounds what a degraded read costs. A damaged low plane reads back degraded."""
    spec = ModelSpec("test/planes-placed", n_layers=2, n_kv_heads=2, head_dim=64,
                     dtype="float16")
    prof = tmp_path / "profile.json"
    prof.write_text(json.dumps({"model": "x", "kl": {f"{la}:{k}:2": 1e-6 for la in range(2)
                                                     for k in "kv"}}))
    codes = ["none", "rs(255,247)", "planes(high=rs(255,247),low=none)"]
    tiers = (TierConfig("dram", medium="memory", path="t/dram", capacity_bytes=1 << 30,
                        fault_model="raw-ber"),)
    cfg = EngineConfig(chunk_tokens=256, tiers=tiers,
                       placement={"max_p_due": 1e-6, "bits": [16], "codes": codes,
                                  "profile": str(prof), "quality_budget_kl": 1.0})
    tokens = list(range(256))
    kv = random_kv(spec, 256)
    with Engine.open(tmp_path / "s", cfg) as e:
        e.put(tokens, kv, model=spec)
        key = chunk_keys(as_token_array(tokens), spec.fingerprint(), 256)[0]
        for layer in range(2):
            rec = e.tiers["dram"].get(block_key(key, layer)) or b""
            _, codec = header_stages(decode_record(rec).header)
            assert codec is not None and codec.codec_id == "planes"
            assert codec.get_config()["width"] == 2
        got = e.get(tokens, model=spec)
        assert got.ok and np.array_equal(got.kv, kv)
        bkey = block_key(key, 1)
        rec = bytearray(e.tiers["dram"].get(bkey) or b"")
        dec = decode_record(bytes(rec))
        rec[dec.header_bytes + dec.header.payload_len - 200] ^= 0x10   # low plane: the end
        e.tiers["dram"].put(bkey, rec)
        got = e.get(tokens, model=spec)
        assert got.counts["degraded"] == 1 and got.n_tokens == 256
        assert e.stats()["session"]["plans"] >= 1
