"""The fast solver against the branch-and-bound oracle on random option tables."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rkv.placement.solver import NoFeasibleChoice, Problem, solve_exact, solve_fast


@st.composite
def problems(draw: st.DrawFn) -> Problem:
    n = draw(st.integers(1, 7))
    m = draw(st.integers(1, 6))
    t = draw(st.integers(1, 3))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    cost = rng.uniform(0, 10, (n, m))
    cost[rng.random((n, m)) < 0.15] = np.inf
    kl = rng.uniform(0, 1, (n, m)) * (rng.random((n, m)) < 0.7)
    nbytes = rng.integers(1, 100, (n, m)).astype(np.float64)
    tier = rng.integers(0, t, (n, m))
    tight = draw(st.floats(0.05, 1.0))
    budget = float(tight * n * 0.6)
    cap = rng.uniform(0.2, 1.0, t) * n * 60 * tight
    return Problem(cost, kl, nbytes, tier, budget, cap)


def _exact(p: Problem) -> float | None:
    try:
        return solve_exact(p).cost
    except NoFeasibleChoice:
        return None


@settings(max_examples=300)
@given(problems())
def test_fast_within_5_percent_of_exact_and_never_infeasible(p: Problem) -> None:
    best = _exact(p)
    if best is None:
        with pytest.raises(NoFeasibleChoice):
            solve_fast(p)
        return
    sol = solve_fast(p)
    assert p.feasible(sol.choice)
    assert sol.cost <= best * 1.05 + 1e-9
    assert sol.cost >= best - 1e-9 * max(1.0, abs(best))


@settings(max_examples=200)
@given(problems())
def test_heuristic_alone_is_feasible_and_bounded(p: Problem) -> None:
    """Without the branch-and-bound polish: whatever it returns is feasible, no cheaper than
    the optimum, and no cheaper than its own Lagrangian lower bound says."""
    best = _exact(p)
    try:
        sol = solve_fast(p, polish_nodes=0)
    except NoFeasibleChoice as exc:
        assert best is None or not exc.proven
        return
    assert best is not None and p.feasible(sol.choice)
    assert sol.cost >= best - 1e-9 * max(1.0, abs(best))
    assert sol.lower_bound <= best + 1e-6 * max(1.0, abs(best))


def test_unconstrained_optimum_is_one_evaluation() -> None:
    rng = np.random.default_rng(1)
    p = Problem(rng.uniform(0, 1, (50, 8)), np.zeros((50, 8)), np.ones((50, 8)),
                np.zeros((50, 8), np.int64), 1.0, np.asarray([1e9]))
    sol = solve_fast(p)
    assert sol.evaluations == 1
    assert math.isclose(sol.cost, float(p.cost.min(axis=1).sum()))


def test_large_instance_gap_bound_small() -> None:
    """480 blocks x 30 options with a binding KL budget: within 1 % of the dual bound."""
    rng = np.random.default_rng(2)
    n, m = 480, 30
    kl = rng.uniform(0, 0.01, (n, m)) * (np.arange(m) % 3 != 0)
    cost = 5 + rng.uniform(0, 1, (n, m)) - 100 * kl
    p = Problem(cost, kl, rng.uniform(1e4, 1e5, (n, m)), rng.integers(0, 3, (n, m)),
                0.5, np.asarray([5e6, 1e7, 1e9]))
    sol = solve_fast(p)
    assert p.feasible(sol.choice)
    assert sol.cost <= sol.lower_bound * 1.01


def test_proven_infeasible_kl() -> None:
    p = Problem(np.ones((2, 2)), np.ones((2, 2)), np.ones((2, 2)), np.zeros((2, 2), np.int64),
                1.5, np.asarray([10.0]))
    with pytest.raises(NoFeasibleChoice) as exc:
        solve_fast(p)
    assert exc.value.proven and exc.value.violated == [0]


@settings(max_examples=200)
@given(problems(), st.floats(0.2, 5.0), st.booleans())
def test_warm_start_keeps_the_oracle_gap(p: Problem, scale: float, with_hint: bool) -> None:
    """Started from multipliers off by a factor (and the cold choice as a hint), the solver
    is still within 5 % of the optimum and raises exactly when the oracle finds nothing."""
    best = _exact(p)
    if best is None:
        with pytest.raises(NoFeasibleChoice):
            solve_fast(p, start=np.ones(1 + p.n_tiers))
        return
    cold = solve_fast(p)
    start = cold.multipliers * scale if cold.multipliers.any() else np.full(1 + p.n_tiers,
                                                                            scale)
    warm = solve_fast(p, start=start, hint=cold.choice if with_hint else None)
    assert p.feasible(warm.choice)
    assert best - 1e-9 * max(1.0, abs(best)) <= warm.cost <= best * 1.05 + 1e-9
    if with_hint:
        assert warm.cost <= cold.cost + 1e-9 * max(1.0, abs(cold.cost))
