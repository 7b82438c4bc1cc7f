"""Speed and optimality gap of the placement planner (``rkv.placement``).

Usage::

    .venv/bin/python benchmarks/bench_planner.py [--repeat 15] [--workers 2]
                                                 [--json benchmarks/results/planner.json]

The put: SmolLM2-135M (30 layers, 3 KV heads, head_dim 64, float16), 8 chunks of 256 tokens,
K and V as separate blocks: 480 blocks. Options: the engine's default tiers (dram-ddr5 /
cxl / nvme-tlc presets, their bandwidths and latencies) x bits {16, 8, 4, 2} x the seven
default codes = 84 per block. ``predict`` is warmed first (84 calls, in ``--workers``
processes); then the plan is timed ``--repeat`` times (median), and an engine ``put`` of the
same KV (fresh tokens each time, so nothing is deduplicated; default embedded config) is
timed in the same run; ratio = plan / put. The quality profile is synthetic (per bits, K
costlier than V, later layers costlier) until ``rkv calibrate`` produces a measured one; the
KL budget and the DRAM free space are set so both bind.

Gap: (a) against ``plan_exact`` on small puts cut from the same option tables (6 blocks,
budgets from loose to tight); (b) on random option tables (5 blocks, tight budgets), with
and without the bounded branch-and-bound polish; (c) for the 480-block put, the certified
bound from the Lagrangian dual (no plan costs less than the bound).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rkv.placement import (
    BlockInput,
    InfeasiblePlanError,
    PlacementConfig,
    Planner,
    QualityProfile,
    TierInput,
)
from rkv.placement.solver import (
    NoFeasibleChoice,
    Problem,
    solve_exact,
    solve_fast,
)

LAYERS, HEADS, DIM, CHUNKS, CHUNK_TOKENS = 30, 3, 64, 8, 256
BASE_KL = {8: 2e-4, 4: 3e-3, 2: 4e-2}


def profile() -> QualityProfile:
    return QualityProfile({"model": "synthetic", "kl": {
        f"{layer}:{kind}:{bits}": base * (1.5 if kind == "k" else 1.0) * (1 + layer / LAYERS)
        for layer in range(LAYERS) for kind in "kv" for bits, base in BASE_KL.items()}})


def tiers(dram_free: int) -> list[TierInput]:
    return [TierInput("dram", "dram-ddr5", dram_free, 20.0, 0.1),
            TierInput("cxl", "cxl", 8 << 30, 12.0, 0.25),
            TierInput("nvme", "nvme-tlc", 64 << 30, 6.5, 80.0)]


def blocks() -> list[BlockInput]:
    return [BlockInput(layer, kind, c, CHUNK_TOKENS, 24.0, 2.0, HEADS, DIM)
            for c in range(CHUNKS) for layer in range(LAYERS) for kind in "kv"]


def config(kl: float) -> PlacementConfig:
    return PlacementConfig(bits=(16, 8, 4, 2), quality_budget_kl=kl, max_p_due=1e-6,
                           max_p_sdc=1e-15, recompute_us_per_token=50.0,
                           capacity_cost={"dram": 4000.0, "cxl": 1000.0, "nvme": 30.0})


def time_puts(repeat: int) -> list[float]:
    from rkv import Engine, ModelSpec

    model = ModelSpec("HuggingFaceTB/SmolLM2-135M", n_layers=LAYERS, n_kv_heads=HEADS,
                      head_dim=DIM, dtype="float16")
    n = CHUNKS * CHUNK_TOKENS
    rng = np.random.default_rng(0)
    kv = rng.standard_normal((LAYERS, 2, n, HEADS, DIM)).astype(np.float16)
    out = []
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "store"
        try:
            with Engine.open(path) as store:
                for r in range(repeat + 1):
                    tokens = [(r * n + i) % 49000 + 1 for i in range(n)]
                    t = time.perf_counter()
                    store.put(tokens, kv, model=model)
                    if r:  # the first put pays one-off costs (kernels, map growth)
                        out.append(time.perf_counter() - t)
        finally:
            Engine.destroy(path)
    return out


def oracle_small(pl: Planner, tiers_: list[TierInput],
                 bs: list[BlockInput]) -> list[dict[str, Any]]:
    rows = []
    rng = np.random.default_rng(1)
    for trial in range(12):
        pick = [bs[int(i)] for i in rng.choice(len(bs), 6, replace=False)]
        full = pl.problem(pick, tiers_)
        hi = float(full.kl.max(axis=1).sum())
        budget = hi * [0.02, 0.1, 0.3][trial % 3]
        p = Problem(full.cost, full.kl, full.nbytes, full.tier, budget, full.capacity)
        rows.append(_compare(p, f"real-6-{trial}"))
    return rows


def _compare(p: Problem, name: str) -> dict[str, Any]:
    try:
        t = time.perf_counter()
        ex = solve_exact(p)
        t_ex = time.perf_counter() - t
    except NoFeasibleChoice:
        return {"instance": name, "feasible": False}
    row: dict[str, Any] = {"instance": name, "feasible": True, "exact": ex.cost,
                           "exact_ms": 1e3 * t_ex, "nodes": ex.nodes}
    for key, kw in (("fast", {}), ("heuristic", {"polish_nodes": 0})):
        try:
            t = time.perf_counter()
            s = solve_fast(p, **kw)
            row[f"{key}_ms"] = 1e3 * (time.perf_counter() - t)
            row[f"{key}_gap"] = s.cost / ex.cost - 1 if ex.cost > 0 else 0.0
        except NoFeasibleChoice:
            row[f"{key}_gap"] = None
    return row


def oracle_random(n_inst: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(2)
    rows = []
    for k in range(n_inst):
        n, m, t = 5, 5, int(rng.integers(1, 4))
        cost = rng.uniform(0, 10, (n, m))
        kl = rng.uniform(0, 1, (n, m)) * (rng.random((n, m)) < 0.7)
        p = Problem(cost, kl, rng.integers(1, 100, (n, m)).astype(float),
                    rng.integers(0, t, (n, m)), float(rng.uniform(0.2, 1.5)),
                    rng.uniform(60, 200, t))
        rows.append(_compare(p, f"random-{k}"))
    return rows


def _gap_summary(rows: list[dict[str, Any]], key: str) -> dict[str, Any]:
    feas = [r for r in rows if r["feasible"]]
    gaps = [r[f"{key}_gap"] for r in feas]
    found = [g for g in gaps if g is not None]
    return {"instances": len(rows), "feasible": len(feas),
            "missed": sum(g is None for g in gaps),
            "over_5pct": sum(g is None or g > 0.05 for g in gaps),
            "max_gap": max(found) if found else None,
            "mean_gap": statistics.fmean(found) if found else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--put-repeat", type=int, default=5)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--random", type=int, default=300)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    bs = blocks()
    one = BlockInput(0, "k", 0, CHUNK_TOKENS, 24.0, 2.0, HEADS, DIM)
    probe = Planner(config(1.0), profile())
    t = time.perf_counter()
    new = probe.warm(bs, tiers(64 << 20), workers=args.workers)
    warm_s = time.perf_counter() - t
    dram_bytes = probe.plan([one], tiers(1 << 30)).blocks[0].record_bytes
    dram_free = 120 * dram_bytes  # a quarter of the put fits in DRAM at 16 bits
    cases = {}
    for label, kl in (("KL + DRAM bind", 0.15), ("DRAM binds", 1e9)):
        pl = Planner(config(kl), profile())
        try:
            plan = pl.plan(bs, tiers(dram_free))  # first plan builds the templates
        except InfeasiblePlanError as exc:
            print(label, "infeasible:", exc)
            continue
        times = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            plan = pl.plan(bs, tiers(dram_free))
            times.append(time.perf_counter() - t)
        mix: dict[str, int] = {}
        for b in plan.blocks:
            k = f"{b.tier}/{b.bits}/{b.code}"
            mix[k] = mix.get(k, 0) + 1
        cases[label] = {"plan_ms_median": 1e3 * statistics.median(times),
                        "plan_ms_min": 1e3 * min(times), "method": plan.method,
                        "evaluations": plan.extra["evaluations"],
                        "cost_us": plan.total_cost_us, "lower_bound_us": plan.lower_bound_us,
                        "gap_bound": plan.gap_bound, "kl": plan.kl, "binding": plan.binding,
                        "tier_bytes": plan.tier_bytes, "choices": mix}
    puts = time_puts(args.put_repeat)
    put_ms = 1e3 * statistics.median(puts)
    small = oracle_small(probe, tiers(dram_free), bs)
    rnd = oracle_random(args.random)
    result = {
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                    "python": platform.python_version()},
        "blocks": len(bs), "options_per_block": 3 * 4 * 7,
        "predict_warm": {"new": new, "seconds": warm_s, "workers": args.workers},
        "put_ms_median": put_ms, "put_ms": [1e3 * x for x in puts],
        "cases": {k: {**v, "plan_over_put": v["plan_ms_median"] / put_ms}
                  for k, v in cases.items()},
        "oracle_real_6_blocks": {"fast": _gap_summary(small, "fast"),
                                 "heuristic": _gap_summary(small, "heuristic"), "rows": small},
        "oracle_random_5_blocks": {"fast": _gap_summary(rnd, "fast"),
                                   "heuristic": _gap_summary(rnd, "heuristic")},
    }
    print(f"predict warm-up: {new} new predictions in {warm_s:.1f} s ({args.workers} workers)")
    print(f"engine put of the same KV (480 blocks, 2048 tokens): median {put_ms:.1f} ms")
    print("| case | plan ms (median) | plan / put | method | evals | cost us | gap bound "
          "| KL | binding |")
    print("|---|---:|---:|---|---:|---:|---:|---:|---|")
    for k, v in result["cases"].items():
        print(f"| {k} | {v['plan_ms_median']:.2f} | {100 * v['plan_over_put']:.2f} % | "
              f"{v['method']} | {v['evaluations']} | {v['cost_us']:.1f} | "
              f"{100 * v['gap_bound']:.3f} % | {v['kl']:.4f} | {', '.join(v['binding'])} |")
    for k, v in result["cases"].items():
        print(f"{k}: {v['choices']}")
    print("| oracle set | solver | feasible | missed | > 5 % | max gap | mean gap |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name in ("oracle_real_6_blocks", "oracle_random_5_blocks"):
        for solver in ("fast", "heuristic"):
            s = result[name][solver]
            mg = "-" if s["max_gap"] is None else f"{100 * s['max_gap']:.2f} %"
            me = "-" if s["mean_gap"] is None else f"{100 * s['mean_gap']:.3f} %"
            print(f"| {name} | {solver} | {s['feasible']}/{s['instances']} | {s['missed']} | "
                  f"{s['over_5pct']} | {mg} | {me} |")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
