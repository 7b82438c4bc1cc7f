"""Expert caching and prefetch on MoE routing traces (docs/moe.md, "Expert caching and
prefetch: replay").

For a synthetic trace of every preset (:mod:`rkv.moe.presets`; synthetic, seeded) and, with
``--real TRACE``, a routing trace of the MoEfied SmolLM2-135M (weights 4-bit Q4_1;
``rkv moe trace``), replays every policy x prefetch x budget (10/25/50 % of all experts) in
both layouts with the references (LRU without prefetch, Belady without prefetch, Belady +
oracle prefetch, per layout), and
reports per budget the best rows with and without prefetch (least stall): their traffic (over
LRU's) and their gap against both ends (demand-only Belady; Belady + oracle). Prefetch copies
are uncancellable by default (``--cancel-chunk 0``: the old instant cancel).

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
    BELADY,
    DEFAULT_BUDGETS,
    DEFAULT_COMPUTE,
    GLOBAL,
    HINTS,
    NONE,
    ORACLE,
    PER_LAYER,
    MoEResult,
    MoETrace,
    Source,
    gap,
    read_trace,
    run_matrix,
)

POLICIES = ("lru", "lfu", "activation")
PREFETCH = (NONE, "cooccur", "cooccur(min_p=0.3)", HINTS)
REFS = [(pol, pf, lay) for lay in (PER_LAYER, GLOBAL)
        for pol, pf in (("lru", NONE), (BELADY, NONE), (BELADY, ORACLE))]


def _by(results: list[MoEResult]) -> dict[tuple[str, str, str, str], MoEResult]:
    return {(r.policy, r.prefetch, r.layout, r.budget): r for r in results}


def _row(r: MoEResult | None, by: dict[tuple[str, str, str, str], MoEResult]
         ) -> dict[str, Any] | None:
    """A row as the verdict reports it: stall, traffic and the gap against both ends of its
    layout (demand-only Belady, where a prefetching run may exceed 1; Belady + oracle)."""
    if r is None:
        return None
    lru = by.get(("lru", NONE, r.layout, r.budget))
    return {"label": r.label, "stall_ms_per_token": 1e3 * r.stall_per_token,
            "traffic": r.traffic, "precision": r.precision,
            "gap_demand_only": gap(r, lru, by.get((BELADY, NONE, r.layout, r.budget))),
            "gap_prefetch_ref": r.gap_prefetch}


def verdict(results: list[MoEResult]) -> list[dict[str, Any]]:
    """Per budget: the references per layer, and the best rows (least stall) with prefetch
    and without, with their traffic and gaps against both ends."""
    by = _by(results)
    out = []
    for budget in dict.fromkeys(r.budget for r in results):
        rows = [r for r in results if r.budget == budget and r.policy != BELADY]
        with_pf = [r for r in rows if r.prefetch != NONE]
        without = [r for r in rows if r.prefetch == NONE]
        best = min(with_pf, key=lambda r: r.stall, default=None)
        plain = min(without, key=lambda r: r.stall, default=None)
        refs = {}
        for pol, pf, lay in REFS:
            if (r := by.get((pol, pf, lay, budget))) is not None:
                refs[r.label] = 1e3 * r.stall_per_token
        b, n = _row(best, by), _row(plain, by)
        out.append({"budget": budget, "references_ms_per_token": refs,
                    "best_with_prefetch": b, "best_without_prefetch": n,
                    "half_closed_with_prefetch": bool(
                        b and (b["gap_prefetch_ref"] or 0) >= 0.5)})
    return out


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{100 * v:.0f} %"


def _says(row: dict[str, Any] | None) -> str:
    if row is None:
        return "none"
    return (f"{row['label']} {row['stall_ms_per_token']:.2f} ms/token, traffic "
            f"{row['traffic']:.2f}x, gap {_pct(row['gap_demand_only'])} vs demand-only "
            f"Belady, {_pct(row['gap_prefetch_ref'])} vs Belady + oracle")


def run(trace: MoETrace, name: str, source: Source, compute: float,
        cancel_chunk: str | None, interference: float) -> dict[str, Any]:
    t0 = time.perf_counter()
    res = run_matrix(trace, POLICIES, DEFAULT_BUDGETS, PREFETCH, (PER_LAYER, GLOBAL),
                     source=source, compute=compute, cancel_chunk=cancel_chunk,
                     interference=interference)
    v = verdict(res)
    print(f"\n### {name}: {trace.tokens} tokens, {trace.layers} x {trace.experts} experts, "
          f"top-{trace.top_k}, {trace.expert_bytes / 2**20:.1f} MiB per expert "
          f"({time.perf_counter() - t0:.0f} s)\n")
    print(format_table(res, markdown=True))
    for row in v:
        refs = ", ".join(f"{k} {ms:.2f}" for k, ms in row["references_ms_per_token"].items())
        print(f"\n{row['budget']}: references (ms/token) {refs}; best with prefetch "
              f"{_says(row['best_with_prefetch'])}; best without "
              f"{_says(row['best_without_prefetch'])}")
    return {"name": name, "model": trace.model, "tokens": trace.tokens,
            "layers": trace.layers, "experts": trace.experts, "top_k": trace.top_k,
            "expert_bytes": trace.expert_bytes, "hints": trace.hints is not None,
            "seconds": time.perf_counter() - t0,
            "verdict": v, "results": [r.row() for r in res], "_results": res}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=500, help="tokens per synthetic trace")
    ap.add_argument("--real", default=None,
                    help="a routing trace of the MoEfied SmolLM2-135M (4-bit Q4_1 weights)")
    ap.add_argument("--source", default="dram", help="tier misses load from")
    ap.add_argument("--compute-us", type=float, default=DEFAULT_COMPUTE * 1e6)
    ap.add_argument("--cancel-chunk", default=None,
                    help="bytes a dropped prefetch moves to (0: instant)  [default: expert]")
    ap.add_argument("--interference", type=float, default=0.0)
    ap.add_argument("--json", default=None)
    ap.add_argument("--plot", default=None, help="PNG of the plot's preset (below)")
    ap.add_argument("--plot-preset", default="olmoe-1b-7b")
    args = ap.parse_args()
    from rkv.moe.replay import source_tier

    source, compute = source_tier(args.source), args.compute_us * 1e-6
    knobs = (args.cancel_chunk, args.interference)
    t0 = time.perf_counter()
    runs = []
    with tempfile.TemporaryDirectory() as d:
        for shape in PRESETS.values():
            path = synthetic_trace(shape, Path(d) / f"{shape.name}.jsonl", args.tokens)
            runs.append(run(read_trace(path), f"synthetic {shape.name}", source, compute,
                            *knobs))
    if args.real:
        runs.append(run(read_trace(args.real), f"real {Path(args.real).name}", source,
                        compute, *knobs))
    print(f"\n{time.perf_counter() - t0:.0f} s in all")
    if args.plot:
        pick = next(r for r in runs if r["name"].endswith(args.plot_preset))
        shown = [r for r in pick["_results"] if r.layout == PER_LAYER]
        plot(shown, args.plot, title=f"{pick['name']} (synthetic), per-layer caches, "
                                     f"{args.source}, {args.compute_us:g} us/layer")
    if args.json:
        doc = {"source": {"name": source.name, "bandwidth": source.bandwidth,
                          "latency": source.latency},
               "compute_per_layer": compute, "cancel_chunk": args.cancel_chunk or "expert",
               "interference": args.interference, "policies": POLICIES, "prefetch": PREFETCH,
               "budgets": DEFAULT_BUDGETS,
               "runs": [{k: v for k, v in r.items() if k != "_results"} for r in runs]}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
