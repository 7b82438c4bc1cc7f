"""Planned sweep cells: the engine's planner chooses bits and code per block; reliability is
the block-weighted mixture of per-(bits, code) campaigns with a MOVER interval."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest

from rkv.eval.faults.campaign import wilson
from rkv.eval.sweep.cells import run_cell
from rkv.eval.sweep.planned import (
    PlannedRoundTrip,
    engine_config,
    mover,
    plan_classes,
    smollm2_fp16,
)
from rkv.eval.sweep.spec import parse_sweep
from rkv.store.plans import EnginePlacement

# Two bit-widths and two codes keep the planner's predictions to four.
# The KL budget keeps some layers at 16 bits: a mix of two (bits, code) groups.
PLACEMENT = {"bits": [16, 4], "codes": ["none", "rs(255,239)"], "max_p_due": 1e-3,
             "quality_budget_kl": 0.001}


def planned_cell(tmp: Any = None, **axes: Any) -> dict[str, Any]:
    s = parse_sweep({"sweep": {"name": "p", "metrics": ["reliability", "cost"]},
                     "axes": {"tier": ["nvme"], "ber_multiplier": [1e3],
                              "placement": [PLACEMENT], **axes},
                     "reliability": {"trials": 2, "blocks": 2, "sampling": "conditional",
                                     "chunks": 1},
                     "cost": {"chunks": 1, "repeats": 1}})
    return dict(s.cells[0])


def test_mover_of_one_group_is_its_interval() -> None:
    lo, hi = wilson(3, 40)
    assert mover([(1.0, 3 / 40, lo, hi)]) == pytest.approx((3 / 40, lo, hi))


def test_mover_interval_covers_the_mixture_about_95_percent() -> None:
    """Two-sided: too narrow (below 93 %) or far too wide (above 99 %) both fail."""
    rng = np.random.default_rng(5)
    weights, ps, ns = [0.7, 0.3], [0.02, 0.3], [60, 25]
    truth = sum(w * p for w, p in zip(weights, ps, strict=True))
    hits, reps = 0, 3000
    for _ in range(reps):
        parts = []
        for w, p, n in zip(weights, ps, ns, strict=True):
            k = int(rng.binomial(n, p))
            lo, hi = wilson(k, n)
            parts.append((w, k / n, lo, hi))
        _, lo, hi = mover(parts)
        hits += lo <= truth <= hi
    assert 0.93 <= hits / reps <= 0.99


@pytest.fixture(scope="module")
def planned_row() -> dict[str, Any]:
    return run_cell(planned_cell())


def test_the_stored_mix_is_the_planners_plan(tmp_path: Any) -> None:
    cell = planned_cell()
    cfg = engine_config(cell, tmp_path)
    ep = EnginePlacement.for_engine(cfg)
    assert ep is not None
    spec = smollm2_fp16()
    plan = ep.planner(spec).plan(ep.blocks(spec, [256], 1), [ep.tier_input("t0")])
    want = Counter((b.bits, "none" if b.code == "none" else "rs(255,239)")
                   for b in plan.blocks)
    assert plan_classes(cell, 1, seed=3) == want


def test_planned_reliability_is_the_block_weighted_mixture(planned_row: dict[str, Any]
                                                           ) -> None:
    rel = planned_row["reliability"]
    plan = rel["plan"]
    assert sum(p["blocks"] for p in plan) == 30 and sum(p["fraction"] for p in plan) == 1.0
    for o, r in rel["rates"].items():
        assert r["lo"] <= r["rate"] <= r["hi"], o
    assert len(plan) == 2
    # every group ran its own campaign: blocks read add up over the groups
    assert sum(r["n"] for r in rel["rates"].values()) == rel["blocks"] == 2 * 2 * 2
    p_due = rel["analytic"]["p_due"]
    assert p_due is not None and 0 < p_due <= PLACEMENT["max_p_due"]


def test_planned_cost_stores_what_the_plan_says(planned_row: dict[str, Any]) -> None:
    plan = planned_row["reliability"]["plan"]
    c = planned_row["cost"]
    fp16 = c["raw_bytes_per_token"]
    lo = sum(p["fraction"] * p["bits"] / 16 for p in plan) * fp16
    # data bytes of the planned bits, plus headers, quantizer scales and parity
    assert lo < c["bytes_per_token"] < lo * 1.3
    assert planned_row["config"]["placement"]["profile"] == "smollm2-135m"


def test_planned_round_trip_reads_back_the_planned_kv() -> None:
    cell = planned_cell(ber_multiplier=[1e-30])      # effectively no faults
    rt = PlannedRoundTrip(cell)
    rng = np.random.default_rng(0)
    kv = rng.standard_normal((30, 2, 256, 3, 64)).astype(np.float32)
    out, report = rt(kv, list(range(256)))
    assert out is not None and out.dtype == np.float32 and out.shape == kv.shape
    assert sum(rt.classes.values()) == 30 and "due_blocks" not in report
    exact = {16: 1e-3, 4: 0.5}      # fp16 rounding; 4-bit quantization noise
    bits = {b for b, _ in rt.classes}
    err = float(np.abs(out - kv).max())
    assert err <= max(exact[b] * 8 for b in bits)
    if bits == {16}:
        np.testing.assert_array_equal(out, kv.astype(np.float16).astype(np.float32))
