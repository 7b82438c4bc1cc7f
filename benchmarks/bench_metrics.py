"""What a Prometheus scrape of a store costs (rkv.store.metrics): the HTTP scrape of
``Engine.serve_metrics`` against its baseline, a bare ``Engine.stats()`` call measured in the
same run, on stores of a few sizes. ``stats()`` scans the index, so both grow with the
stored chunks; the ratio says what the exporter adds. Prints a markdown table (medians of
--reps runs) and the machine load; docs/metrics.md quotes it.

    .venv/bin/python benchmarks/bench_metrics.py [--sizes 1000,10000] [--reps 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import numpy as np

from rkv import Engine, EngineConfig, ModelSpec, TierConfig

SPEC = ModelSpec("bench/tiny", n_layers=2, n_kv_heads=1, head_dim=4, dtype="float16")


def median_s(fn: Callable[[], object], reps: int) -> float:
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1000,10000")
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args()
    print(f"load before: {os.getloadavg()}", file=sys.stderr)
    rows = []
    for n in (int(x) for x in args.sizes.split(",")):
        with tempfile.TemporaryDirectory() as d:
            tier = TierConfig("disk", medium="disk", path="t/disk", capacity_bytes=1 << 32)
            cfg = EngineConfig(chunk_tokens=16, tiers=(tier,))
            with Engine.open(Path(d) / "s", cfg) as e:
                rng = np.random.default_rng(0)
                for start in range(0, n, 1000):
                    k = min(1000, n - start)
                    toks = rng.integers(0, 1 << 30, 16 * k).tolist()
                    kv = rng.standard_normal((2, 2, 16 * k, 1, 4)).astype(np.float16)
                    e.put(toks, kv, model=SPEC)
                assert e.stats()["chunks"] == n
                with e.serve_metrics() as m:
                    def scrape() -> None:
                        with urllib.request.urlopen(m.url, timeout=60) as r:
                            r.read()
                    scrape()
                    base = median_s(e.stats, args.reps)
                    full = median_s(scrape, args.reps)
        rows.append((n, base, full))
    load = os.getloadavg()
    print("| chunks | stats() median | scrape median | scrape / stats() | scrape per chunk |")
    print("|---:|---:|---:|---:|---:|")
    for n, base, full in rows:
        print(f"| {n} | {base * 1e3:.1f} ms | {full * 1e3:.1f} ms | {full / base:.2f} | "
              f"{full / n * 1e6:.1f} us |")
    print(f"\nload average after (1, 5, 15 min): {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f}; "
          f"{os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
