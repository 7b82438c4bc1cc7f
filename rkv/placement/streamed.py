"""The plan search when the read cost is the stall of a streamed restore.

:mod:`rkv.placement.stall` gives the stall of a placement; it is a maximum over layers, not
a sum over blocks, so the separable solver (:mod:`rkv.placement.solver`) prices a per-block
surrogate instead: how late each block would arrive behind what the previous round queued in
its read queue, against the compute before its layer. :func:`search` re-plans that up to
:data:`ROUNDS` times, keeping the round whose *real* cost is least (expected DUE recompute
and capacity, plus the mean reuse x the stall); then tries the same widths and codes with
every block in any single tier that can hold them (so the plan is never worse than one
tier), and moves blocks between tiers greedily, latest in stream order first, while the real
cost falls (the surrogate does not see how much room a slow tier has before the layers
that need it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np
import numpy.typing as npt

from rkv.placement.config import BlockInput
from rkv.placement.options import Table
from rkv.placement.solver import Problem, Solution, solve_fast
from rkv.placement.stall import (
    lateness,
    layer_rank,
    queued,
    stall_ranked,
    stream_order,
)

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
ROUNDS = 4    # re-plans of the surrogate (each: one solve, one timeline)
#: A put shape planned before starts from its last plan (same widths, so the same KL) and
#: only moves blocks between tiers; every this many warm plans it is solved afresh too, as
#: reuse and recompute costs drift.
RESOLVE_EVERY = 16
PASSES = 2    # greedy passes of tier moves


def search(table: Table, p: Problem, reuse: F64, recompute: F64,
           blocks: Sequence[BlockInput], layer_us: float, parallel: bool
           ) -> tuple[Solution, Problem, float]:
    """(solution, the problem it was solved as, its stall in microseconds) for a put whose
    option table is ``table`` and problem ``p`` (raises
    :class:`~rkv.placement.solver.NoFeasibleChoice` like the solver). ``parallel``: a
    reader per tier (else one queue for all)."""
    n, nt = len(blocks), p.n_tiers
    qt = nt if parallel else 1
    layer = np.fromiter((b.layer for b in blocks), np.int64, n)
    chunk = np.fromiter((b.chunk for b in blocks), np.int64, n)
    order = stream_order(layer, chunk)
    rank = layer_rank(layer)
    slack: F64 = np.asarray(rank * layer_us, np.float64)      # compute before each block
    held: F64 = table.held_cost(recompute)
    rows = np.arange(n)
    mean_reuse = float(reuse.mean())

    def queue_of(tier: I64) -> I64:
        return tier if parallel else np.zeros_like(tier)


    def real(choice: I64) -> tuple[float, float]:
        st = stall_ranked(rank, order, queue_of(table.tier[rows, choice]),
                          table.read_us[rows, choice], qt, layer_us)
        return float(held[rows, choice].sum()) + mean_reuse * st, st

    alts = table.streamed if isinstance(table.streamed, Alternatives) else None
    if alts is None:
        alts = table.streamed = Alternatives(table)
    warm = table.hint is not None and len(table.hint) == n
    queue = (queued(order, queue_of(table.tier[rows, table.hint]),
                    table.read_us[rows, table.hint], qt) if warm and table.hint is not None
             else np.zeros((n, qt)))
    best: tuple[float, Solution, Problem, float] | None = None
    if warm and table.hint is not None:
        # The same put shape was planned before: its plan is a candidate as it is.
        c0, s0 = real(table.hint)
        use = p.usage(table.hint)
        limits = np.concatenate(([p.kl_budget], p.capacity))
        if np.isfinite(c0) and (use <= limits * (1 + 1e-9) + 1e-12).all():
            best = (c0, Solution(table.hint.copy(), c0, p.usage(table.hint)), p, s0)
    alts.warm_plans = alts.warm_plans + 1 if warm else 0
    rounds = ROUNDS if best is None else 1 if alts.warm_plans % RESOLVE_EVERY == 0 else 0
    for _ in range(rounds):
        late: F64 = lateness(table.read_us, queue_of(table.tier), queue, slack)
        prob = replace(p, cost=np.asarray(held + reuse[:, None] * late, np.float64))
        sol = solve_fast(prob, hint=None if best is None else best[1].choice)
        cost, stall = real(sol.choice)
        if best is None or cost < best[0]:
            best = (cost, sol, prob, stall)
        nxt = queued(order, queue_of(table.tier[rows, sol.choice]),
                     table.read_us[rows, sol.choice], qt)
        if np.array_equal(nxt, queue):
            break
        queue = nxt
    assert best is not None
    cost, sol, prob, stall = best
    choice = sol.choice
    # (A warm start that re-solved nothing went through these when its seed was planned.)
    for t in range(nt if rounds else 0):
        one = in_tier(table, alts, choice, t, p.capacity)
        if one is not None and (c := real(one))[0] < cost:
            choice, (cost, stall) = one, c
    if parallel:
        choice, cost, stall = tier_moves(table, p, alts, choice, cost, stall, held, layer,
                                         chunk, mean_reuse, layer_us, qt, queue_of)
    else:
        choice, cost, stall = one_queue_moves(table, p, alts, choice, held, layer, chunk,
                                              mean_reuse, layer_us)
    table.hint = choice
    # Stalls are never negative, so every block's least cost without its read term (KL and
    # capacity ignored) bounds the real cost from below: weak, but valid and cheap.
    bound = float(np.min(held, axis=1).sum())
    sol = replace(sol, choice=choice, usage=prob.usage(choice), cost=cost,
                  lower_bound=min(bound, cost), method="stream")
    return sol, prob, stall


def tier_moves(table: Table, p: Problem, alts: Alternatives,
               choice: I64, cost: float, stall: float, held: F64, layer: I64, chunk: I64,
               mean_reuse: float, layer_us: float, qt: int,
               queue_of: Callable[[I64], I64]) -> tuple[I64, float, float]:
    """Greedy passes, latest blocks in stream order first, moving a block to the same width
    and code in another tier while that lowers the real cost; the KL does not change (same
    widths) and every tier's capacity is kept."""
    n, nt = len(choice), p.n_tiers
    rows = np.arange(n)
    fwd, rank = stream_order(layer, chunk), layer_rank(layer)
    choice = choice.copy()
    used = np.zeros(nt)
    np.add.at(used, table.tier[rows, choice], table.nbytes[rows, choice])
    for _ in range(PASSES):
        moved = False
        for i in fwd[::-1].tolist():
            j = int(choice[i])
            t_from = int(table.tier[i, j])
            for col in alts(i, j):
                t_to = int(table.tier[i, col])
                if used[t_to] + table.nbytes[i, col] > p.capacity[t_to] * (1 + 1e-9):
                    continue
                trial = choice.copy()
                trial[i] = col
                st = stall_ranked(rank, fwd, queue_of(table.tier[rows, trial]),
                                  table.read_us[rows, trial], qt, layer_us)
                c = float(held[rows, trial].sum()) + mean_reuse * st
                if c < cost * (1 - 1e-12):
                    used[t_from] -= table.nbytes[i, j]
                    used[t_to] += table.nbytes[i, col]
                    choice, cost, stall, moved = trial, c, st, True
                    j, t_from = col, t_to
        if not moved:
            break
    return choice, cost, stall


def one_queue_moves(table: Table, p: Problem, alts: Alternatives,
                    choice: I64, held: F64, layer: I64, chunk: I64, mean_reuse: float,
                    layer_us: float) -> tuple[I64, float, float]:
    """:func:`tier_moves` for one reader, in O(1) per candidate move: with one queue the
    read of layer ``l`` ends at ``F_l``, the sum of all reads up to the end of that layer,
    and the stall is ``max(0, max_l (F_l - l x layer_us))``; moving a block of layer ``L``
    shifts every ``F_l`` with ``l >= L`` by the change of its read time. A sweep from the
    last layer down keeps the maximum over the layers above (already shifted) and the
    maximum over the layers below (not shifted by moves above them)."""
    n, nt = len(choice), p.n_tiers
    rows = np.arange(n)
    rank = layer_rank(layer)
    n_layers = int(rank.max()) + 1
    by_layer = [np.flatnonzero(rank == lay) for lay in range(n_layers)]
    choice = choice.copy()
    used = np.zeros(nt)
    np.add.at(used, table.tier[rows, choice], table.nbytes[rows, choice])
    cost = float(held[rows, choice].sum())
    ticks = layer_us * np.arange(n_layers)
    for _ in range(PASSES):
        per = np.zeros(n_layers)
        np.add.at(per, rank, table.read_us[rows, choice])
        late = np.cumsum(per) - ticks                      # F_l - l x layer_us
        below = np.concatenate(([-np.inf], np.maximum.accumulate(late)[:-1]))
        moved = False
        above = -np.inf            # max over the layers above the current one, as shifted
        for lay in range(n_layers - 1, -1, -1):
            v = late[lay]
            for i in by_layer[lay][::-1].tolist():
                j = int(choice[i])
                now = max(0.0, below[lay], max(above, v))
                for col in alts(i, j):
                    t_to = int(table.tier[i, col])
                    if used[t_to] + table.nbytes[i, col] > p.capacity[t_to] * (1 + 1e-9):
                        continue
                    d = float(table.read_us[i, col] - table.read_us[i, j])
                    new = max(0.0, below[lay], max(above, v) + d)
                    gain = float(held[i, col] - held[i, j]) + mean_reuse * (new - now)
                    if gain < -1e-12 * max(1.0, cost):
                        used[int(table.tier[i, j])] -= table.nbytes[i, j]
                        used[t_to] += table.nbytes[i, col]
                        cost += float(held[i, col] - held[i, j])
                        choice[i], j, moved = col, col, True
                        v, above = v + d, above + d
                        now = new
            above = max(above, v)
        if not moved:
            break
    per = np.zeros(n_layers)
    np.add.at(per, rank, table.read_us[rows, choice])
    stall = float(max(0.0, (np.cumsum(per) - ticks).max()))
    return choice, cost + mean_reuse * stall, stall


class Alternatives:
    """``alts(i, j)``: block ``i``'s offered table columns with the same width and code as
    column ``j`` in the other tiers; ``to_tier[c, j, t]``: for a block of template ``c``, the
    column with column ``j``'s width and code in tier ``t`` (-1: none). Built once per
    option table and kept on it."""

    def __init__(self, table: Table) -> None:
        self.table = table
        self.warm_plans = 0       # warm plans of this table since its last cold one
        same = same_option(table)
        nt = int(max(int(t.tier.max()) for t in table.templates)) + 1
        ncol = len(table.cols)
        self.to_tier = np.full((len(table.templates), ncol, nt), -1, np.int64)
        for c, tmpl in enumerate(table.templates):
            for j in range(ncol):
                k = int(table.cols[j])
                self.to_tier[c, j, int(tmpl.tier[k])] = j
                for k2 in same[c].get(k, ()):
                    col = int(np.searchsorted(table.cols, k2))
                    if col < ncol and table.cols[col] == k2:
                        self.to_tier[c, j, int(tmpl.tier[k2])] = col

    def __call__(self, i: int, j: int) -> list[int]:
        t = self.table
        kept = t.kept[i]
        return [int(c) for c in self.to_tier[int(t.cls[i]), j] if c >= 0 and c != j
                and kept[c]]


def in_tier(table: Table, alts: Alternatives, choice: I64, tier: int,
            capacity: F64) -> I64 | None:
    """``choice`` with every block moved to the same width and code in ``tier`` (None: some
    block has no such option offered, or the tier cannot hold them)."""
    rows = np.arange(len(choice))
    out = alts.to_tier[table.cls, choice, tier]
    if (out < 0).any():
        return None
    if not table.kept[rows, out].all():
        return None
    if table.nbytes[rows, out].sum() > capacity[tier] * (1 + 1e-9):
        return None
    return np.asarray(out, np.int64)


def same_option(table: Table) -> list[dict[int, tuple[int, ...]]]:
    """Per template: option -> the options with the same width and code in the other
    tiers."""
    out = []
    for t in table.templates:
        assert t.width is not None
        groups: dict[tuple[int, int], list[int]] = {}
        for j, key in enumerate(zip(t.width.tolist(), t.code.tolist(), strict=True)):
            if t.kept[j]:
                groups.setdefault(key, []).append(j)
        out.append({j: tuple(x for x in g if x != j) for g in groups.values() for j in g})
    return out
