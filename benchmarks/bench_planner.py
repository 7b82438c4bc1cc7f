"""Speed and optimality gap of the placement planner (``rkv.placement``).

Usage::

    .venv/bin/python benchmarks/bench_planner.py [--repeat 15] [--workers 2]
        [--predict-cache P.json] [--json benchmarks/results/planner.json]

(a) The standalone planner. The put: SmolLM2-135M (30 layers, 3 KV heads, head_dim 64,
float16), 8 chunks of 256 tokens, K and V as separate blocks: 480 blocks. Options: the
engine's default tiers (dram-ddr5 / cxl / nvme-tlc presets, their bandwidths and latencies)
x bits {16, 8, 4, 2} x the seven default codes = 84 per block. ``predict`` is warmed first
(in ``--workers`` processes, or read from ``--predict-cache``, which is written when
missing). Per case, ``--repeat`` times each: ``cold``, a new planner's first plan
(templates and option table built; ``predict`` answers cached); ``new shape``, the first
plan of a put shape the planner has not seen (templates known, table built, the search
started from the last plan's multipliers); ``steady``, the same put planned again (cached
table, warm start); ``steady, no warm start``; ``steady, free space varies`` (DRAM free
space within +-10 % from put to put: a new problem each time, cached table and warm start).
Against an engine ``put`` of the same KV timed in the same run (fresh tokens each, default
embedded config: ``dram``, no ECC or quantization). The quality profile is synthetic (per
bits, K costlier than V, later layers costlier); the KL budget and the DRAM free space are
set so both bind.

(b) The engine path: an engine with a ``[placement]`` table (the shipped SmolLM2-135M
profile, bits {16, 8, 4, 2}, the default codes, ``max_p_due`` 1e-5, KL budget 0.02) puts
2048 tokens (8 chunks of 256; 240 ``kv`` blocks, one per layer per chunk, planned for
``dram``) ``--repeat`` times, fresh tokens each; per put, the planning part (the engine's
``EnginePlacement.timing``: from the put's blocks to its pipelines) against the whole put.

Gap: (a) against ``plan_exact`` on small puts cut from the same option tables (6 blocks,
budgets from loose to tight); (b) on random option tables (5 blocks, tight budgets), with
and without the bounded branch-and-bound polish; (c) for the 480-block put, the certified
bound from the Lagrangian dual (no plan costs less than the bound).

Timings are medians with the interquartile range; they never enter a pass/fail test.
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
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rkv.placement import (
    BlockInput,
    InfeasiblePlanError,
    PlacementConfig,
    Planner,
    TierInput,
)
from rkv.placement.options import DEFAULT_CACHE
from rkv.placement.solver import (
    NoFeasibleChoice,
    Problem,
    solve_exact,
    solve_fast,
)
from rkv.profiles import QualityProfile

LAYERS, HEADS, DIM, CHUNKS, CHUNK_TOKENS = 30, 3, 64, 8, 256
BASE_KL = {8: 2e-4, 4: 3e-3, 2: 4e-2}
ENGINE_PLACEMENT = {"max_p_due": 1e-5, "quality_budget_kl": 0.02, "bits": [16, 8, 4, 2],
                    "profile": "smollm2-135m"}


def profile() -> QualityProfile:
    return QualityProfile({"model": "synthetic", "kl": {
        f"{layer}:{kind}:{bits}": base * (1.5 if kind == "k" else 1.0) * (1 + layer / LAYERS)
        for layer in range(LAYERS) for kind in "kv" for bits, base in BASE_KL.items()}})


def tiers(dram_free: int) -> list[TierInput]:
    return [TierInput("dram", "dram-ddr5", dram_free, 20.0, 0.1),
            TierInput("cxl", "cxl", 8 << 30, 12.0, 0.25),
            TierInput("nvme", "nvme-tlc", 64 << 30, 6.5, 80.0)]


def blocks(chunks: int = CHUNKS) -> list[BlockInput]:
    return [BlockInput(layer, kind, c, CHUNK_TOKENS, 24.0, 2.0, HEADS, DIM)
            for c in range(chunks) for layer in range(LAYERS) for kind in "kv"]


def config(kl: float) -> PlacementConfig:
    return PlacementConfig(bits=(16, 8, 4, 2), quality_budget_kl=kl, max_p_due=1e-6,
                           max_p_sdc=1e-15, recompute_us_per_token=50.0,
                           capacity_cost={"dram": 4000.0, "cxl": 1000.0, "nvme": 30.0})


def model() -> Any:
    from rkv import ModelSpec

    return ModelSpec("HuggingFaceTB/SmolLM2-135M", n_layers=LAYERS, n_kv_heads=HEADS,
                     head_dim=DIM, dtype="float16")


def summary(ms: list[float]) -> dict[str, Any]:
    """Median, quartiles and range of a list of milliseconds."""
    q1, _, q3 = statistics.quantiles(ms, n=4) if len(ms) > 1 else (ms[0], 0, ms[0])
    return {"median": statistics.median(ms), "q1": q1, "q3": q3, "min": min(ms),
            "max": max(ms), "n": len(ms)}


def timed(fn: Callable[[], Any], repeat: int,
          before: Callable[[], Any] | None = None) -> tuple[list[float], Any]:
    out, last = [], None
    for _ in range(repeat):
        if before is not None:
            before()
        t = time.perf_counter()
        last = fn()
        out.append(1e3 * (time.perf_counter() - t))
    return out, last


def time_puts(repeat: int, placement: dict[str, Any] | None = None
              ) -> tuple[list[float], list[float], dict[str, Any]]:
    """Whole-put milliseconds and, with placement, the planning part of each put (from the
    engine's EnginePlacement.timing); the first put (one-off costs) is reported apart."""
    from rkv import Engine, EngineConfig

    spec = model()
    n = CHUNKS * CHUNK_TOKENS
    kv = np.random.default_rng(0).standard_normal((LAYERS, 2, n, HEADS, DIM)).astype(
        np.float16)
    cfg = EngineConfig(chunk_tokens=CHUNK_TOKENS, placement=placement or {})
    puts, plans, first = [], [], {}
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "store"
        try:
            with Engine.open(path, cfg) as store:
                ep = store.core.placement          # the engine's placement (None: off)
                for r in range(repeat + 1):
                    tokens = [(r * n + i) % 49000 + 1 for i in range(n)]
                    done = ep.timing["plans"] if ep is not None else 0
                    t = time.perf_counter()
                    store.put(tokens, kv, model=spec)
                    took = 1e3 * (time.perf_counter() - t)
                    plan_ms = 0.0
                    if ep is not None:
                        assert ep.timing["plans"] == done + 1
                        plan_ms = ep.timing["last_plan_us"] / 1e3
                    if r == 0:   # kernels, map growth, the first table of this shape
                        first = {"put_ms": took, "plan_ms": plan_ms}
                    else:
                        puts.append(took)
                        plans.append(plan_ms)
                if ep is not None:
                    first["stats_session"] = store.stats()["session"]
        finally:
            Engine.destroy(path)
    return puts, plans, first


def warm_predict(args: argparse.Namespace) -> dict[str, Any]:
    """Every predict() both parts need, from --predict-cache when it exists."""
    from rkv import EngineConfig
    from rkv.store.plans import EnginePlacement

    cache = args.predict_cache
    if cache is not None and cache.exists():
        DEFAULT_CACHE.add(json.loads(cache.read_text()))
    t = time.perf_counter()
    new = Planner(config(1.0), profile()).warm(blocks(), tiers(64 << 20), workers=args.workers)
    ep = EnginePlacement.for_engine(EngineConfig(chunk_tokens=CHUNK_TOKENS,
                                                 placement=ENGINE_PLACEMENT))
    assert ep is not None
    spec = model()
    new += ep.planner(spec).warm(ep.blocks(spec, [CHUNK_TOKENS] * CHUNKS, CHUNKS),
                                 [ep.tier_input("dram")], workers=args.workers)
    took = time.perf_counter() - t
    if cache is not None and new:
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(DEFAULT_CACHE.entries()))
    return {"new": new, "seconds": took, "workers": args.workers,
            "from_file": str(cache) if cache is not None and cache.exists() else None}


def _other_shape(pl: Planner, other: list[BlockInput], ts: list[TierInput]) -> None:
    """Forget the tables, then plan another shape: the next plan is of a new shape."""
    pl.clear(templates=False)
    pl.plan(other, ts)


def _plan_next(pl: Planner, bs: list[BlockInput], ts: Iterator[list[TierInput]]) -> Any:
    return pl.plan(bs, next(ts))


def standalone(args: argparse.Namespace, dram_free: int) -> dict[str, Any]:
    bs, cases = blocks(), {}
    other = blocks(CHUNKS - 1)       # another put shape, to make the next one new again
    for label, kl in (("KL + DRAM bind", 0.15), ("DRAM binds", 1e9)):
        try:
            Planner(config(kl), profile()).plan(bs, tiers(dram_free))
        except InfeasiblePlanError as exc:
            print(label, "infeasible:", exc)
            continue
        ts = tiers(dram_free)

        def fresh(kl: float = kl, ts: list[TierInput] = ts) -> Any:
            return Planner(config(kl), profile()).plan(bs, ts)

        cold, _ = timed(fresh, args.repeat)
        pl = Planner(config(kl), profile())
        shape, _ = timed(partial(pl.plan, bs, ts), args.repeat,
                         before=partial(_other_shape, pl, other, ts))
        pl.plan(bs, ts)
        steady, plan = timed(partial(pl.plan, bs, ts), args.repeat)
        # DRAM free space moving by up to +-10 % from put to put: a new problem each time,
        # the table and the warm start still reused.
        moving = iter([tiers(int(dram_free * (0.9 + 0.2 * ((7 * i) % 11) / 10)))
                       for i in range(args.repeat)])
        varying, plan_v = timed(partial(_plan_next, pl, bs, moving), args.repeat)
        nows = Planner(config(kl), profile(), warm_start=False)
        nows.plan(bs, ts)
        steady_cold, plan_cold = timed(partial(nows.plan, bs, ts), args.repeat)
        mix: dict[str, int] = {}
        for b in plan.blocks:
            k = f"{b.tier}/{b.bits}/{b.code}"
            mix[k] = mix.get(k, 0) + 1
        cases[label] = {
            "plan_ms": {"cold": summary(cold), "new shape": summary(shape),
                        "steady": summary(steady), "steady, no warm start": summary(steady_cold),
                        "steady, free space varies": summary(varying)},
            "method": plan.method, "evaluations": plan.extra["evaluations"],
            "evaluations_free_space_varies": plan_v.extra["evaluations"],
            "evaluations_no_warm_start": plan_cold.extra["evaluations"],
            "cost_us": plan.total_cost_us, "cost_us_no_warm_start": plan_cold.total_cost_us,
            "lower_bound_us": plan.lower_bound_us, "gap_bound": plan.gap_bound,
            "gap_bound_no_warm_start": plan_cold.gap_bound, "kl": plan.kl,
            "binding": plan.binding, "tier_bytes": plan.tier_bytes, "choices": mix}
    return cases


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
    for key, polish in (("fast", 20_000), ("heuristic", 0)):
        try:
            t = time.perf_counter()
            s = solve_fast(p, polish_nodes=polish)
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
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--random", type=int, default=300)
    ap.add_argument("--predict-cache", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    warm = warm_predict(args)
    bs = blocks()
    probe = Planner(config(1.0), profile())
    one = BlockInput(0, "k", 0, CHUNK_TOKENS, 24.0, 2.0, HEADS, DIM)
    dram_bytes = probe.plan([one], tiers(1 << 30)).blocks[0].record_bytes
    dram_free = 120 * dram_bytes  # a quarter of the put fits in DRAM at 16 bits
    cases = standalone(args, dram_free)
    puts, _, first_put = time_puts(args.repeat)
    put = summary(puts)
    eputs, eplans, efirst = time_puts(args.repeat, ENGINE_PLACEMENT)
    ratios = [p / q for p, q in zip(eplans, eputs, strict=True)]
    engine = {"put_ms": summary(eputs), "plan_ms": summary(eplans),
              "plan_over_put_median": statistics.median(eplans) / statistics.median(eputs),
              "plan_over_put_per_put": summary([100 * r for r in ratios]),
              "first_put": efirst, "placement": ENGINE_PLACEMENT}
    small = oracle_small(probe, tiers(dram_free), bs)
    rnd = oracle_random(args.random)
    for v in cases.values():
        v["plan_over_put"] = {k: s["median"] / put["median"] for k, s in v["plan_ms"].items()}
    result = {
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                    "python": platform.python_version()},
        "blocks": len(bs), "options_per_block": 3 * 4 * 7, "predict_warm": warm,
        "put_ms": put, "first_put": first_put, "cases": cases, "engine": engine,
        "oracle_real_6_blocks": {"fast": _gap_summary(small, "fast"),
                                 "heuristic": _gap_summary(small, "heuristic"), "rows": small},
        "oracle_random_5_blocks": {"fast": _gap_summary(rnd, "fast"),
                                   "heuristic": _gap_summary(rnd, "heuristic")},
    }
    report(result)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1, default=str) + "\n")


def _iqr(s: dict[str, Any]) -> str:
    return f"{s['median']:.2f} ({s['q1']:.2f}-{s['q3']:.2f})"


def report(result: dict[str, Any]) -> None:
    w = result["predict_warm"]
    print(f"predict warm-up: {w['new']} new predictions in {w['seconds']:.1f} s")
    put = result["put_ms"]
    print(f"(a) engine put of the same KV (default config, 2048 tokens): {_iqr(put)} ms "
          f"(median, IQR; n={put['n']})")
    print("| case | plan | plan ms median (IQR) | put ms median | plan / put | evals |")
    print("|---|---|---:|---:|---:|---:|")
    for k, v in result["cases"].items():
        for which, s in v["plan_ms"].items():
            ev = (v["evaluations_no_warm_start"] if "no warm" in which else
                  v["evaluations_free_space_varies"] if "varies" in which else v["evaluations"])
            ev_s = str(ev) if which.startswith("steady") else "-"
            print(f"| {k} | {which} | {_iqr(s)} | {put['median']:.1f} | "
                  f"{100 * v['plan_over_put'][which]:.1f} % | {ev_s} |")
    for k, v in result["cases"].items():
        print(f"{k}: cost {v['cost_us']:.1f} us (no warm start {v['cost_us_no_warm_start']:.1f}),"
              f" gap bound {100 * v['gap_bound']:.3f} % (no warm start "
              f"{100 * v['gap_bound_no_warm_start']:.3f} %), KL {v['kl']:.4f}, binding "
              f"{', '.join(v['binding'])}; {v['choices']}")
    e = result["engine"]
    print(f"(b) engine with [placement], 240 kv blocks per put: put {_iqr(e['put_ms'])} ms, "
          f"planning part {_iqr(e['plan_ms'])} ms, ratio of medians "
          f"{100 * e['plan_over_put_median']:.2f} %, per put {_iqr(e['plan_over_put_per_put'])}"
          f" %; first put {e['first_put']['put_ms']:.1f} ms with "
          f"{e['first_put']['plan_ms']:.1f} ms planning")
    print("| oracle set | solver | feasible | missed | > 5 % | max gap | mean gap |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name in ("oracle_real_6_blocks", "oracle_random_5_blocks"):
        for solver in ("fast", "heuristic"):
            s = result[name][solver]
            mg = "-" if s["max_gap"] is None else f"{100 * s['max_gap']:.2f} %"
            me = "-" if s["mean_gap"] is None else f"{100 * s['mean_gap']:.3f} %"
            print(f"| {name} | {solver} | {s['feasible']}/{s['instances']} | {s['missed']} | "
                  f"{s['over_5pct']} | {mg} | {me} |")


if __name__ == "__main__":
    main()
