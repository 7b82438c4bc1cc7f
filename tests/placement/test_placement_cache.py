"""The planner's caches: a cached option table gives the plan a fresh planner gives, every
input the table depends on invalidates it, the vectorised recompute costs match the
definition, and a warm-started plan is no worse than a cold one beyond a small tolerance."""

from __future__ import annotations

import contextlib
import math
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rkv.placement import (
    BlockInput,
    InfeasiblePlanError,
    PlacementConfig,
    Planner,
    TierInput,
)
from rkv.placement.options import recompute_costs
from rkv.placement.plan import Plan
from rkv.placement.solver import NoFeasibleChoice, Problem, solve_fast
from rkv.profiles import QualityProfile

CODES = ("none", "rs(255,247)", "rs(255,223)")
BITS = (16, 8, 4)


def profile() -> QualityProfile:
    return QualityProfile({"kl": {f"{layer}:{k}:{b}": {8: 0.001, 4: 0.01}[b] * (1 + layer)
                                  for layer in range(3) for k in "kv"
                                  for b in (4, 8)}})


def tiers(dram_free: int, ber: float = 1e-12, latency: float = 0.1) -> list[TierInput]:
    """DRAM flips ``ber`` per bit and hour: at 1e-12 a 4 KiB block kept 24 h without a code
    is lost with P about 8e-7 (meets max_p_due = 1e-6), at 1000 h 3e-5 (needs a code)."""
    dram = {"model": "raw-ber", "ber": ber, "per_hour": True}
    return [TierInput("dram", dram, dram_free, 20.0, latency),
            TierInput("nvme", {"model": "raw-ber", "ber": 1e-7}, 1 << 36, 6.5, 80.0)]


def planner(kl: float = 0.03, **kw: Any) -> Planner:
    cfg = PlacementConfig(bits=BITS, codes=CODES, max_p_due=1e-6, quality_budget_kl=kl,
                          recompute_us_per_token=20.0,
                          capacity_cost={"dram": 3000.0, "nvme": 20.0})
    return Planner(cfg, profile(), **kw)


def same(a: Plan, b: Plan) -> None:
    da, db = a.to_dict(), b.to_dict()
    for d in (da, db):
        d.pop("plan_us")
    assert da == db
    assert (a.block_tier, a.block_bits, a.block_code) == (b.block_tier, b.block_bits,
                                                          b.block_code)


@st.composite
def puts(draw: st.DrawFn) -> tuple[list[BlockInput], list[BlockInput], int, int]:
    """Two puts of one shape (reuse and chunk positions differ) and two DRAM capacities."""
    layers = draw(st.integers(1, 3))
    chunks = draw(st.integers(1, 4))
    kinds = draw(st.sampled_from([("kv",), ("k", "v")]))
    tokens = draw(st.sampled_from([16, 32]))
    hours = draw(st.sampled_from([1.0, 24.0]))
    offset = draw(st.integers(0, 3))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))

    def put(shift: int) -> list[BlockInput]:
        return [BlockInput(layer, kind, c + shift, tokens, hours, float(rng.uniform(0, 4)),
                           2, 16, "float16", chunks + offset + 1)
                for c in range(chunks) for layer in range(layers) for kind in kinds]

    one = 2 * tokens * 2 * 16 * 2 // len(kinds)
    n = chunks * layers * len(kinds)
    caps = [int(one * n * f) for f in (draw(st.floats(0.05, 1.5)), draw(st.floats(0.05, 1.5)))]
    return put(0), put(offset), caps[0], caps[1]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(puts(), st.floats(0.002, 0.2))
def test_cached_table_plans_like_a_fresh_planner(put: Any, kl: float) -> None:
    """A planner that planned a put of the same shape (other reuse, chunk positions and free
    capacity) before reuses its table; its plan equals a fresh planner's, block for block."""
    first, second, cap1, cap2 = put
    cached = planner(kl, warm_start=False)
    with contextlib.suppress(InfeasiblePlanError):    # its table is kept all the same
        cached.plan(first, tiers(cap1))
    results: list[Plan | InfeasiblePlanError] = []
    for pl in (cached, planner(kl, warm_start=False)):
        try:
            results.append(pl.plan(second, tiers(cap2)))
        except InfeasiblePlanError as exc:
            results.append(exc)
    a, b = results
    if not isinstance(a, Plan) or not isinstance(b, Plan):
        assert type(a) is type(b) and str(a) == str(b)
        return
    same(a, b)
    np.testing.assert_array_equal(cached.problem(second, tiers(cap2)).cost,
                                  planner(kl).problem(second, tiers(cap2)).cost)


def _blocks(hours: float = 24.0, reuse: float = 1.0) -> list[BlockInput]:
    return [BlockInput(layer, "kv", c, 32, hours, reuse, 2, 16, "float16", 4)
            for c in range(4) for layer in range(2)]


@pytest.mark.parametrize("change", ["fault model", "residency", "latency", "kind"])
def test_a_changed_input_rebuilds_the_table(change: str) -> None:
    """Each input the table depends on is in its key: after the change the cached planner
    plans what a fresh one does, and for these changes that plan differs."""
    pl = planner(1.0, warm_start=False)
    bs, ts = _blocks(), tiers(1 << 30)
    before = pl.plan(bs, ts)
    if change == "fault model":      # a noisier DRAM needs a code
        ts = tiers(1 << 30, ber=1e-9)
    elif change == "residency":      # a block kept 1000 h needs a code
        bs = _blocks(hours=1000.0)
    elif change == "latency":        # a slow DRAM: the cheaper NVMe wins
        ts = tiers(1 << 30, latency=5e4)
    else:                            # K and V apart: twice the blocks, other sizes
        bs = [replace(b, kind=k) for b in bs for k in "kv"]
    after, fresh = pl.plan(bs, ts), planner(1.0, warm_start=False).plan(bs, ts)
    same(after, fresh)
    assert len(pl._tables) == 2
    assert (after.block_tier, after.block_code) != (before.block_tier, before.block_code)


def test_reuse_and_position_are_applied_per_put() -> None:
    """Reuse and chunk position are not in the key: one table, yet the plans follow them."""
    pl = planner(1.0, warm_start=False)
    ts = tiers(1 << 30, latency=30.0)
    hot = pl.plan(_blocks(reuse=50.0), ts)
    cold = pl.plan(_blocks(reuse=0.0), ts)
    assert len(pl._tables) == 1
    same(cold, planner(1.0, warm_start=False).plan(_blocks(reuse=0.0), ts))
    assert hot.block_tier != cold.block_tier or hot.block_code != cold.block_code


def test_config_and_profile_are_per_planner() -> None:
    """The tables live in a planner, whose config and profile are fixed: another target
    means another planner, whose plan follows it."""
    bs, ts = _blocks(), tiers(1 << 30)
    loose = planner(1.0).plan(bs, ts)
    tight = Planner(replace(planner(1.0).config, max_p_due=1e-12), profile()).plan(bs, ts)
    assert all(b.p_due <= 1e-12 for b in tight.blocks)
    assert loose.block_code != tight.block_code


def test_reasons_are_lazy_and_match_the_choice() -> None:
    pl = planner(0.01)
    p = pl.plan(_blocks(), tiers(40_000))
    assert "blocks" not in p.__dict__          # not computed by plan()
    assert [(b.tier, b.bits, b.code) for b in p.blocks] == list(
        zip(p.block_tier, p.block_bits, p.block_code, strict=True))
    assert {b.reason for b in p.blocks} - {"cheapest"}
    assert p.to_dict()["blocks"][0]["reason"]


def _recompute_reference(blocks: list[BlockInput], cfg: PlacementConfig) -> list[float]:
    tokens: dict[int, int] = {}
    for b in blocks:
        tokens[b.chunk] = max(tokens.get(b.chunk, 0), b.tokens)
    last, default = max(tokens), max(tokens.values())
    return [math.fsum(cfg.recompute_us(tokens.get(c, default))
                      for c in range(b.chunk, b.n_chunks or last + 1)) for b in blocks]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 9), st.integers(1, 300), st.integers(0, 5),
                          st.booleans()), min_size=1, max_size=30),
       st.sampled_from([{"recompute_us_per_token": 3.0}, {"recompute_us_per_chunk": 7.0}, {}]))
def test_vectorised_recompute_costs_match_the_definition(spec: Any, kw: Any) -> None:
    cfg = PlacementConfig(**kw)
    bs = [BlockInput(0, "kv", c, t, 1.0, 1.0, 1, 8, "float16", c + 1 + extra if own else None)
          for c, t, extra, own in spec]
    got = recompute_costs(np.asarray([b.chunk for b in bs]),
                          np.asarray([-1 if b.n_chunks is None else b.n_chunks for b in bs]),
                          np.asarray([b.tokens for b in bs]), cfg)
    assert got.tolist() == _recompute_reference(bs, cfg)


@pytest.mark.parametrize("dram_free", [1 << 30, 30_000])
def test_replanning_the_same_put_is_never_worse(dram_free: int) -> None:
    """The warm start offers the last plan's choice: the same put re-planned costs at most
    what it did. Where the multipliers settled (KL alone binds) it takes fewer evaluations;
    where KL and DRAM trade off without settling, the search starts cold again."""
    pl = planner(0.02)
    bs = [BlockInput(layer, kind, c, 32, 24.0, 2.0, 2, 16) for c in range(6)
          for layer in range(3) for kind in "kv"]
    ts = tiers(dram_free)
    cold = pl.plan(bs, ts)
    assert "quality_budget_kl" in cold.binding
    for _ in range(3):
        warm = pl.plan(bs, ts)
        assert warm.total_cost_us <= cold.total_cost_us
        if dram_free > 1 << 20:
            assert warm.extra["evaluations"] < cold.extra["evaluations"]
        else:
            assert warm.extra["evaluations"] <= cold.extra["evaluations"]


def _table(seed: int) -> tuple[Problem, Problem]:
    """A random table with binding KL and capacity, and a neighbour (costs, budget and
    capacities within 10 %): the put before it."""
    rng = np.random.default_rng(seed)
    n, m = int(rng.integers(20, 160)), int(rng.integers(4, 24))
    kl = rng.uniform(0, 0.01, (n, m)) * (rng.random((n, m)) < 0.7)
    cost = 5 + rng.uniform(0, 1, (n, m)) - 100 * kl
    nb, tier = rng.uniform(1e4, 1e5, (n, m)), rng.integers(0, 3, (n, m))
    lo, hi = kl.min(axis=1).sum(), kl.max(axis=1).sum()
    budget = float(lo + rng.uniform(0.1, 0.6) * (hi - lo))
    cap = np.asarray([rng.uniform(0.1, 0.5) * n * 5e4, rng.uniform(0.2, 1) * n * 5e4, 1e12])
    before = Problem(cost * rng.uniform(0.95, 1.05, (n, 1)), kl, nb, tier,
                     budget * rng.uniform(0.9, 1.1), cap * rng.uniform(0.9, 1.1, 3))
    return Problem(cost, kl, nb, tier, budget, cap), before


#: How much worse than a cold solve a warm start may land (both are heuristics within their
#: dual bound; over 200 seeds the worst seen was 0.25 %, the mean slightly better than cold).
WARM_TOLERANCE = 0.01


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.integers(0, 2**31))
def test_warm_start_is_no_worse_than_cold(seed: int) -> None:
    p, before = _table(seed)
    try:
        prev, cold = solve_fast(before), solve_fast(p)
    except NoFeasibleChoice:
        return
    warm = solve_fast(p, start=prev.multipliers, hint=prev.choice)
    assert p.feasible(warm.choice)
    assert warm.cost <= cold.cost * (1 + WARM_TOLERANCE)
    assert warm.cost >= max(cold.lower_bound, warm.lower_bound) - 1e-9 * abs(cold.cost)


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(3, 6), st.integers(4, 10), st.floats(0.02, 0.3), st.floats(0.1, 1.0))
def test_a_new_shape_started_warm_is_within_1_percent_of_cold(
        layers: int, chunks: int, kl: float, dram: float) -> None:
    """A new shape's search starts from another shape's multipliers; a plan landing over
    1 % from its bound is checked against a cold search, so the first plan of a shape is
    never more than 1 % above what a fresh planner finds."""
    def put(n: int) -> list[BlockInput]:
        return [BlockInput(layer % 3, kind, c, 32, 24.0, 2.0, 2, 16) for c in range(n)
                for layer in range(layers) for kind in "kv"]

    cap = int(dram * 4096 * layers * chunks)
    pl = planner(kl)
    try:
        pl.plan(put(chunks - 1), tiers(cap))
        cold = planner(kl).plan(put(chunks), tiers(cap))
    except InfeasiblePlanError:
        return
    warm = pl.plan(put(chunks), tiers(cap))
    assert warm.kl <= kl * (1 + 1e-9) and warm.tier_bytes["dram"] <= cap
    assert warm.total_cost_us <= cold.total_cost_us * (1 + WARM_TOLERANCE)
