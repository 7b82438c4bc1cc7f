"""Sweep executors: one CPU-bound sweep on the serial, process and Ray executors, same run.

    .venv/bin/python benchmarks/bench_sweep.py [--repeat 3] [--workers 2] [--trials 40]

The sweep: raw-BER faults x {none, rs(255,239), bch(m=13,t=8)} x bits {16, 4} x 2 BERs
x 2 seeds, reliability and cost (24 short cells: fault campaigns through
the real read path, CPU-bound). Every run writes a fresh results file. Reported per
executor, medians over ``--repeat`` runs:

* wall seconds of ``run_sweep``. The Ray cluster (local) and the process pool are started
  once before the runs, as a cluster or a long-lived pool would be, and their start-up
  (workers importing rkv, numpy and numba) is reported apart; ``process-cold`` is the
  process executor started by ``run_sweep`` itself, start-up included (what one
  ``rkv sweep`` command pays);
* speed-up: serial wall / executor wall (same run);
* per-cell overhead: (workers x wall - the cells' own time) / the cells' own time, the
  cells' own time being the sum of their ``timings.total_s``: what the executor adds (start
  of workers, pickling, scheduling, idle workers at the end), as a fraction of useful work.

Results go to benchmarks/results/sweep.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from rkv.eval.sweep.run import SweepRun, run_sweep
from rkv.eval.sweep.spec import parse_sweep


def bench_sweep(trials: int) -> Any:
    return parse_sweep({
        "sweep": {"name": "bench", "metrics": ["reliability", "cost"], "seeds": [0, 1]},
        "axes": {"preset": ["raw-ber"], "bits": [16, 4],
                 "code": ["none", "rs(255,239)", "bch(m=13,t=8)"],
                 "layout": [{"chunk_tokens": 256}]},
        "params": {"raw-ber": {"ber": [1e-5, 1e-4]}},
        "reliability": {"trials": trials, "blocks": 2, "sampling": "direct"},
        "cost": {"chunks": 2, "repeats": 2},
    })


def once(sweep: Any, executor: Any, workers: int) -> SweepRun:
    with tempfile.TemporaryDirectory(prefix="rkv-bench-sweep-") as d:
        run = run_sweep(sweep, executor=executor, workers=workers, progress=False,
                        results=Path(d) / "r.jsonl")
    assert not run.failed and len(run.ran) == len(sweep.cells)
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--trials", type=int, default=40)
    ap.add_argument("--no-ray", action="store_true")
    ap.add_argument("--out", default="benchmarks/results/sweep.json")
    args = ap.parse_args()
    sweep = bench_sweep(args.trials)
    names = ["serial", "process", "process-cold"] + ([] if args.no_ray else ["ray"])
    from rkv.eval.sweep.executors import ProcessExecutor

    t0 = time.perf_counter()
    pool = ProcessExecutor(args.workers)
    # One 0.5 s task per worker: returns once every worker has imported the cell code.
    list(pool.map(time.sleep, [0.5] * args.workers))
    pool_start_s = time.perf_counter() - t0 - 0.5
    ray_ex = None
    ray_init_s = None
    if "ray" in names:
        from rkv.eval.sweep.executors import RayExecutor

        t0 = time.perf_counter()
        ray_ex = RayExecutor(args.workers)
        ray_init_s = time.perf_counter() - t0
    runs: dict[str, list[SweepRun]] = {n: [] for n in names}
    try:
        once(sweep, "serial", 1)             # warm caches (numba, imports) before timing
        for _ in range(args.repeat):
            for n in names:                   # interleaved: the same load for every executor
                ex: Any = {"ray": ray_ex, "process": pool, "process-cold": "process"}.get(n, n)
                runs[n].append(once(sweep, ex, 1 if n == "serial" else args.workers))
    finally:
        pool.close()
        if ray_ex is not None:
            ray_ex.close()
    serial_wall = statistics.median(r.wall_s for r in runs["serial"])
    table = []
    for n in names:
        walls = [r.wall_s for r in runs[n]]
        workers = runs[n][0].workers
        over = [(workers * r.wall_s - r.cell_s) / r.cell_s for r in runs[n]]
        table.append({
            "executor": n, "workers": workers, "cells": len(sweep.cells),
            "wall_s": statistics.median(walls), "wall_s_all": walls,
            "cell_s": statistics.median(r.cell_s for r in runs[n]),
            "speedup": serial_wall / statistics.median(walls),
            "overhead": statistics.median(over), "overhead_all": over,
        })
    result = {"benchmark": "bench_sweep", "cpus": os.cpu_count(), "repeat": args.repeat,
              "trials": args.trials, "ray_init_s": ray_init_s, "pool_start_s": pool_start_s,
              "load_avg": os.getloadavg(), "table": table}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"{len(sweep.cells)} cells, medians of {args.repeat}; load average "
          f"{os.getloadavg()[0]:.1f}; ray init {ray_init_s or 0:.1f} s, process pool start "
          f"{pool_start_s:.1f} s")
    print(f"{'executor':<12} {'workers':>7} {'wall s':>8} {'cells s':>8} {'speed-up':>9} "
          f"{'overhead':>9}")
    for row in table:
        print(f"{row['executor']:<12} {row['workers']:>7} {row['wall_s']:>8.1f} "
              f"{row['cell_s']:>8.1f} {row['speedup']:>8.2f}x {row['overhead']:>8.1%}")


if __name__ == "__main__":
    main()
