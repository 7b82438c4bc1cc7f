"""Helpers of the end-to-end placement measurements (benchmarks/bench_placement_quality.py):
the byte-budget bisection, the weakest uniform code, the planned campaign's predictions and
intervals, and a small campaign on a planned engine store. No real model is loaded."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
from rkvtest import random_kv

from rkv import Engine, EngineConfig, ModelSpec, TierConfig
from rkv.eval.faults.planned import (
    BlockPrediction,
    compare,
    count_interval,
    poisson_ci,
    predicted_totals,
    run_planned_campaign,
)
from rkv.placement import BlockInput, InfeasiblePlanError, Planner, TierInput
from rkv.placement.budget import (
    UniformCode,
    min_kl_exact,
    plan_bytes,
    smallest_kl_budget,
    uniform_codes,
    weakest_uniform,
)
from rkv.placement.options import record_bytes
from rkv.tiers.faulty import FaultyTier

SPEC = ModelSpec("test/e2e", n_layers=4, n_kv_heads=2, head_dim=16, dtype="float16")


def _planner(bits: tuple[int, ...] = (16, 8, 4, 2)) -> tuple[Planner, list[BlockInput],
                                                              TierInput]:
    kl = {(layer, kind, b): (0.002 * (layer + 1)) * (16 / b) ** 2 / 64
          for layer in range(4) for kind in "kv" for b in (8, 4, 2)}
    cfg = {"max_p_due": 1.0, "max_p_sdc": 1.0, "bits": list(bits), "codes": ["none"],
           "recompute_us_per_chunk": 0.0, "capacity_cost": {"t": 1e9}}
    blocks = [BlockInput(layer, "kv", c, 32, 24.0, 1.0, 2, 16, "float16", 2)
              for c in range(2) for layer in range(4)]
    return Planner(cfg, kl), blocks, TierInput("t", "raw-ber", 1 << 40, 10.0, 1.0)


def test_bisection_returns_the_least_kl_fitting_plan() -> None:
    planner, blocks, tier = _planner()
    from dataclasses import replace

    def plan_at(kl: float):  # type: ignore[no-untyped-def]
        return Planner(replace(planner.config, quality_budget_kl=kl), planner.profile,
                       planner.cache).plan(blocks, [tier])

    full = sum(record_bytes(b, 16, "none") for b in blocks)
    hi = sum(planner.profile.kl(b.layer, "kv", 2) for b in blocks) * 1.01  # type: ignore[union-attr]
    s = smallest_kl_budget(plan_at, 0.6 * full, hi, steps=25)
    assert s.plan is not None and plan_bytes(s.plan) <= 0.6 * full
    fitting = [kl for _, nb, kl in s.steps if nb is not None and nb <= 0.6 * full]
    assert s.plan.kl == min(fitting) and s.plan.kl <= s.kl_budget
    # Against brute force over every bits choice (4^8): within the bisection's resolution.
    opts = (16, 8, 4, 2)
    kl = np.array([[planner.profile.kl(b.layer, "kv", x) for x in opts] for b in blocks])  # type: ignore[union-attr]
    nb = np.array([[record_bytes(b, x, "none") for x in opts] for b in blocks])
    best = min(kl[np.arange(8), c].sum() for c in itertools.product(range(4), repeat=8)
               if nb[np.arange(8), c].sum() <= 0.6 * full)
    assert s.plan.kl <= best * 1.02 + 1e-12
    exact, choice = min_kl_exact(kl, nb, 0.6 * full, unit=1)
    assert exact == pytest.approx(best) and nb[np.arange(8), choice].sum() <= 0.6 * full
    # Nothing fits below the smallest records: no plan.
    tiny = smallest_kl_budget(plan_at, 10.0, hi, steps=5)
    assert tiny.plan is None and math.isnan(tiny.kl_budget)


def test_bisection_counts_infeasible_as_not_fitting() -> None:
    planner, blocks, tier = _planner()

    def plan_at(kl: float):  # type: ignore[no-untyped-def]
        if kl < 0.01:
            raise InfeasiblePlanError("too small", "quality_budget_kl")
        return planner.plan(blocks, [tier])

    s = smallest_kl_budget(plan_at, 1e12, 1.0, steps=20)
    assert s.plan is not None
    assert 0.01 <= min(kl for kl, nb, _ in s.steps if nb is not None) < 0.011
    assert any(nb is None for _, nb, _ in s.steps)


def test_weakest_uniform_code_on_a_synthetic_case() -> None:
    cands = [UniformCode("none", False, 2e-9, 0.0, 0),
             UniformCode("rs(255,247)", True, 5e-10, 0.0, 700),
             UniformCode("bch(m=13,t=8)", True, 6e-10, 0.0, 500),
             UniformCode("shardrs(k=16,m=2)", True, 1e-14, 0.0, 3000)]
    assert weakest_uniform(cands).code == "bch(m=13,t=8)"
    with pytest.raises(InfeasiblePlanError, match="shardrs"):
        weakest_uniform([replace_meets(c) for c in cands])


def replace_meets(c: UniformCode) -> UniformCode:
    from dataclasses import replace

    return replace(c, meets=False)


def test_uniform_codes_judges_the_largest_block() -> None:
    """raw-ber at 1e-6: the checksum alone fails every block; RS(255,247) meets 1e-6 for
    a small block but the worst block decides the uniform code."""
    small = BlockInput(0, "kv", 0, 16, 24.0, 1.0, 2, 16, "float16", 1)
    big = BlockInput(1, "kv", 0, 16, 24.0, 1.0, 2, 16, "float16", 1)
    from rkv.placement.options import resolve_model

    model = resolve_model({"preset": "raw-ber", "ber": 1e-6})
    got = uniform_codes([(small, 2), (big, 16)], ["none", "rs(255,247)", "rs(255,223)"],
                        model, 1e-9)
    assert [c.code for c in got] == ["none", "rs(255,247)", "rs(255,223)"]
    assert not got[0].meets and got[0].parity_bytes == 0
    assert got[2].parity_bytes > got[1].parity_bytes > 0
    assert weakest_uniform(got).code == next(c.code for c in got if c.meets)


def test_predicted_totals_are_the_sums_of_the_blocks() -> None:
    rng = np.random.default_rng(3)
    preds = []
    for c, layer in itertools.product(range(3), range(5)):
        err, due = sorted(rng.uniform(0, 0.1, 2))[::-1]
        preds.append(BlockPrediction(c, layer, err, due, due * 1e-3))
    tot = predicted_totals(preds)
    assert tot["due"] == pytest.approx(sum(p.p_due for p in preds))
    assert tot["sdc"] == pytest.approx(sum(p.p_sdc for p in preds))
    assert tot["corrected"] == pytest.approx(sum(p.p_error - p.p_due - p.p_sdc for p in preds))
    assert tot["due_var"] == pytest.approx(sum(p.p_due * (1 - p.p_due) for p in preds))
    assert tot["blocks"] == 15


def test_intervals() -> None:
    lo, hi = poisson_ci(0)
    assert lo == 0 and hi == pytest.approx(3.689, abs=1e-3)
    lo, hi = poisson_ci(10)
    assert lo == pytest.approx(4.795, abs=1e-3) and hi == pytest.approx(18.39, abs=1e-2)
    assert count_interval(100.0, 99.0) == (80, 120)
    lo, hi = count_interval(3.0, 2.9)
    assert lo <= 3 <= hi and lo == 0 and hi == 7
    c = compare(5, 10, 0.5, 0.45, 20)
    assert c["observed_in_predicted_range"] and c["predicted_in_observed_ci"]
    assert not compare(40, 10, 0.5, 0.45, 20)["observed_in_predicted_range"]


def test_campaign_on_a_planned_store(tmp_path: Path) -> None:
    """Mixed bits and codes written by the engine as planned (raw BER 1e-6: a target between
    the checksum alone at 2 and at 16 bits gives 16-bit blocks a code); injected at BER 3e-5:
    the checksum-only blocks are lost, the RS blocks corrected, every block classified
    (reads go on past a failed chunk)."""
    from rkv.placement.options import DEFAULT_CACHE, data_bytes, resolve_model
    from rkv.store.plans import EnginePlacement

    kl = {f"{layer}:{kind}:{b}": (0.05 if layer < 2 else 0.0001) * 16 / b
          for layer in range(4) for kind in "kv" for b in (8, 4, 2)}
    prof = tmp_path / "p.json"
    prof.write_text(json.dumps({"model": "t", "kl": kl}))
    tier = TierConfig("t", medium="memory", path="t", capacity_bytes=1 << 30,
                      fault_model="raw-ber")
    block = BlockInput(0, "kv", 0, 16, 24.0, 1.0, 2, 16, "float16", 2)
    p2, p16 = (DEFAULT_CACHE.get("none", data_bytes(block, b), resolve_model("raw-ber"),
                                 24.0)[0] for b in (2, 16))
    pl = {"max_p_due": math.sqrt(p2 * p16), "bits": [16, 2], "codes": ["none", "rs(255,223)"],
          "quality_budget_kl": 0.01, "profile": str(prof), "capacity_cost": {"t": 1e6},
          "recompute_us_per_chunk": 0.0}
    cfg = EngineConfig(chunk_tokens=16, tiers=(tier,), placement=pl, repair=False)
    ep = EnginePlacement.for_engine(cfg)
    assert ep is not None
    plan = ep.planner(SPEC).plan(ep.blocks(SPEC, [16, 16], 2), [ep.tier_input("t")])
    assert {(b.bits, b.code) for b in plan.blocks} == {(16, "rs(255,223)"), (2, "none")}
    tokens = list(range(32))
    model = resolve_model({"preset": "raw-ber", "ber": 3e-5})
    with Engine.open(tmp_path / "s", cfg) as e:
        e.put(tokens, random_kv(SPEC, 32), model=SPEC)
        faulty = e.wrap_tier("t", lambda t: FaultyTier(t))
        assert isinstance(faulty, FaultyTier)
        res = run_planned_campaign(e, faulty, tokens, SPEC, model, 24.0, 30, seed=2,
                                   chunk_tokens=16)
    assert res.blocks == 8 and sum(res.counts.values()) == 30 * 8
    assert all(sum(c.values()) == 30 for c in res.per_block.values())
    assert res.counts["sdc"] == 0 and res.counts["due"] > 0 and res.counts["corrected"] > 0
    coded = [(b.chunk, b.layer) for b in plan.blocks if b.code != "none"]
    assert all(res.per_block[p]["due"] == 0 for p in coded)
    assert res.reads > 30      # some reads went on past a failed chunk
