"""Replay throughput: block references per second through each policy, against a bare LRU loop.

    .venv/bin/python benchmarks/bench_replay.py [--trace PATH] [--capacity 0.05] [--repeat 3]
                                                [--tiers dram=1%,cxl=4%,nvme=20%]
                                                [--json benchmarks/results/replay.json]

Replays the shared Mooncake trace (``rkv.eval.replay.simulate.simulate``: the policy interface, the
protected set, the driver's contract checks) at one capacity for every registered policy plus
Belady and the infinite cache, and times, in the same run, the least a Python LRU costs over
the same references: a bare ``OrderedDict`` loop (no policy object, no protection, no checks).
Reports the median of ``--repeat`` runs of the replay loop alone (parsing and flattening the
trace are not timed) and each policy's speed as a fraction of the bare loop. Then the same for
every registered policy through ``rkv.eval.replay.tiers.simulate_tiers`` on the ``--tiers`` layout
(one policy instance per tier; demotions cascade, lower-tier hits are promoted), whose extra
cost is the policy calls of the moves between tiers. Timings are never asserted anywhere.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import OrderedDict
from collections.abc import Hashable
from pathlib import Path
from typing import Any

from policies import available, make_policy
from policies.belady import Belady, InfiniteCache
from rkv.eval.replay.layout import Layout, parse_layout
from rkv.eval.replay.simulate import CostModel, Trace, parse_capacity, prepare, simulate
from rkv.eval.replay.tiers import Tier, simulate_tiers
from rkv.format.traces import read_trace

DEFAULT_TRACE = (Path(__file__).resolve().parents[2]
                 / "shared/data/traces/mooncake_synthetic_trace.jsonl")


def bare_lru(refs: list[Hashable], blocks: int) -> tuple[int, float]:
    """(hits, seconds) of the plainest LRU over ``refs`` with room for ``blocks`` blocks."""
    cache: OrderedDict[Hashable, None] = OrderedDict()
    move, pop = cache.move_to_end, cache.popitem
    hits = 0
    t0 = time.perf_counter()
    for key in refs:
        if key in cache:
            move(key)
            hits += 1
        else:
            if len(cache) >= blocks:
                pop(last=False)
            cache[key] = None
    return hits, time.perf_counter() - t0


def run_tiers(trace: Trace, layout: Layout, repeat: int) -> list[dict[str, Any]]:
    """Median refs/s of every registered policy on ``layout`` (no look-ahead)."""
    cost = CostModel()
    caps = [t.capacity.resolve(trace, cost) for t in layout.tiers]
    rows = []
    for spec in available():
        secs = []
        hit_ratio = 0.0
        for _ in range(repeat):
            tiers = [Tier(t.name, make_policy(spec, c), c, t.bandwidth, t.latency)
                     for t, c in zip(layout.tiers, caps, strict=True)]
            r = simulate_tiers(trace, tiers, cost, label=spec)
            secs.append(r.seconds)
            hit_ratio = r.hit_ratio
        rows.append({"policy": spec, "refs_per_second": len(trace.refs) / statistics.median(secs),
                     "hit_ratio": hit_ratio})
    return rows


def run(trace: Trace, capacity: str, repeat: int, path: Path) -> dict[str, Any]:
    cost = CostModel()
    nbytes = parse_capacity(capacity).resolve(trace, cost)
    blocks = nbytes // cost.block_bytes
    n = len(trace.refs)
    trace.next_use  # noqa: B018  (computed once, outside the timings)
    base = [bare_lru(trace.refs, blocks) for _ in range(repeat)]
    base_rate = n / statistics.median(s for _, s in base)
    rows: list[dict[str, Any]] = []
    specs = [*available(), "belady", "infinite"]
    for spec in specs:
        secs = []
        hit_ratio = 0.0
        for _ in range(repeat):
            if spec == "belady":
                pol: Any = Belady(nbytes, trace.next_use)
            elif spec == "infinite":
                pol = InfiniteCache(trace.unique * cost.block_bytes)
            else:
                pol = make_policy(spec, nbytes)
            cap = trace.unique * cost.block_bytes if spec == "infinite" else nbytes
            r = simulate(trace, pol, cap, cost, label=spec)
            secs.append(r.seconds)
            hit_ratio = r.hit_ratio
        rate = n / statistics.median(secs)
        rows.append({"policy": spec, "refs_per_second": rate, "vs_bare_lru": rate / base_rate,
                     "hit_ratio": hit_ratio})
    return {
        "trace": os.path.relpath(path, Path(__file__).resolve().parents[1]),
        "references": n, "unique_blocks": trace.unique,
        "capacity": capacity, "capacity_blocks": blocks, "repeat": repeat,
        "bare_lru": {"refs_per_second": base_rate, "hits": base[0][0],
                     "hit_ratio": base[0][0] / n},
        "policies": rows,
        "python": sys.version.split()[0],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--capacity", default="0.05", help="fraction of unique blocks, or bytes")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tiers", default="dram=1%,cxl=4%,nvme=20%",
                    help="a tier layout as in rkv replay --tiers ('' to skip)")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args()
    trace = prepare(read_trace(args.trace))
    res = run(trace, args.capacity, args.repeat, args.trace)
    b = res["bare_lru"]
    print(f"{res['references']} block references, {res['unique_blocks']} unique; capacity "
          f"{args.capacity} = {res['capacity_blocks']} blocks; median of {args.repeat}")
    print(f"{'policy':<10} {'refs/s':>12} {'vs bare LRU':>12} {'block hits':>11}")
    print(f"{'bare LRU':<10} {b['refs_per_second']:>12,.0f} {1:>12.2f} "
          f"{100 * b['hit_ratio']:>10.1f}%")
    for r in res["policies"]:
        print(f"{r['policy']:<10} {r['refs_per_second']:>12,.0f} {r['vs_bare_lru']:>12.2f} "
              f"{100 * r['hit_ratio']:>10.1f}%")
    if args.tiers:
        layout = parse_layout(args.tiers)
        res["tiers"] = {"layout": layout.text, "policies": run_tiers(trace, layout, args.repeat)}
        print(f"\n{layout.text} (promote on hit), median of {args.repeat}")
        print(f"{'policy':<10} {'refs/s':>12} {'block hits':>11}")
        for r in res["tiers"]["policies"]:
            print(f"{r['policy']:<10} {r['refs_per_second']:>12,.0f} "
                  f"{100 * r['hit_ratio']:>10.1f}%")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
