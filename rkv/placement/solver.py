"""The joint choice for a put: a multiple-choice knapsack with several resources.

Each block ``i`` takes exactly one option ``j``; an option has a cost, a KL and some bytes in
one tier. Minimise the total cost subject to total KL <= ``kl_budget`` and, per tier, bytes
<= its free capacity. (Per-block reliability limits are applied before: an option that
misses them is simply not offered, ``cost = inf``.)

:func:`solve_fast` relaxes the KL and capacity constraints with one Lagrange multiplier each,
finds the multipliers by coordinate-wise bracketing and bisection (each evaluation is one
vectorised argmin over the option table), keeps the cheapest feasible choice it meets, repairs
an infeasible one greedily, then improves it by single moves and by pairs of moves that trade
one block's resource for another's (:mod:`rkv.placement.localsearch`). The search can start
warm, from the multipliers and the choice of an earlier plan, and stops early once its best
choice is within 0.01 % of the dual bound. :func:`solve_exact` is branch and bound, for small
instances and as the tests' oracle.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import numpy.typing as npt

from rkv.placement.localsearch import REL_TOL as _REL_TOL
from rkv.placement.localsearch import improve as _improve
from rkv.placement.localsearch import limit_ok as _limit_ok
from rkv.placement.localsearch import repair as _repair

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

_BISECT_TOL = 1.002             # a multiplier is searched to this ratio
_WARM_STEPS = (1.0015, 1.05, 1.5)   # brackets tried around a nonzero start first
_CERTIFY = 1e-4                 # a choice this close to the dual bound ends the search


@dataclass(frozen=True)
class Problem:
    """``cost``, ``kl``, ``nbytes``, ``tier``: ``(blocks, options)`` arrays (``cost = inf``
    marks an option that is not offered); ``capacity``: free bytes per tier."""

    cost: F64
    kl: F64
    nbytes: F64
    tier: I64
    kl_budget: float
    capacity: F64

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.cost.shape[0]), int(self.cost.shape[1]))

    @property
    def n_tiers(self) -> int:
        return int(self.capacity.shape[0])

    def resources(self) -> tuple[F64, F64]:
        """(per-resource use of every option ``(1 + tiers, n, m)``, the limits)."""
        return self._resources

    @cached_property
    def _resources(self) -> tuple[F64, F64]:
        t = self.n_tiers
        res = np.zeros((1 + t, *self.shape))
        res[0] = self.kl
        for k in range(t):
            res[1 + k] = np.where(self.tier == k, self.nbytes, 0.0)
        lim = np.concatenate(([self.kl_budget], self.capacity)).astype(np.float64)
        return res, lim

    @cached_property
    def prepared(self) -> _Prepared:
        """The fast solver's view (kept with the problem: solving it again skips this)."""
        return _Prepared(self)

    def evaluate(self, choice: I64) -> tuple[float, F64]:
        """(total cost, per-resource usage) of a choice."""
        rows = np.arange(self.shape[0])
        return float(self.cost[rows, choice].sum()), self.usage(choice)

    def usage(self, choice: I64) -> F64:
        """KL, then bytes per tier, of a choice."""
        rows = np.arange(self.shape[0])
        tb = np.bincount(self.tier[rows, choice], weights=self.nbytes[rows, choice],
                         minlength=self.n_tiers)
        return np.concatenate(([self.kl[rows, choice].sum()], tb[:self.n_tiers]))

    def feasible(self, choice: I64) -> bool:
        lim = np.concatenate(([self.kl_budget], self.capacity))
        c, used = self.evaluate(choice)
        return math.isfinite(c) and bool(_limit_ok(used, lim).all())


@dataclass
class Solution:
    choice: I64
    cost: float
    usage: F64                   # KL, then bytes per tier
    multipliers: F64 = field(default_factory=lambda: np.zeros(0))
    evaluations: int = 0
    nodes: int = 0
    method: str = "fast"
    lower_bound: float = -math.inf   # Lagrangian dual bound: no choice costs less
    converged: bool = True           # the multipliers settled (worth warm-starting from)


class NoFeasibleChoice(Exception):
    """No choice meets every limit (or the search could not find one). ``violated``: the
    resource indices (0 = KL, 1 + t = tier t) still over their limit in the best attempt;
    ``proven``: whether infeasibility is certain (a relaxation already fails)."""

    def __init__(self, violated: list[int], usage: F64, proven: bool) -> None:
        super().__init__(f"no feasible choice (resources {violated} over their limits)")
        self.violated = violated
        self.usage = usage
        self.proven = proven


def relaxation_check(p: Problem) -> None:
    """Raise :class:`NoFeasibleChoice` (proven) when a block has no option, the least KL of
    all blocks exceeds the budget, or their least bytes exceed all free capacity together."""
    finite = np.isfinite(p.cost)
    fits = finite & (p.nbytes <= p.capacity[p.tier] * (1 + _REL_TOL))
    if not fits.any(axis=1).all():
        raise NoFeasibleChoice([-1], np.zeros(0), True)
    min_kl = np.where(fits, p.kl, np.inf).min(axis=1).sum()
    min_b = np.where(fits, p.nbytes, np.inf).min(axis=1).sum()
    usage = np.concatenate(([min_kl], np.full(p.n_tiers, min_b)))
    if min_kl > p.kl_budget * (1 + _REL_TOL) + 1e-12:
        raise NoFeasibleChoice([0], usage, True)
    if min_b > p.capacity.sum() * (1 + _REL_TOL) + 1e-12:
        raise NoFeasibleChoice(list(range(1, 1 + p.n_tiers)), usage, True)


class _Prepared:
    """A problem's tables as the fast solver reads them (computed once per problem, see
    :attr:`Problem.prepared`): options sorted per row by (cost, kl, bytes), so argmin's
    first minimum is the lightest of tied options; options larger than their tier's whole
    free capacity priced out; the per-resource use of every option."""

    def __init__(self, p: Problem) -> None:
        n, m = p.shape
        self.order = np.lexsort((p.nbytes, p.kl, p.cost), axis=-1)
        self.rows = np.arange(n)
        self.offsets = self.rows * m
        flat = (self.offsets[:, None] + self.order).ravel()
        self.lim = np.concatenate(([p.kl_budget], p.capacity)).astype(np.float64)
        self.tier = p.tier.ravel()[flat].reshape(n, m)
        self.nbytes = p.nbytes.ravel()[flat].reshape(n, m).astype(np.float64)
        self.res = np.zeros((len(self.lim), n, m))
        self.res[0] = p.kl.ravel()[flat].reshape(n, m)
        for k in range(p.n_tiers):
            self.res[1 + k] = np.where(self.tier == k, self.nbytes, 0.0)
        self.flat_res = self.res.reshape(len(self.lim), -1)
        over = self.nbytes > self.lim[1:][self.tier] * (1 + _REL_TOL)
        self.cost = np.where(over, np.inf, p.cost.ravel()[flat].reshape(n, m))

    @cached_property
    def scale(self) -> F64:
        """Per resource, the median cost per unit over the blocks (where bracketing starts)."""
        finite = np.isfinite(self.cost)
        c = np.where(finite, self.cost, np.nan)
        span = np.nanmax(c, axis=1) - np.nanmin(c, axis=1)
        scale = np.ones(len(self.lim))
        for k in range(len(self.lim)):
            r = np.where(finite, self.res[k], np.nan)
            rs = np.nanmax(r, axis=1) - np.nanmin(r, axis=1)
            ok = rs > 0
            if ok.any():
                scale[k] = max(float(np.median(span[ok] / rs[ok])), 1e-300)
        return scale


class _Fast:
    def __init__(self, p: Problem) -> None:
        self.p = p
        q = self.prep = p.prepared
        self.order, self.rows, self.offsets, self.lim = q.order, q.rows, q.offsets, q.lim
        self.tier, self.nbytes, self.res, self.flat_res = q.tier, q.nbytes, q.res, q.flat_res
        self.cost = q.cost
        self.evals = 0
        self.best_cost = math.inf
        self.best: I64 | None = None
        self.lower_bound = -math.inf

    @property
    def scale(self) -> F64:
        return self.prep.scale

    def certified(self) -> bool:
        """Whether the best feasible choice met is within ``_CERTIFY`` of the dual bound:
        then no multiplier search can find a better one worth the evaluations."""
        lb = self.lower_bound
        return self.best is not None and self.best_cost <= lb + _CERTIFY * abs(lb)

    def ev(self, mult: F64) -> tuple[I64, F64]:
        """One relaxed evaluation: each block's option minimising cost + mult . resources.
        Tier multipliers enter as one gather (an option uses one tier only)."""
        eff = self.cost
        if mult[0]:
            eff = eff + mult[0] * self.res[0]
        if mult[1:].any():
            eff = eff + np.concatenate((mult[1:], [0.0]))[self.tier] * self.nbytes
        choice = np.argmin(eff, axis=1).astype(np.int64)
        flat = self.offsets + choice
        usage = self.flat_res[:, flat].sum(axis=1)
        self.evals += 1
        lb = float(eff.ravel()[flat].sum() - mult @ self.lim)
        if lb > self.lower_bound:
            self.lower_bound = lb
        if _limit_ok(usage, self.lim).all():
            c = float(self.cost.ravel()[flat].sum())
            if c < self.best_cost:
                self.best_cost, self.best = c, choice
        return choice, usage

    def _ok(self, k: int, usage: F64) -> bool:
        return bool(usage[k] <= self.lim[k] * (1 + _REL_TOL) + 1e-12)

    def bisect(self, mult: F64, k: int, usage: F64, tol: float = _BISECT_TOL
               ) -> tuple[F64, F64]:
        """Smallest multiplier k meeting limit k (given the others), to 0.2 %. From a
        nonzero start (a warm start, or an earlier round) the brackets tried first are that
        value +- 0.15 %, 5 % and 50 %, so an unchanged answer costs one evaluation and a
        nearby one a few, not a full search."""
        m = mult.copy()
        x0 = m[k]
        if self._ok(k, usage):
            if x0 == 0:
                return m, usage
            hi, u_hi = x0, usage
            for step in _WARM_STEPS:
                m[k] = lo = x0 / step
                _, u = self.ev(m)
                if not self._ok(k, u):
                    break
                hi, u_hi = lo, u
            else:
                m[k] = lo = 0.0
                _, u = self.ev(m)
                if self._ok(k, u):
                    return m, u
        else:
            lo = x0
            # Near a warm start first (no scale needed), then growing by x16 up to a cap.
            steps = [x0 * s for s in _WARM_STEPS] if x0 > 0 else []
            for _ in range(60 + len(steps)):
                near = bool(steps)
                hi = steps.pop(0) if near else min(max(lo * 16, self.scale[k]),
                                                   self.scale[k] * 1e18)
                m[k] = hi
                _, u_hi = self.ev(m)
                if self._ok(k, u_hi) or self.certified():
                    break
                if not near and hi >= self.scale[k] * 1e18:
                    return m, u_hi
                lo = hi
            else:
                return m, u_hi
        for _ in range(12):
            if (lo > 0 and hi <= lo * tol) or self.certified():
                break
            mid = _midpoint(lo, hi)
            m[k] = mid
            _, u = self.ev(m)
            if self._ok(k, u):
                hi, u_hi = mid, u
            else:
                lo = mid
        m[k] = hi
        return m, u_hi


def _midpoint(lo: float, hi: float) -> float:
    if lo == 0:
        return hi / 32
    return math.sqrt(lo * hi) if hi > 4 * lo else 0.5 * (lo + hi)


def solve_fast(p: Problem, *, rounds: int = 4, pairs: bool | None = None,
               polish_blocks: int = 12, polish_nodes: int = 20_000,
               start: F64 | None = None, hint: I64 | None = None) -> Solution:
    """Lagrangian relaxation + repair + local improvement (see the module docstring). Puts of
    at most ``polish_blocks`` blocks are then polished by branch and bound seeded with that
    choice, within ``polish_nodes`` nodes (0 turns it off). Warm start (e.g. from
    the previous plan of the same shape): ``start``, multipliers to begin the search from
    (each is bracketed near its start first); ``hint``, a choice that, when feasible and
    cheaper than the best the search met, is improved too (so re-planning the same put never
    does worse than the plan before)."""
    relaxation_check(p)
    if pairs is None:
        pairs = p.shape[0] <= 64
    f = _Fast(p)
    mult = np.zeros(len(f.lim))
    choice, usage = f.ev(mult)
    if f.best is None:
        if start is not None and start.shape == mult.shape and bool(
                np.all(np.isfinite(start) & (start >= 0))) and start.any():
            mult = start.astype(np.float64)
            choice, usage = f.ev(mult)
        # A multiplier is re-searched only when another one changed since its last search.
        seen: dict[int, F64] = {}
        converged = False
        for r in range(rounds):
            before = mult.copy()
            tol = _BISECT_TOL if r or start is not None else 1.05
            for k in range(len(f.lim)):
                others = np.delete(mult, k)
                if (k in seen and np.array_equal(seen[k], others)) or f.certified():
                    continue
                mult, usage = f.bisect(mult, k, usage, tol)
                seen[k] = others
            if f.certified() or (_limit_ok(usage, f.lim).all()
                                 and np.allclose(before, mult, rtol=1e-3)):
                converged = True
                break
            # Multipliers that moved less than the warm bracket in the last round are worth
            # starting from even when the relaxed choice at them is not feasible (repair
            # finishes that plan); ones still moving more are not.
            converged = bool(np.allclose(before, mult, rtol=_WARM_STEPS[1] - 1))
        choice, usage = f.ev(mult)
        starts: list[I64] = [] if f.best is None else [f.best]
        if hint is not None and hint.shape == (p.shape[0],):
            pos = np.argmax(f.order == hint[:, None], axis=1)
            c = float(f.cost[f.rows, pos].sum())
            if c < f.best_cost and _limit_ok(f.flat_res[:, f.offsets + pos].sum(axis=1),
                                             f.lim).all():
                # The hint was improved when it was planned: improving it again is what
                # re-planning costs, and the result is never worse than it.
                starts = [pos]
        if not _limit_ok(usage, f.lim).all():
            repaired = _repair(f, choice)
            if repaired is not None:
                starts.append(repaired)
        if not starts:
            viol = [int(k) for k in np.flatnonzero(~_limit_ok(usage, f.lim))]
            if 0 < p.shape[0] <= polish_blocks and polish_nodes > 0:
                _, ch, nodes, complete = _branch_and_bound(p, math.inf, None, polish_nodes)
                if ch is not None:
                    c, u = p.evaluate(ch)
                    return Solution(ch, c, u, mult, f.evals, nodes, "bb", f.lower_bound)
                if complete:
                    raise NoFeasibleChoice(viol or list(range(len(f.lim))), usage, True)
            raise NoFeasibleChoice(viol or list(range(len(f.lim))), usage, False)
        improved = [_improve(f, s, pairs=pairs) for s in starts]
        choice = min(improved, key=lambda c: float(f.cost[f.rows, c].sum()))
    else:
        choice, converged = f.best, True
    final = np.take_along_axis(f.order, choice[:, None], axis=1)[:, 0].astype(np.int64)
    c, u = p.evaluate(final)
    nodes, method = 0, "lagrangian"
    if 0 < p.shape[0] <= polish_blocks and polish_nodes > 0 and f.evals > 1:
        c2, ch2, nodes, _ = _branch_and_bound(p, c, final, polish_nodes)
        if ch2 is not None and c2 < c:
            final, method = ch2, "lagrangian+bb"
            c, u = p.evaluate(final)
    return Solution(final, c, u, mult, f.evals, nodes, method, f.lower_bound, converged)


def solve_exact(p: Problem, *, max_nodes: int = 5_000_000) -> Solution:
    """Branch and bound over the blocks (cost-ordered options, dominated options dropped,
    bounds from the remaining blocks' least cost, KL and bytes). Raises
    :class:`NoFeasibleChoice` (proven) when nothing is feasible, ``RuntimeError`` past
    ``max_nodes``."""
    relaxation_check(p)
    _, choice, nodes, complete = _branch_and_bound(p, math.inf, None, max_nodes)
    if not complete:
        raise RuntimeError(f"plan_exact: more than {max_nodes} nodes")
    if choice is None:
        _, lim = p.resources()
        raise NoFeasibleChoice(list(range(len(lim))), np.zeros(len(lim)), True)
    c, u = p.evaluate(choice)
    return Solution(choice, c, u, np.zeros(0), 0, nodes, "exact", c)


class _NodeLimit(Exception):
    pass


def _branch_and_bound(p: Problem, best_cost: float, best_choice: I64 | None,
                      max_nodes: int) -> tuple[float, I64 | None, int, bool]:
    """(cost, choice, nodes, complete): the best choice cheaper than ``best_cost`` (else the
    incumbent given), and whether the search finished within ``max_nodes``."""
    n, _ = p.shape
    budget = p.kl_budget * (1 + _REL_TOL) + 1e-12
    cap = [float(c) * (1 + _REL_TOL) + 1e-12 for c in p.capacity]
    opts: list[list[tuple[float, float, int, float, int]]] = []
    for i in range(n):
        row = [(float(p.cost[i, j]), float(p.kl[i, j]), int(p.tier[i, j]),
                float(p.nbytes[i, j]), j) for j in range(p.shape[1])
               if math.isfinite(p.cost[i, j]) and p.nbytes[i, j] <= cap[int(p.tier[i, j])]]
        row.sort()
        kept: list[tuple[float, float, int, float, int]] = []
        for o in row:  # drop options another (no costlier) option beats on every resource
            if not any(q[2] == o[2] and q[1] <= o[1] and q[3] <= o[3] for q in kept):
                kept.append(o)
        opts.append(kept)
    order = sorted(range(n), key=lambda i: -(opts[i][-1][0] - opts[i][0][0]))
    opts = [opts[i] for i in order]
    min_c = [0.0] * (n + 1)
    min_k = [0.0] * (n + 1)
    min_b = [0.0] * (n + 1)
    for d in range(n - 1, -1, -1):
        min_c[d] = min_c[d + 1] + min(o[0] for o in opts[d])
        min_k[d] = min_k[d + 1] + min(o[1] for o in opts[d])
        min_b[d] = min_b[d + 1] + min(o[3] for o in opts[d])
    total_cap = sum(cap)
    best = [best_cost]
    best_pick: list[int] = []
    pick = [0] * n
    used = [0.0] * len(cap)
    nodes = [0]

    def dfs(d: int, c: float, kl: float, used_total: float) -> None:
        nodes[0] += 1
        if nodes[0] > max_nodes:
            raise _NodeLimit
        if d == n:
            if c < best[0]:
                best[0] = c
                best_pick[:] = pick
            return
        rest_c, rest_k, rest_b = min_c[d + 1], min_k[d + 1], min_b[d + 1]
        for oc, ok, ot, ob, j in opts[d]:
            if math.isfinite(best[0]) and c + oc + rest_c >= best[0] - 1e-12 * abs(best[0]):
                break
            if kl + ok + rest_k > budget or used[ot] + ob > cap[ot] \
                    or used_total + ob + rest_b > total_cap:
                continue
            used[ot] += ob
            pick[d] = j
            dfs(d + 1, c + oc, kl + ok, used_total + ob)
            used[ot] -= ob

    complete = True
    try:
        dfs(0, 0.0, 0.0, 0.0)
    except _NodeLimit:
        complete = False
    if not best_pick:
        return best_cost, best_choice, nodes[0], complete
    choice = np.zeros(n, dtype=np.int64)
    for d, i in enumerate(order):
        choice[i] = best_pick[d]
    return best[0], choice, nodes[0], complete
