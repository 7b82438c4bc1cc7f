"""The command-line side of ``rkv replay``: the output (Markdown or text matrices, JSON, the
hit-ratio plot) and the command's driver. Tier layouts and prefetch budgets as written on the
command line are parsed in :mod:`rkv.eval.replay.layout`.

Kept apart from the simulations (:mod:`rkv.eval.replay.simulate`,
:mod:`rkv.eval.replay.tiers`) so that each module stays small.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from policies import PolicyError, available
from rkv.errors import ConfigError, InputError
from rkv.eval.replay.layout import Layout, budget_bytes, parse_budget, parse_layout
from rkv.eval.replay.queue import Lookahead, parse_lookahead, queue_lengths
from rkv.eval.replay.simulate import (
    BELADY,
    DEFAULT_CAPACITIES,
    DEFAULT_RECOMPUTE_TPS,
    INFINITE,
    SMOLLM2_BLOCK_BYTES,
    Capacity,
    CostModel,
    Result,
    Trace,
    parse_capacity,
    prepare,
)
from rkv.eval.replay.tiers import replay_all
from rkv.format.traces import read_trace
from rkv.ui import Column, Progress, check_format, human_bytes, render

log = logging.getLogger(__name__)


# -- tier layouts ---------------------------------------------------------------------------------
def describe_layout(layout: Layout, trace: Trace, cost: CostModel, promote: str = "hit",
                    budget: Capacity | None = None) -> str:
    """One line for the command's header: each tier's size and figures, the options."""
    caps = [t.capacity.resolve(trace, cost) for t in layout.tiers]
    tiers = ", ".join(f"{t.name} {c // cost.block_bytes} blocks ({human_bytes(c)}) "
                      f"{t.bandwidth / 1e9:g} GB/s + {t.latency * 1e6:g} us"
                      for t, c in zip(layout.tiers, caps, strict=True))
    b = budget_bytes(budget, caps[0])
    pf = human_bytes(max(caps[0] // 4, cost.block_bytes) if b is None else b)
    return (f"tiers {layout.text}: {tiers}; promote on {promote}; with a look-ahead, "
            f"prefetch up to {pf} per request")


# -- output ---------------------------------------------------------------------------------------

_METRICS: list[tuple[str, Callable[[Result], float], str]] = [
    ("prefix-token hit %", lambda r: 100 * r.prefix_token_hit_ratio, "{:.1f}"),
    ("block hit %", lambda r: 100 * r.hit_ratio, "{:.1f}"),
    ("TTFT mean (s)", lambda r: r.ttft_mean, "{:.2f}"),
    ("TTFT p50 (s)", lambda r: r.ttft_p50, "{:.2f}"),
    ("TTFT p99 (s)", lambda r: r.ttft_p99, "{:.2f}"),
]
_GIB = float(1 << 30)


def _column(r: Result) -> str:
    """A capacity as a percentage or bytes; a tier layout (``dram=1%,nvme=20%``) as given."""
    try:
        fraction = parse_capacity(r.capacity).fraction
    except ConfigError:
        return r.capacity
    return f"{100 * fraction:g}%" if fraction is not None else human_bytes(r.capacity_bytes)


def _matrix(title: str, rows: list[str], cols: list[str], cell: dict[tuple[str, str], str],
            fmt: str) -> str:
    """One metric: a row per policy, a column per capacity or layout (``fmt``: text or
    markdown, through :mod:`rkv.ui.tables`)."""
    columns = [Column("_row", title), *(Column(c, align="right") for c in cols)]
    data = [{"_row": p, **{c: cell.get((p, c), "") for c in cols}} for p in rows]
    return render(data, columns, fmt=fmt).rstrip("\n")


def format_table(results: Sequence[Result], *, markdown: bool = False,
                 fmt: str | None = None) -> str:
    """One matrix per metric (policies down, capacities or tier layouts across); then, for each
    layout of several tiers, block hits per tier and the bytes moved into and out of each.
    ``fmt``: ``text`` (default), ``markdown`` (also ``markdown=True``), or ``json``/``csv``:
    one flat row per result (policy, capacity, the metrics, per-tier hits and moves)."""
    fmt = check_format(fmt or ("markdown" if markdown else "text"))
    if fmt in ("json", "csv"):
        return render([_flat(r) for r in results], fmt=fmt)
    cols: list[str] = []
    rows: list[str] = []
    by: dict[tuple[str, str], Result] = {}
    for r in results:
        c = _column(r)
        if c not in cols:
            cols.append(c)
        if r.policy not in rows:
            rows.append(r.policy)
        by[r.policy, c] = r
    blocks = [_matrix(title, rows, cols, {k: f.format(get(r)) for k, r in by.items()}, fmt)
              for title, get, f in _METRICS]
    for c in cols:
        tiered = [(p, by[p, c]) for p in rows if (p, c) in by and len(by[p, c].tiers) > 1]
        if not tiered:
            continue
        names = [t.name for t in tiered[0][1].tiers]
        hits = {(p, t.name): f"{100 * t.hits / r.references if r.references else 0:.1f}"
                for p, r in tiered for t in r.tiers}
        moved = {(p, t.name): f"{t.moved_in / _GIB:.0f} / {t.moved_out / _GIB:.0f}"
                 for p, r in tiered for t in r.tiers}
        prow = [p for p, _ in tiered]
        blocks.append(_matrix(f"block hits % by tier, {c}", prow, names, hits, fmt))
        blocks.append(_matrix(f"GiB moved in / out, {c}", prow, names, moved, fmt))
    return "\n\n".join(blocks)


def _flat(r: Result) -> dict[str, Any]:
    row: dict[str, Any] = {"policy": r.policy, "capacity": _column(r),
                           "capacity_bytes": r.capacity_bytes}
    for title, get, _ in _METRICS:
        row[title] = get(r)
    if len(r.tiers) > 1:
        for t in r.tiers:
            row[f"{t.name} hits"] = t.hits
            row[f"{t.name} bytes in"] = t.moved_in
            row[f"{t.name} bytes out"] = t.moved_out
    return row


def to_json(results: Sequence[Result], trace: Trace, cost: CostModel,
            meta: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        **(meta or {}),
        "requests": trace.requests,
        "references": len(trace.refs),
        "unique_blocks": trace.unique,
        "cost_model": asdict(cost),
        "results": [r.row() for r in results],
    }


def plot(results: Sequence[Result], path: str | Path, title: str = "") -> None:
    """Prefix-token hit ratio against capacity, one line per policy (PNG)."""
    try:
        import matplotlib
    except ImportError as exc:  # pragma: no cover - matplotlib is a test dependency
        raise ConfigError("--plot needs matplotlib (pip install 'rkv[plots]')") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[str, list[tuple[float, float]]] = {}
    for r in results:   # a layout of several tiers is placed at its total size
        name = f"{r.policy} ({len(r.tiers)} tiers)" if len(r.tiers) > 1 else r.policy
        series.setdefault(name, []).append((100 * r.capacity_fraction,
                                            100 * r.prefix_token_hit_ratio))
    fig, ax = plt.subplots(figsize=(8.5, 4.8), dpi=120)
    cmap = plt.get_cmap("tab20")    # distinct colours for up to 20 policies
    colors = iter(cmap(i) for i in range(20))
    try:
        for name, pts in series.items():
            pts.sort()
            xs, ys = [p[0] for p in pts], [p[1] for p in pts]
            if name == BELADY:
                ax.plot(xs, ys, "k--", marker="s", ms=4, lw=2,
                        label="Belady MIN (offline; block-hit optimum)")
            elif name == INFINITE:
                ax.plot(xs, ys, ":", color="gray", lw=2, label="infinite cache")
            else:
                ax.plot(xs, ys, marker="o", ms=3, lw=1.3, label=name,
                        color=next(colors, None))
        ax.set_xscale("log")
        ticks = sorted({x for pts in series.values() for x, _ in pts})
        ax.set_xticks(ticks, [f"{float(f'{x:.2g}'):g}" for x in ticks])
        ax.minorticks_off()
        ax.set_ylim(bottom=0)
        ax.set_xlabel("capacity (% of the trace's unique blocks, log scale)")
        ax.set_ylabel("prefix-token hit ratio (%)")
        ax.set_title(title or "prefix-token hit ratio vs capacity")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
        fig.tight_layout()
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        try:
            fig.savefig(path)
        except ValueError as exc:   # e.g. an extension matplotlib cannot write
            raise ConfigError(f"cannot write the plot {path}: {exc}") from exc
    finally:
        plt.close(fig)


def _write_json(args: Any, results: Sequence[Result], trace: Trace, cost: CostModel,
                layouts: list[Layout], promote: str, budget: Capacity | None) -> None:
    if args.json:
        doc = to_json(results, trace, cost, {
            "trace": str(args.trace), "format": args.format, "limit": args.limit,
            "layouts": [lay.text for lay in layouts], "promote": promote,
            "prefetch_budget": None if budget is None else budget.text})
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")


def cli_replay(args: Any) -> int:
    """``rkv replay``: the command line's driver (arguments parsed by :mod:`rkv.cli`)."""
    if args.limit is not None and args.limit < 1:
        raise InputError(f"--limit must be at least 1, got {args.limit}")
    if not args.tiers and (args.promote or args.prefetch_budget or args.prefetch_policy):
        raise ConfigError("--promote and --prefetch-* apply to --tiers layouts")
    if args.store and args.tiers:
        raise ConfigError("--store replays one tier: use --capacity, not --tiers")
    try:
        lookaheads = [parse_lookahead(text) for text in args.lookahead] or [Lookahead()]
    except ConfigError as exc:
        raise ConfigError(f"--lookahead: {exc}") from None
    cost = CostModel(
        block_bytes=SMOLLM2_BLOCK_BYTES if args.block_bytes is None else args.block_bytes,
        bandwidth=args.bandwidth * 1e9, latency=args.latency * 1e-6,
        recompute_tps=DEFAULT_RECOMPUTE_TPS if args.recompute_tps is None else args.recompute_tps)
    layouts = [parse_layout(t) for t in args.tiers]
    capacities = [parse_capacity(c) for c in
                  (args.capacity or ([] if layouts else DEFAULT_CAPACITIES))]
    budget = None if args.prefetch_budget is None else parse_budget(args.prefetch_budget)
    promote = args.promote or "hit"
    if promote not in ("hit", "never"):
        raise ConfigError(f"--promote must be hit or never, got {promote!r}")
    specs = args.policy or available()
    trace = prepare(read_trace(args.trace, args.format, args.limit), cost)
    fmt = check_format(getattr(args, "fmt", None) or (
        "markdown" if args.markdown else "text"))
    with Progress("replay", None, unit="run", quiet=bool(args.quiet)) as bar:
        def progress(msg: str) -> None:
            bar.update(note=msg)

        try:
            results = replay_all(trace, specs, capacities, layouts, cost, progress=progress,
                                 lookaheads=lookaheads, promote=promote,
                                 prefetch_budget=budget,
                                 prefetch_policy=args.prefetch_policy or "queue")
            if args.store:
                from rkv.eval.replay.store import run_on_store

                results += run_on_store(trace, specs, capacities, args.store, cost,
                                        lookaheads=lookaheads, progress=progress)
        except PolicyError as exc:
            raise ConfigError(f"policy misbehaved: {exc}") from exc
    log.info("replay: %d runs of %s", len(results), args.trace)
    if fmt in ("json", "csv"):      # machine formats: the table alone, on stdout
        print(format_table(results, fmt=fmt), end="")
        _write_json(args, results, trace, cost, layouts, promote, budget)
        _plot(args, results)
        return 0
    model = (f"{args.bandwidth:g} GB/s + {args.latency:g} us per hit block, "
             if capacities else "")
    print(f"{args.trace}: {trace.requests} requests, {len(trace.refs)} block references, "
          f"{trace.unique} unique blocks of {human_bytes(cost.block_bytes)}; TTFT modeled as "
          f"{model}{cost.recompute_tps:g} tokens/s recompute")
    for lay in layouts:
        print(describe_layout(lay, trace, cost, promote, budget))
    for q in lookaheads:
        if q.seconds:
            print(describe_queue(q, trace))
    print()
    print(format_table(results, fmt=fmt))
    _write_json(args, results, trace, cost, layouts, promote, budget)
    _plot(args, results)
    return 0


def describe_queue(lookahead: Lookahead, trace: Trace) -> str:
    """One line on what a time-window queue holds on ``trace``: its length in requests."""
    import numpy as np

    n = np.asarray(queue_lengths(trace.queue_ends(lookahead)), dtype=np.int64)
    p50, p90 = (float(x) for x in np.percentile(n, [50, 90])) if n.size else (0.0, 0.0)
    return (f"queue {lookahead.text}: {n.mean() if n.size else 0:.0f} requests on average "
            f"(median {p50:.0f}, p90 {p90:.0f}, max {int(n.max()) if n.size else 0})")


def _plot(args: Any, results: Sequence[Result]) -> None:
    if args.plot:
        plot(results, args.plot, title=f"{Path(args.trace).name}: prefix-token hit ratio")
