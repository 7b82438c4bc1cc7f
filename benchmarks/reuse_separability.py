"""How well a cache's own features can tell a block that returns from one that does not.

    PYTHONPATH=. .venv/bin/python benchmarks/reuse_separability.py \
        benchmarks/traces/mooncake_conversation_trace.jsonl --bound 5% --bound 10%

``benchmarks/reuse_oracle.py`` shows that knowing *whether* a block returns is worth almost
all of the LRU-Belady gap. This script measures how much of that knowledge the features the
``reuse`` policy learns from carry: for every block reference, the cell of the policy's
features (place from the end of the request, turn, request length, earlier sightings,
parent fan-out; :mod:`policies.reuse`) and whether the block is referenced again. With a
queue of ``L`` requests known (``--queue``), the references that matter are those *not*
re-referenced within the queue (the queue already protects the others): for them, the
share that still return, and the ROC AUC of the best possible cell-level predictor (each
cell's own share of returns, fitted on the whole trace: an optimistic, in-sample bound for
any predictor over these features; 0.5 is a coin, 1.0 perfect). A low AUC where the base
rate is low says no amount of learning over these features closes the gap.

``--bound`` also replays the ``reuse`` policy with its online predictor replaced by that
in-sample table (each cell's share of references that return beyond the queue, from a
first replay that records the cells the policy used), with the queue known: what the policy
would reach if its learning were perfect over the features it has. Slow (two replays per
capacity; about a minute each on the conversation trace).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import numpy as np

from policies.predictor import Cell
from policies.reuse import ReusePredicting
from rkv.eval.replay.simulate import CostModel, parse_capacity, prepare, simulate
from rkv.format.traces import read_trace


def _bucket(n: int, top: int) -> int:
    return min(n.bit_length(), top)


def cells_and_gaps(path: Path, block_tokens: int = 512) -> tuple[list[tuple[int, ...]],
                                                                  np.ndarray]:
    """Per block reference: its feature cell, and the gap in requests to the block's next
    reference (-1: never again)."""
    reqs = [json.loads(line) for line in path.open() if line.strip()]
    cells: list[tuple[int, ...]] = []
    req_of: list[int] = []
    keys: list[int] = []
    seen: Counter[int] = Counter()
    kids: Counter[int] = Counter()
    turn_of: dict[int, int] = {}
    for r, q in enumerate(reqs):
        ids = list(q["hash_ids"])
        n = len(ids)
        partial_last = q.get("input_length", n * block_tokens) % block_tokens != 0
        lead = 0
        while lead < n and seen[ids[lead]] > 0:
            lead += 1
        turn = turn_of.get(ids[lead - 1], 0) + 1 if lead else 0
        for h in ids[lead:]:
            turn_of.setdefault(h, turn)
        for j, h in enumerate(ids):
            if seen[h] == 0 and j:
                kids[ids[j - 1]] += 1
        for j, h in enumerate(ids):
            back = n - 1 - j
            place = (0 if partial_last else 1) if back == 0 else (2 if back == 1 else 3)
            fan = kids[ids[j - 1]] if j else 0
            cells.append((place, min(turn, 6), _bucket(n, 7), min(seen[h], 3),
                          _bucket(fan, 3)))
            req_of.append(r)
            keys.append(h)
            seen[h] += 1
    gaps = np.full(len(keys), -1, dtype=np.int64)
    nxt: dict[int, int] = {}
    for i in range(len(keys) - 1, -1, -1):
        h = keys[i]
        if h in nxt:
            gaps[i] = nxt[h] - req_of[i]
        nxt[h] = req_of[i]
    return cells, gaps


def prefix_gaps(path: Path) -> list[int]:
    """Per block reference (in :func:`cells_and_gaps` order): how long ago, in requests, the
    prefix its request extends was last referenced (log2 bucket, 0 for a request that
    extends nothing): "the time since the prefix was last extended", a candidate
    sixth feature, measured here and not in ``reuse`` (docs/policies.md says why)."""
    out: list[int] = []
    seen: set[int] = set()
    last: dict[int, int] = {}
    for r, q in enumerate(json.loads(line) for line in path.open() if line.strip()):
        ids = list(q["hash_ids"])
        lead = 0
        while lead < len(ids) and ids[lead] in seen:
            lead += 1
        gap = _bucket(r - last[ids[lead - 1]], 12) if lead else 0
        out.extend([gap] * len(ids))
        for h in ids:
            seen.add(h)
            last[h] = r
    return out


def auc(cells: list[tuple[int, ...]], positive: np.ndarray) -> float:
    """ROC AUC of each cell's own positive share as the score (ties count a half)."""
    per: dict[tuple[int, ...], list[int]] = {}
    for c, y in zip(cells, positive.tolist(), strict=True):
        e = per.setdefault(c, [0, 0])
        e[0] += y
        e[1] += 1
    groups = sorted(((p / t, p, t - p) for p, t in per.values()))
    pos_total = sum(g[1] for g in groups)
    neg_total = sum(g[2] for g in groups)
    if not pos_total or not neg_total:
        return float("nan")
    below = 0.0        # negatives with a lower score than the current group
    win = 0.0
    i = 0
    while i < len(groups):
        j, p, nn = i, 0, 0
        while j < len(groups) and groups[j][0] == groups[i][0]:
            p += groups[j][1]
            nn += groups[j][2]
            j += 1
        win += p * (below + 0.5 * nn)
        below += nn
        i = j
    return win / (pos_total * neg_total)


class _Recorder:
    """Stands in for the policy's predictor: records (key, cell, request) of every
    observation and answers ``p`` from ``table`` (or 0.3, the predictor's prior)."""

    def __init__(self, table: dict[Cell, float] | None = None) -> None:
        self.seen: list[tuple[object, Cell, float]] = []
        self.table = table or {}
        self.horizon = 1.0

    def observe(self, key: object, cell: Cell, now: float) -> None:
        self.seen.append((key, cell, now))

    def p(self, cell: Cell, now: float) -> float:
        return self.table.get(cell, 0.3)


def _table(seen: list[tuple[object, Cell, float]], queue: int) -> dict[Cell, float]:
    """Each cell's share of observations whose key returns later than ``queue`` requests
    (observations whose key returns within the queue are left out: the queue covers them)."""
    nxt: dict[object, float] = {}
    per: dict[Cell, list[int]] = {}
    for key, cell, now in reversed(seen):
        later = nxt.get(key)
        nxt[key] = now
        if later is not None and later - now <= queue:
            continue
        e = per.setdefault(cell, [0, 0])
        e[0] += later is not None
        e[1] += 1
    return {c: p / t for c, (p, t) in per.items()}


def bound(path: Path, capacity: str, queue: int) -> tuple[float, float]:
    """(reuse as shipped, reuse with the in-sample table): prefix-token hit %, queue known."""
    cost = CostModel()
    trace = prepare(read_trace(path), cost)
    cap = parse_capacity(capacity).resolve(trace, cost)
    shipped = simulate(trace, ReusePredicting(cap), cap, cost, lookahead=queue)
    first = ReusePredicting(cap)
    rec = _Recorder()
    first.predictor = rec  # type: ignore[assignment]
    simulate(trace, first, cap, cost, lookahead=queue)
    told = ReusePredicting(cap)
    told.predictor = _Recorder(_table(rec.seen, queue))  # type: ignore[assignment]
    best = simulate(trace, told, cap, cost, lookahead=queue)
    return 100 * shipped.prefix_token_hit_ratio, 100 * best.prefix_token_hit_ratio


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("traces", nargs="+", type=Path)
    ap.add_argument("--queue", type=int, action="append", default=None,
                    help="queue lengths known (requests; default 0 and 256)")
    ap.add_argument("--bound", action="append", metavar="CAPACITY",
                    help="also replay reuse with the in-sample table at this capacity "
                         "(e.g. 5%%; repeatable)")
    args = ap.parse_args()
    queues = args.queue or [0, 256]
    print("| trace | queue | references that matter | of them return | AUC, all features "
          "| AUC, place + turn only | AUC, all + prefix gap |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for path in args.traces:
        cells, gaps = cells_and_gaps(path)
        extra = prefix_gaps(path)
        for q in queues:
            keep = ~((gaps >= 0) & (gaps <= q)) if q else np.ones(len(gaps), bool)
            kept = keep.tolist()
            sub = [c for c, k in zip(cells, kept, strict=True) if k]
            wider = [(*c, g) for c, g, k in zip(cells, extra, kept, strict=True) if k]
            pos = (gaps[keep] >= 0).astype(np.int64)
            coarse = [c[:2] for c in sub]
            print(f"| {path.name} | {q} | {int(keep.sum()):,} | {pos.mean():.1%} | "
                  f"{auc(sub, pos):.3f} | {auc(coarse, pos):.3f} | {auc(wider, pos):.3f} |")
    if not args.bound:
        return
    print()
    print("| trace | queue | capacity | reuse (online) | reuse told its cells' in-sample "
          "shares |")
    print("|---|---:|---:|---:|---:|")
    for path in args.traces:
        for q in queues:
            for c in args.bound:
                online, best = bound(path, c, q)
                print(f"| {path.name} | {q} | {c} | {online:.1f} | {best:.1f} |", flush=True)


if __name__ == "__main__":
    main()
