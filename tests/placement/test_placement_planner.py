"""The planner on option tables built from real record sizes and predict()."""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

import pytest

from rkv.errors import ConfigError
from rkv.placement import (
    BlockInput,
    InfeasiblePlanError,
    PlacementConfig,
    Planner,
    TierInput,
    plan_exact,
)
from rkv.profiles import QualityProfile

# Raw-BER models: predict() is quick for them (no clustered classes to sample).
DRAM = {"model": "raw-ber", "ber": 1e-13}
CXL = {"model": "raw-ber", "ber": 1e-11}
NVME = {"model": "raw-ber", "ber": 1e-8}
CODES = ("none", "rs(255,247)", "rs(255,223)", "bch(m=13,t=8)")


def profile() -> QualityProfile:
    return QualityProfile({"kl": {f"{layer}:{k}:{b}": {8: 0.001, 4: 0.01, 2: 0.05}[b]
                                  for layer in range(4) for k in "kv" for b in (2, 4, 8)}})


def tiers(dram_free: int = 1 << 30) -> list[TierInput]:
    return [TierInput("dram", DRAM, dram_free, 20.0, 0.1),
            TierInput("cxl", CXL, 1 << 30, 12.0, 0.25),
            TierInput("nvme", NVME, 1 << 36, 6.5, 80.0)]


def blocks(layers: int = 2, chunks: int = 2, reuse: float = 2.0) -> list[BlockInput]:
    return [BlockInput(layer, kind, c, 64, 24.0, reuse, 2, 32)
            for c in range(chunks) for layer in range(layers) for kind in "kv"]


def planner(**kw: Any) -> Planner:
    base: dict[str, Any] = {"codes": CODES, "bits": [16, 8, 4, 2], "max_p_due": 1e-9,
                            "capacity_cost": {"dram": 3000.0, "cxl": 800.0, "nvme": 20.0}}
    base.update(kw)
    return Planner(PlacementConfig.from_dict(base), profile())


def test_plan_meets_every_constraint_and_matches_oracle() -> None:
    pl = planner(quality_budget_kl=0.02)
    bs = blocks()
    fast, exact = pl.plan(bs, tiers()), pl.plan_exact(bs, tiers())
    for p in (fast, exact):
        assert p.kl <= 0.02 + 1e-12
        assert all(b.p_due <= 1e-9 and b.p_sdc <= 1e-15 for b in p.blocks)
        assert all(p.tier_bytes[t] <= p.tier_free[t] for t in p.tier_bytes)
    assert fast.total_cost_us <= exact.total_cost_us * 1.05
    assert "quality_budget_kl" in fast.binding
    assert any("KL budget" in b.reason for b in fast.blocks)
    table = fast.table()
    assert "reason" in table and "binding: quality_budget_kl" in table
    rows = json.loads(fast.table(None, "json"))          # the rows alone, values as numbers
    assert len(rows) == len(fast.blocks) and rows[0]["p_due"] == fast.blocks[0].p_due
    assert fast.table(None, "csv").splitlines()[0].startswith("layer,kind,chunk,tier")


def test_capacity_binds() -> None:
    pl = planner(quality_budget_kl=1.0, bits=[16])
    bs = blocks()
    one = pl.plan(bs[:1], tiers()).blocks[0]
    assert one.tier == "dram"
    p = pl.plan(bs, tiers(dram_free=3 * one.record_bytes))
    assert p.tier_bytes["dram"] <= 3 * one.record_bytes
    assert "dram capacity" in p.binding
    assert sum("dram capacity" in b.reason for b in p.blocks) == len(bs) - 3
    assert p.total_cost_us <= plan_exact(bs, tiers(dram_free=3 * one.record_bytes),
                                         pl.config, profile()).total_cost_us * 1.05


def test_reliability_filter_and_reason() -> None:
    pl = planner(max_p_due=1e-12, bits=[16])
    p = pl.plan(blocks(1, 1), tiers())
    for b in p.blocks:
        assert b.p_due <= 1e-12 and b.reason.startswith("cheapest meeting max_p_due")


def test_infeasible_p_due_names_block_and_best() -> None:
    pl = planner(max_p_due=1e-300, bits=[16])
    with pytest.raises(InfeasiblePlanError, match=r"no option for layer 0 K at chunk 0 meets "
                       r"max_p_due=1e-300: the best is .+ on \w+ at [0-9.e-]+") as exc:
        pl.plan(blocks(1, 1), tiers())
    assert exc.value.constraint == "max_p_due"


def test_infeasible_kl_and_capacity() -> None:
    pl = planner(bits=[4, 2], quality_budget_kl=0.001)
    with pytest.raises(InfeasiblePlanError, match=r"quality_budget_kl=0\.001 cannot be met"):
        pl.plan(blocks(), tiers())
    small = [TierInput("dram", DRAM, 1000, 20.0, 0.1)]
    with pytest.raises(InfeasiblePlanError, match="fits a tier's free capacity"):
        planner().plan(blocks(1, 1), small)
    two = [TierInput("dram", DRAM, 60_000, 20.0, 0.1)]
    with pytest.raises(InfeasiblePlanError, match="tier capacity cannot hold the put") as exc:
        planner(bits=[16]).plan(blocks(2, 2), two)
    assert exc.value.constraint == "capacity"


def test_lossy_bits_need_a_profile() -> None:
    with pytest.raises(ConfigError, match="quality profile"):
        Planner(PlacementConfig(bits=(16, 4)))


def test_earlier_chunks_get_no_weaker_protection() -> None:
    """A DUE at chunk p costs the recompute of chunks p..n-1: same budget, an earlier chunk
    is stored with P(DUE) no higher than a later one."""
    tier = [TierInput("nvme", {"model": "raw-ber", "ber": 1e-6}, 1 << 36, 6.5, 80.0)]
    pl = Planner(PlacementConfig(bits=(16,), codes=CODES, max_p_due=1.0,
                                 recompute_us_per_token=0.5,
                                 capacity_cost={"nvme": 1e7}), None)
    bs = [BlockInput(0, "kv", c, 64, 24.0, 1.0, 2, 32) for c in range(8)]
    p = pl.plan(bs, tier)
    due = [b.p_due for b in p.blocks]
    assert all(a <= b * (1 + 1e-9) for a, b in itertools.pairwise(due))
    assert due[0] < due[-1]  # the cost model distinguishes them at this rate
    assert p.blocks[-1].code == "none" and p.blocks[0].code != "none"


def test_plan_reports_times_and_dict() -> None:
    p = planner().plan(blocks(), tiers())
    d = p.to_dict()
    assert d["blocks"][0]["tier"] in ("dram", "cxl", "nvme") and p.plan_us > 0
    assert re.search(r"\d+ more blocks", p.__class__.table(p, limit=2))
