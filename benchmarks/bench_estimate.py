"""How well ReuseEstimator predicts a block's reads and stay on the Mooncake trace.

    .venv/bin/python benchmarks/bench_estimate.py [--trace PATH] [--policy lru ...]
                                                  [--capacity 0.05 ...] [--windows 10]
                                                  [--json benchmarks/results/estimate.json]

Replays the trace through one cache (a policy spec, a capacity as a fraction of the unique
blocks, 512-token blocks as ``rkv replay`` does: a miss is inserted, evicting the policy's
victims, this request's blocks protected) with the trace's timestamps as ``now`` (seconds),
and feeds the same events to three predictors:

* ``depth``: :class:`policies.estimate.ReuseEstimator`, the engine's default (depth buckets
  0, 1, 2-3, 4-7, 8+; decay 1/256; trusted from 32 departures);
* ``global``: the same estimator with one bucket (a global running mean);
* ``config``: the engine's config defaults (reuse 1.0, residency 24 h).

Each stay of a block (insert to eviction) is one observation: what each predictor said when
the block was inserted (untrusted: the config value, counted), against the hits the block
then got and how long it stayed. Stays still in the cache when the trace ends are censored:
left out of the comparison (their number is reported).

Reported per depth bucket (and all): the realised mean reads per stay; per predictor the
*calibration error* of the mean, over ``--windows`` equal spans of insert time: per window
|mean predicted / mean realised - 1|, then the median and 90th percentile over the windows
(what the planner's expected read cost rests on), next to the *noise* of a window's realised
mean (its median relative standard error: errors below it cannot be told from chance); and
the per-stay RMSE of reads (dominated by the spread of reads among blocks, which no mean can
predict). The same for the stay (residency) in seconds. Windows with fewer than 20 stays of
a bucket are skipped.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Hashable
from pathlib import Path
from typing import Any

from policies import Item, Reason, ReuseEstimator, make_admission, make_policy, split_spec
from policies.base import checked_victims
from rkv.format.traces import read_trace

DEFAULT_TRACE = (Path(__file__).resolve().parents[2]
                 / "shared/data/traces/mooncake_synthetic_trace.jsonl")
CONFIG_REUSE, CONFIG_RESIDENCY_S = 1.0, 24 * 3600.0
PREDICTORS = ("depth", "global", "config")


def replay(requests: list[Any], spec: str, capacity: int, labels: list[str],
           decay: float = 1 / 256) -> tuple[list[dict[str, Any]], int]:
    """Every completed stay: bucket, insert time, predictions, realised reads and stay."""
    evict, admit = split_spec(spec)
    policy = make_policy(evict, capacity)
    admission = make_admission(admit)
    depth_est = ReuseEstimator(decay=decay)
    global_est = ReuseEstimator(buckets=(0,), decay=decay)
    ests = (depth_est, global_est)
    items: dict[Hashable, Item] = {}
    alive: dict[Hashable, dict[str, Any]] = {}
    stays: list[dict[str, Any]] = []
    for req in requests:
        now = req.timestamp
        protected: set[Hashable] = set()
        parent: Hashable = None
        for j, key in enumerate(req.blocks):
            item = items.get(key)
            if item is None:
                item = items[key] = Item(key, size=1, depth=j, parent=parent)
            parent = key
            if key in policy:
                policy.on_access(key, True, now)
                admission.on_access(key, True, now)
                for est in ests:
                    est.on_access(key, True, now)
                alive[key]["hits"] += 1
                protected.add(key)
                continue
            policy.on_access(key, False, now, item)
            admission.on_access(key, False, now)
            need = policy.used + 1 - capacity
            if need > 0:
                if not admission.admit(item, now):
                    protected.add(key)
                    continue
                out = checked_victims(policy, need, protected)
                if out is None:
                    protected.add(key)
                    continue
                for v in out:
                    policy.on_remove(v, Reason.EVICTED)
                    for est in ests:
                        est.on_remove(v, Reason.EVICTED, now)
                    stay = alive.pop(v)
                    stay["stay"] = now - stay["t"]
                    stays.append(stay)
            pred: dict[str, Any] = {}
            for name, est in zip(PREDICTORS, ests, strict=False):
                e = est.estimate("", item.depth, now)
                pred[name] = (None, None) if e is None else (e.reuse, e.residency)
            alive[key] = {"bucket": labels[depth_est.bucket(item.depth)], "t": now,
                          "hits": 0, "pred": pred}
            policy.on_insert(item, now)
            for est in ests:
                est.on_insert(item, now)
            protected.add(key)
    return stays, len(alive)


def _value(stay: dict[str, Any], name: str, which: int) -> float:
    if name == "config":
        return CONFIG_REUSE if which == 0 else CONFIG_RESIDENCY_S
    got = stay["pred"][name][which]
    if got is None:
        return CONFIG_REUSE if which == 0 else CONFIG_RESIDENCY_S
    return float(got)


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))]


def evaluate(stays: list[dict[str, Any]], t0: float, t1: float, windows: int
             ) -> dict[str, Any]:
    """Calibration (per window) and per-stay RMSE of each predictor, reads and stay."""
    out: dict[str, Any] = {"stays": len(stays)}
    if not stays:
        return out
    out["realised_reuse"] = statistics.fmean(s["hits"] for s in stays)
    out["realised_stay_s"] = statistics.fmean(s["stay"] for s in stays)
    span = (t1 - t0) / windows or 1.0
    by_window: dict[int, list[dict[str, Any]]] = {}
    for s in stays:
        by_window.setdefault(min(windows - 1, int((s["t"] - t0) / span)), []).append(s)
    for which, metric, real in ((0, "reuse", "hits"), (1, "stay_s", "stay")):
        noise = []
        for group in by_window.values():
            xs = [g[real] for g in group]
            m = statistics.fmean(xs)
            if len(group) >= 20 and m > 0:
                noise.append(statistics.stdev(xs) / math.sqrt(len(xs)) / m)
        if noise:
            out[f"{metric}:noise"] = statistics.median(noise)
        for name in PREDICTORS:
            errs = []
            for group in by_window.values():
                if len(group) < 20:
                    continue          # a window with few stays says little
                r = statistics.fmean(g[real] for g in group)
                p = statistics.fmean(_value(g, name, which) for g in group)
                if r > 0:
                    errs.append(abs(p / r - 1.0))
            rmse = math.sqrt(statistics.fmean((_value(s, name, which) - s[real]) ** 2
                                              for s in stays))
            row = {"rmse": rmse, "mean_predicted": statistics.fmean(_value(s, name, which)
                                                                    for s in stays)}
            if errs:
                row.update(calib_median=statistics.median(errs), calib_p90=_pct(errs, 0.9),
                           windows=len(errs))
            out[f"{metric}:{name}"] = row
        if which == 0:
            out["untrusted"] = {n: sum(s["pred"][n][0] is None for s in stays)
                                for n in PREDICTORS if n != "config"}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", default=str(DEFAULT_TRACE))
    ap.add_argument("--policy", action="append")
    ap.add_argument("--capacity", action="append", type=float)
    ap.add_argument("--windows", type=int, default=10)
    ap.add_argument("--decay", type=float, default=1 / 256)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    policies = args.policy or ["lru", "prefix+after(n=2)"]
    capacities = args.capacity or [0.01, 0.05, 0.10]
    requests = list(read_trace(args.trace))
    unique = len({b for r in requests for b in r.blocks})
    t0, t1 = requests[0].timestamp, requests[-1].timestamp
    labels = [ReuseEstimator().label(i) for i in range(5)]
    results = []
    for spec in policies:
        for frac in capacities:
            cap = max(1, round(frac * unique))
            started = time.perf_counter()
            stays, censored = replay(requests, spec, cap, labels, args.decay)
            took = time.perf_counter() - started
            rows = {"all": evaluate(stays, t0, t1, args.windows)}
            for label in labels:
                rows[label] = evaluate([s for s in stays if s["bucket"] == label], t0, t1,
                                       args.windows)
            results.append({"policy": spec, "capacity": frac, "blocks": cap,
                            "censored": censored, "seconds": round(took, 2), "rows": rows})
            print(f"\n{spec} at {frac:.0%} ({cap} blocks): {len(stays)} stays, "
                  f"{censored} censored, {took:.1f} s")
            print("| depth | stays | reads/stay | noise | calib. err. depth (med / p90) | "
                  "global | config | RMSE depth / global | stay s | noise | calib. err. "
                  "depth | global |")
            print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
            for label, r in rows.items():
                if r["stays"] == 0:
                    continue

                def c(key: str, r: dict[str, Any] = r) -> str:
                    x = r.get(key, {})
                    if "calib_median" not in x:
                        return "-"
                    return f"{100 * x['calib_median']:.0f} / {100 * x['calib_p90']:.0f} %"

                def n(key: str, r: dict[str, Any] = r) -> str:
                    return f"{100 * r[key]:.0f} %" if key in r else "-"

                print(f"| {label} | {r['stays']} | {r['realised_reuse']:.2f} | "
                      f"{n('reuse:noise')} | {c('reuse:depth')} | {c('reuse:global')} | "
                      f"{c('reuse:config')} | {r['reuse:depth']['rmse']:.2f} / "
                      f"{r['reuse:global']['rmse']:.2f} | {r['realised_stay_s']:.0f} | "
                      f"{n('stay_s:noise')} | {c('stay_s:depth')} | {c('stay_s:global')} |")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"trace": Path(args.trace).name, "requests": len(requests), "unique": unique,
             "windows": args.windows, "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
