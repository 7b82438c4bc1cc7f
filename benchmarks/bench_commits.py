"""Two source trees of rkv through the same engine benchmark, alternating, in one run.

    .venv/bin/python benchmarks/bench_commits.py BEFORE_TREE AFTER_TREE [--runs 3]
        [--bench-args "--repeat 3 --seqs 2 --models smollm2-135m"] [--json out.json]

Each tree is a checkout of rkv (``git worktree add /tmp/before <commit>``). Each run starts
``benchmarks/bench_engine.py`` of that tree in a fresh process with the tree first on
``PYTHONPATH``, so both import their own code; the runs alternate (before, after, before, ...)
so that load on a shared machine falls on both alike. What is compared is each figure the
benchmark reports against raw LMDB *in its own run* (put, get and get out= as ratios to raw,
put_many against puts one at a time, a stream's first layer against a full get): those
ratios, not seconds, are what a code change can move. Reported per figure: the median over
the runs of each tree, every run's value (the spread), and after / before of the medians.
The load average is recorded before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

#: (section, key) of bench_engine's JSON: the same-run ratios it reports.
FIGURES = (("engine", "put_ratio_sliced"), ("engine", "get_ratio"),
           ("engine", "get_into_ratio"), ("put_many", "ratio"),
           ("stream", "first_layer_over_get"))


def figures(result: dict[str, Any]) -> dict[str, float]:
    """The same-run ratios of one bench_engine JSON result, keyed ``section/key[/model]``."""
    out: dict[str, float] = {}
    for section, key in FIGURES:
        rows = result.get(section)
        rows = rows if isinstance(rows, list) else [rows] if isinstance(rows, dict) else []
        for row in rows:
            if isinstance(row, dict) and isinstance(row.get(key), (int, float)):
                label = "/".join(str(row[k]) for k in ("model", "tokens") if k in row)
                out[f"{section}/{key}" + (f"/{label}" if label else "")] = float(row[key])
    return out


def run_once(tree: Path, bench_args: list[str]) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "engine.json"
        env = {**os.environ, "PYTHONPATH": str(tree)}
        cmd = [sys.executable, str(tree / "benchmarks" / "bench_engine.py"), *bench_args,
               "--json", str(out)]
        subprocess.run(cmd, cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL)
        return figures(json.loads(out.read_text()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--bench-args", default="--repeat 3 --seqs 2 --models smollm2-135m")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    for name, tree in trees.items():
        if not (tree / "benchmarks" / "bench_engine.py").exists():
            sys.exit(f"bench_commits: error: {name} tree {tree} has no benchmarks/bench_engine.py")
    bench_args = shlex.split(args.bench_args)
    load_start = os.getloadavg()
    runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    for i in range(args.runs):
        for name, tree in trees.items():
            print(f"run {i + 1}/{args.runs}: {name} ({tree})", file=sys.stderr, flush=True)
            runs[name].append(run_once(tree, bench_args))
    keys = sorted(set().union(*(r.keys() for rs in runs.values() for r in rs)))
    rows = []
    for key in keys:
        vals = {n: [r[key] for r in rs if key in r] for n, rs in runs.items()}
        if not vals["before"] or not vals["after"]:
            continue
        mb, ma = statistics.median(vals["before"]), statistics.median(vals["after"])
        rows.append({"figure": key, "before": vals["before"], "after": vals["after"],
                     "median_before": mb, "median_after": ma, "after_over_before": ma / mb})
    width = max((len(r["figure"]) for r in rows), default=10)
    print(f"{'figure':<{width}}  {'before (runs)':<22}  {'after (runs)':<22}  after/before")
    for r in rows:
        fb = " ".join(f"{v:.2f}" for v in r["before"])
        fa = " ".join(f"{v:.2f}" for v in r["after"])
        print(f"{r['figure']:<{width}}  {fb:<22}  {fa:<22}  {r['after_over_before']:.3f}")
    load_end = os.getloadavg()
    print(f"load average: {load_start[0]:.2f} at start, {load_end[0]:.2f} at end "
          f"({os.cpu_count()} CPUs)")
    if args.json:
        args.json.write_text(json.dumps({"args": {**vars(args), "before": str(args.before),
                                                  "after": str(args.after),
                                                  "json": str(args.json)},
                                         "load": [load_start, load_end], "rows": rows},
                                        indent=2))


if __name__ == "__main__":
    main()
