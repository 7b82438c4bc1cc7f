"""Placement under a byte budget, and the parity a planned store saves over a uniform code.

The planner minimises expected cost subject to a KL budget and tier capacity. Two questions
it does not answer directly are answered here, on top of it (nothing in the planner
changes):

* **The lowest KL at a byte budget.** :func:`smallest_kl_budget` bisects
  ``quality_budget_kl`` (log scale) for the smallest budget whose plan fits ``byte_budget``
  bytes; ``plan_at(kl)`` plans with that budget (an :class:`InfeasiblePlanError` counts as
  not fitting). When the plan's cost grows with its bytes (a capacity cost on the tier that
  dwarfs the rest), the plan at that budget is the least-KL plan within the bytes (up to the
  bisection's resolution and the solver's optimality gap): a plan with less KL within the
  bytes would fit at a smaller budget. :func:`min_kl_exact` is the exact answer of the same
  question on the profile's additive KL (a multiple-choice knapsack, by dynamic programming
  over the bytes), to measure how close the bisection gets.
* **Parity versus the weakest uniform code.** :func:`uniform_codes` judges every candidate
  code applied to every block (each at its own bits) against the reliability targets, and
  :func:`weakest_uniform` picks the one with the fewest parity bytes among those meeting the
  targets for every block. Parity bytes of a record: its bytes minus the bytes of the same
  block's record with no code (``"none"``: the end-to-end checksum alone).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rkv.errors import ConfigError
from rkv.placement.config import BlockInput
from rkv.placement.errors import InfeasiblePlanError
from rkv.placement.options import DEFAULT_CACHE, ReliabilityCache, data_bytes, record_bytes
from rkv.placement.plan import Plan


def plan_bytes(plan: Plan) -> int:
    """Bytes of every record the plan writes, over all tiers."""
    return int(sum(plan.tier_bytes.values()))


@dataclass
class BudgetSearch:
    """The result of :func:`smallest_kl_budget`: the fitting plan with the least KL among
    the steps (``None`` if none fit), the KL budget it was planned with, and every step as
    ``(kl_budget, bytes or None when infeasible, plan KL or None)``."""

    plan: Plan | None
    kl_budget: float
    byte_budget: float
    steps: list[tuple[float, int | None, float | None]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        p = self.plan
        return {"kl_budget": self.kl_budget, "byte_budget": self.byte_budget,
                "plan_kl": None if p is None else p.kl,
                "plan_bytes": None if p is None else plan_bytes(p),
                "steps": [list(s) for s in self.steps]}


def smallest_kl_budget(plan_at: Callable[[float], Plan], byte_budget: float, kl_hi: float,
                       *, kl_lo: float | None = None, steps: int = 30) -> BudgetSearch:
    """Bisect ``quality_budget_kl`` in ``[kl_lo, kl_hi]`` (geometric midpoints; ``kl_lo``
    defaults to ``kl_hi * 1e-6``) for the smallest budget whose plan fits ``byte_budget``.
    Returns the fitting plan with the least KL over all steps (the solver is a heuristic,
    so fitting need not be exactly monotone in the budget)."""
    if not (kl_hi > 0 and math.isfinite(kl_hi)):
        raise ConfigError(f"kl_hi must be a finite number > 0, got {kl_hi!r}")
    lo = kl_hi * 1e-6 if kl_lo is None else kl_lo
    if not 0 < lo < kl_hi:
        raise ConfigError(f"need 0 < kl_lo < kl_hi, got {lo!r} and {kl_hi!r}")
    out = BudgetSearch(None, math.nan, byte_budget)

    def fits(kl: float) -> bool:
        try:
            plan = plan_at(kl)
        except InfeasiblePlanError:
            out.steps.append((kl, None, None))
            return False
        nbytes = plan_bytes(plan)
        out.steps.append((kl, nbytes, plan.kl))
        ok = nbytes <= byte_budget
        if ok and (out.plan is None or plan.kl < out.plan.kl):
            out.plan, out.kl_budget = plan, kl
        return ok

    if not fits(kl_hi):
        return out
    if fits(lo):
        return out
    for _ in range(steps):
        mid = math.sqrt(lo * kl_hi)
        if fits(mid):
            kl_hi = mid
        else:
            lo = mid
    return out


def min_kl_exact(kl: np.ndarray, nbytes: np.ndarray, byte_budget: float,
                 unit: int = 64) -> tuple[float, np.ndarray]:
    """The least total KL choosing one option per block (``kl``, ``nbytes``: ``(blocks,
    options)``) with total bytes <= ``byte_budget``: dynamic programming over the bytes in
    ``unit``-byte steps (each option's bytes rounded up, so the answer never exceeds the
    budget and may miss plans within ``blocks x unit`` bytes of it). Returns (KL, choice)."""
    kl = np.asarray(kl, np.float64)
    w = np.ceil(np.asarray(nbytes, np.float64) / unit).astype(np.int64)
    cap = int(byte_budget // unit)
    n, m = kl.shape
    if int(w.min(axis=1).sum()) > cap:
        raise InfeasiblePlanError(f"no choice fits {byte_budget:.0f} bytes", "capacity")
    best = np.zeros(cap + 1)          # least KL of the blocks so far within c units
    pick = np.zeros((n, cap + 1), np.int8)
    for i in range(n):
        cand = np.full((m, cap + 1), np.inf)
        for j in range(m):
            if w[i, j] <= cap:
                cand[j, w[i, j]:] = best[:cap + 1 - w[i, j]] + kl[i, j]
        pick[i] = np.argmin(cand, axis=0)
        best = cand[pick[i], np.arange(cap + 1)]
    choice = np.empty(n, np.int64)
    c = cap
    for i in range(n - 1, -1, -1):
        choice[i] = pick[i, c]
        c -= int(w[i, choice[i]])
    return float(best[cap]), choice


def parity_bytes(block: BlockInput, bits: int, code: str) -> int:
    """Bytes a code adds to the block's record at ``bits`` (0 for ``"none"``)."""
    return record_bytes(block, bits, code) - record_bytes(block, bits, "none")


@dataclass(frozen=True)
class UniformCode:
    """One code applied to every block: whether it meets the targets for all of them, the
    worst block's P(DUE) and P(SDC), and the total parity bytes."""

    code: str
    meets: bool
    worst_p_due: float
    worst_p_sdc: float
    parity_bytes: int


def uniform_codes(blocks: Sequence[tuple[BlockInput, int]], codes: Sequence[str],
                  model: Any, max_p_due: float, max_p_sdc: float = 1.0,
                  cache: ReliabilityCache | None = None) -> list[UniformCode]:
    """Every candidate code judged as the one code of every ``(block, bits)``: P(DUE) and
    P(SDC) from ``predict`` (through ``cache``) for each block's data bytes over its
    residency. A code that cannot encode some block (``ConfigError``) does not meet."""
    cache = cache if cache is not None else DEFAULT_CACHE
    out = []
    for code in codes:
        due = sdc = 0.0
        parity = 0
        ok = True
        for b, bits in blocks:
            try:
                parity += parity_bytes(b, bits, code)
            except ConfigError:
                ok = False
                break
            d, s = cache.get(code, data_bytes(b, bits), model, b.residency_hours)
            due, sdc = max(due, d), max(sdc, s)
        out.append(UniformCode(code, ok and due <= max_p_due and sdc <= max_p_sdc,
                               due, sdc, parity if ok else -1))
    return out


def weakest_uniform(candidates: Sequence[UniformCode]) -> UniformCode:
    """The code with the fewest parity bytes among those meeting the targets for every
    block (the first listed on a tie); ``InfeasiblePlanError`` if none does."""
    ok = [c for c in candidates if c.meets]
    if not ok:
        best = min(candidates, key=lambda c: c.worst_p_due)
        raise InfeasiblePlanError(f"no uniform code meets the targets for every block: the "
                                  f"best is {best.code} at P(DUE) {best.worst_p_due:.2g}",
                                  "max_p_due")
    return min(ok, key=lambda c: c.parity_bytes)
