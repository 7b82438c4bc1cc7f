"""Expert caching and prefetch on MoE routing traces (docs/moe.md, "Expert caching and
prefetch: replay").

For a synthetic trace of every preset (:mod:`rkv.moe.presets`; synthetic, seeded) and, with
``--real TRACE``, a routing trace of the MoEfied SmolLM2 (``rkv moe trace``), replays every
policy x prefetch x budget (10/25/50 % of all experts) in both layouts, with per-layer LRU
without prefetch and per-layer Belady as the ends of the gap, and says whether the best policy
with prefetch closes at least half of that gap at each budget.

    .venv/bin/python benchmarks/bench_moe_replay.py --json benchmarks/results/moe_replay.json \
        --plot docs/img/moe_replay.png
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rkv.cli.moe_replay import format_table, plot
from rkv.moe.presets import PRESETS, synthetic_trace
from rkv.moe.replay import (
    DEFAULT_BUDGETS,
    DEFAULT_COMPUTE,
    GLOBAL,
    HINTS,
    NONE,
    PER_LAYER,
    MoEResult,
    MoETrace,
    Source,
    read_trace,
    run_matrix,
)

POLICIES = ("lru", "lfu", "activation")
PREFETCH = (NONE, "cooccur", "cooccur(min_p=0.3)", HINTS)


def verdict(results: list[MoEResult]) -> list[dict[str, Any]]:
    """Per budget: the best row with prefetch and the best without, by gap closed."""
    out = []
    for budget in dict.fromkeys(r.budget for r in results):
        rows = [r for r in results if r.budget == budget and r.gap_closed is not None
                and r.policy != "belady"]
        with_pf = [r for r in rows if r.prefetch != NONE]
        best = max(with_pf, key=lambda r: r.gap_closed or -1e9, default=None)
        best_any = max(rows, key=lambda r: r.gap_closed or -1e9, default=None)
        out.append({
            "budget": budget,
            "best_with_prefetch": best.label if best else None,
            "gap_closed_with_prefetch": best.gap_closed if best else None,
            "best_overall": best_any.label if best_any else None,
            "gap_closed_overall": best_any.gap_closed if best_any else None,
            "half_closed_with_prefetch": bool(best and (best.gap_closed or 0) >= 0.5)})
    return out


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{100 * v:.0f} %"


def run(trace: MoETrace, name: str, source: Source, compute: float) -> dict[str, Any]:
    t0 = time.perf_counter()
    res = run_matrix(trace, POLICIES, DEFAULT_BUDGETS, PREFETCH, (PER_LAYER, GLOBAL),
                     source=source, compute=compute)
    v = verdict(res)
    print(f"\n### {name}: {trace.tokens} tokens, {trace.layers} x {trace.experts} experts, "
          f"top-{trace.top_k}, {trace.expert_bytes / 2**20:.1f} MiB per expert "
          f"({time.perf_counter() - t0:.0f} s)\n")
    print(format_table(res, markdown=True))
    for row in v:
        print(f"\n{row['budget']}: best with prefetch {row['best_with_prefetch']} closes "
              f"{_pct(row['gap_closed_with_prefetch'])} of the gap; best overall "
              f"{row['best_overall']} ({_pct(row['gap_closed_overall'])})")
    return {"name": name, "model": trace.model, "tokens": trace.tokens,
            "layers": trace.layers, "experts": trace.experts, "top_k": trace.top_k,
            "expert_bytes": trace.expert_bytes, "hints": trace.hints is not None,
            "verdict": v, "results": [r.row() for r in res], "_results": res}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=500, help="tokens per synthetic trace")
    ap.add_argument("--real", default=None, help="a routing trace of the MoEfied SmolLM2")
    ap.add_argument("--source", default="dram", help="tier misses load from")
    ap.add_argument("--compute-us", type=float, default=DEFAULT_COMPUTE * 1e6)
    ap.add_argument("--json", default=None)
    ap.add_argument("--plot", default=None, help="PNG of the plot's preset (below)")
    ap.add_argument("--plot-preset", default="olmoe-1b-7b")
    args = ap.parse_args()
    from rkv.moe.replay import source_tier

    source, compute = source_tier(args.source), args.compute_us * 1e-6
    runs = []
    with tempfile.TemporaryDirectory() as d:
        for shape in PRESETS.values():
            path = synthetic_trace(shape, Path(d) / f"{shape.name}.jsonl", args.tokens)
            runs.append(run(read_trace(path), f"synthetic {shape.name}", source, compute))
    if args.real:
        runs.append(run(read_trace(args.real), f"real {Path(args.real).name}", source,
                        compute))
    if args.plot:
        pick = next(r for r in runs if r["name"].endswith(args.plot_preset))
        shown = [r for r in pick["_results"] if r.layout == PER_LAYER]
        plot(shown, args.plot, title=f"{pick['name']} (synthetic), per-layer caches, "
                                     f"{args.source}, {args.compute_us:g} us/layer")
    if args.json:
        doc = {"source": {"name": source.name, "bandwidth": source.bandwidth,
                          "latency": source.latency},
               "compute_per_layer": compute, "policies": POLICIES, "prefetch": PREFETCH,
               "budgets": DEFAULT_BUDGETS,
               "runs": [{k: v for k, v in r.items() if k != "_results"} for r in runs]}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
