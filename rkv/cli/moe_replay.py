"""``rkv replay --moe TRACE``: the command line, tables, JSON and plot of the expert replay
(:mod:`rkv.moe.replay`).

:func:`moe_options` adds the MoE options to the ``replay`` command and :func:`dispatch` picks
the replay: with ``--moe`` the positional trace is a routing trace (or
``synthetic:PRESET[:TOKENS[:SEED]]``, generated in memory), otherwise ``rkv replay`` runs as
before (and refuses the MoE options).
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click

from rkv.errors import ConfigError, InputError
from rkv.moe.replay import (
    BELADY,
    DEFAULT_BUDGETS,
    DEFAULT_COMPUTE,
    DEFAULT_POLICIES,
    DEFAULT_PREFETCH,
    GLOBAL,
    HINTS,
    NONE,
    ORACLE,
    PER_LAYER,
    MoEResult,
    MoETrace,
    Source,
    cancel_bytes,
    read_trace,
    run_matrix,
    source_tier,
)
from rkv.ui import Column, Progress, render

log = logging.getLogger(__name__)
F = TypeVar("F", bound=Callable[..., Any])
_MOE_ONLY = ("budget", "prefetch", "per_layer", "shape", "bits", "source", "compute_us",
             "width", "cancel_chunk", "interference")
_KV_ONLY: dict[str, Any] = {
    "capacity": [], "tiers": [], "lookahead": [], "store": None, "promote": None,
    "prefetch_policy": None, "prefetch_budget": None, "block_bytes": None,
    "recompute_tps": None, "bandwidth": 20.0, "latency": 0.1}


_MOE_OPTIONS = [
    click.option("--moe", is_flag=True,
                 help="TRACE is a MoE routing trace (rkv-moe-trace JSON Lines) or "
                      "synthetic:PRESET[:TOKENS[:SEED]]: replay expert caching and prefetch"),
    click.option("--budget", multiple=True, metavar="B",
                 help="with --moe: device cache, a share of all experts (10%, 0.1) or bytes "
                      "(4GiB); repeatable  [default: 10% 25% 50%]"),
    click.option("--prefetch", multiple=True, metavar="LIST",
                 help="with --moe: prefetchers, comma-separated: none, cooccur[(min_p=..)], "
                      "hints, oracle (the next step's routed experts)  [default: none, "
                      "cooccur, hints; hints only on traces that carry them]"),
    click.option("--per-layer", is_flag=True, default=None,
                 help="with --moe: one cache per layer (budget split evenly) instead of one "
                      "global"),
    click.option("--shape", default=None, metavar="PRESET",
                 help="with --moe: expert bytes from a preset: mixtral-8x7b, olmoe-1b-7b, "
                      "qwen3-30b-a3b, deepseek-v2-lite (same experts per layer)"),
    click.option("--bits", type=click.Choice(["16", "8", "4"]), default=None,
                 help="with --moe and --shape: bits per weight  [default: 16]"),
    click.option("--source", default=None, metavar="TIER",
                 help="with --moe: where misses load from: dram, cxl, nvme or NAME@GBPS/US  "
                      "[default: dram, 20 GB/s, 0.1 us]"),
    click.option("--compute-us", type=click.FloatRange(min=0), default=None, metavar="US",
                 help="with --moe: compute per layer that a prefetch overlaps  "
                      "[default: 1000]"),
    click.option("--width", type=click.IntRange(min=1), default=None, metavar="N",
                 help="with --moe: experts prefetched per layer at most  [default: top-k]"),
    click.option("--cancel-chunk", default=None, metavar="BYTES",
                 help="with --moe: a dropped prefetch moves on to the end of its chunk of "
                      "BYTES (1MiB, 4096; 0: cancelled at once)  [default: expert, one "
                      "uncancellable copy]"),
    click.option("--interference", type=float, default=None, metavar="F",
                 help="with --moe: compute seconds added per second of prefetch copy "
                      "during a layer's compute  [default: 0]"),
]


def moe_options(f: F) -> F:
    """Add ``--moe`` and its options to ``rkv replay``."""
    for option in reversed(_MOE_OPTIONS):
        f = option(f)
    return f


def moe_params(kw: dict[str, Any]) -> dict[str, Any]:
    """The MoE options as the replay reads them: None when not given."""
    kw = dict(kw)
    kw["budget"] = list(kw["budget"]) or None
    kw["prefetch"] = list(kw["prefetch"]) or None
    kw["per_layer"] = kw["per_layer"] or None
    kw["bits"] = None if kw["bits"] is None else int(kw["bits"])
    return kw


def dispatch(args: Any, kv_replay: Callable[[Any], int]) -> int:
    """``rkv replay``: the MoE replay with ``--moe``, else ``kv_replay`` (which refuses the
    MoE options)."""
    if args.moe:
        return cli_moe_replay(args)
    given = [f"--{n.replace('_', '-')}" for n in _MOE_ONLY if getattr(args, n) is not None]
    if given:
        raise ConfigError(f"{', '.join(given)}: only with --moe")
    return int(kv_replay(args))


def load(text: str, limit: int | None = None) -> MoETrace:
    """A trace file, or ``synthetic:PRESET[:TOKENS[:SEED]]`` (default 1000 tokens, seed 0)."""
    if not str(text).startswith("synthetic:"):
        return read_trace(text, limit)
    from rkv.moe.presets import preset, synthetic_trace

    parts = str(text).split(":")[1:]
    try:
        tokens = int(parts[1]) if len(parts) > 1 else 1000
        seed = int(parts[2]) if len(parts) > 2 else 0
    except ValueError:
        raise ConfigError(f"bad synthetic trace {text!r} (synthetic:PRESET[:TOKENS[:SEED]])"
                          ) from None
    if len(parts) > 3 or tokens < 1:
        raise ConfigError(f"bad synthetic trace {text!r} (synthetic:PRESET[:TOKENS[:SEED]])")
    with tempfile.TemporaryDirectory() as d:
        path = synthetic_trace(preset(parts[0]), Path(d) / "trace.jsonl", tokens, seed=seed)
        trace = read_trace(path, limit)
    trace.path = str(text)
    return trace


def apply_shape(trace: MoETrace, shape: str | None, bits: int | None) -> MoETrace:
    """The trace with a preset's expert bytes (same experts per layer required)."""
    if shape is None:
        if bits is not None:
            raise ConfigError("--bits applies with --shape")
        return trace
    from rkv.moe.presets import preset

    s = preset(shape)
    if s.experts != trace.experts:
        raise ConfigError(f"the trace has {trace.experts} experts per layer, {s.name} "
                          f"{s.experts}: replay with the trace's own sizes or a preset of "
                          "the same width")
    return trace.with_expert_bytes(s.expert_bytes(16 if bits is None else bits))


def cli_moe_replay(args: Any) -> int:
    given = [n for n, default in _KV_ONLY.items() if getattr(args, n) != default]
    if given:
        raise ConfigError(f"--{given[0].replace('_', '-')} does not apply with --moe "
                          "(use --budget, --source)")
    if args.limit is not None and args.limit < 1:
        raise InputError(f"--limit must be at least 1, got {args.limit}")
    trace = apply_shape(load(args.trace, args.limit), args.shape, args.bits)
    prefetch = [p.strip() for arg in (args.prefetch or [",".join(DEFAULT_PREFETCH)])
                for p in _split(arg)]
    source = source_tier(args.source) if args.source else Source()
    compute = DEFAULT_COMPUTE if args.compute_us is None else args.compute_us * 1e-6
    chunk = cancel_bytes(args.cancel_chunk)
    interference = 0.0 if args.interference is None else args.interference
    layouts = (PER_LAYER,) if args.per_layer else (GLOBAL,)
    if HINTS in prefetch and trace.hints is None and args.prefetch:
        raise ConfigError(f"{args.trace} carries no hints: drop 'hints' from --prefetch")
    log.info("MoE replay of %s: %d tokens, %d layers x %d experts", trace.path, trace.tokens,
             trace.layers, trace.experts)
    with Progress("replay", None, unit="run", quiet=bool(args.quiet)) as bar:
        results = run_matrix(trace, args.policy or DEFAULT_POLICIES,
                             args.budget or DEFAULT_BUDGETS, prefetch, layouts,
                             width=args.width, source=source, compute=compute,
                             cancel_chunk=chunk, interference=interference,
                             progress=lambda msg: bar.update(note=msg))
    if args.fmt == "csv":           # the table alone, on stdout
        print(format_table(results, fmt="csv"))
    else:
        print(describe(trace, source, compute, chunk, interference))
        print()
        print(format_table(results, fmt=args.fmt))
    if args.json:
        doc = to_json(results, trace, source, compute, chunk, interference)
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    if args.plot:
        plot(results, args.plot, title=f"{trace.model or args.trace}: expert cache replay")
    return 0


def _split(arg: str) -> list[str]:
    """Split a comma list, keeping commas inside parentheses."""
    out, depth, cur = [], 0, ""
    for ch in arg:
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    return [p for p in [*out, cur] if p.strip()]


def describe(trace: MoETrace, source: Source, compute: float, chunk: int | None = None,
             interference: float = 0.0) -> str:
    from rkv.store.results import human_bytes

    hints = "with" if trace.hints is not None else "without"
    cut = ("whole experts (uncancellable)" if chunk is None or chunk >= trace.expert_bytes
           else "at once" if chunk == 0 else f"per {human_bytes(chunk)}")
    return (f"{trace.path}: {trace.model or '?'}, {trace.tokens} tokens, {trace.layers} layers "
            f"x {trace.experts} experts, top-{trace.top_k}, {human_bytes(trace.expert_bytes)} "
            f"per expert ({human_bytes(trace.layers * trace.experts * trace.expert_bytes)} "
            f"in all), {hints} hints; misses load from {source.name} at "
            f"{source.bandwidth / 1e9:g} GB/s + {source.latency * 1e6:g} us, "
            f"{compute * 1e6:g} us of compute per layer; dropped prefetches cancel {cut}, "
            f"interference {interference:g}")


def _columns() -> list[Any]:
    def pct(v: float) -> str:
        return f"{100 * v:.1f}"

    return [Column("label", "policy"), Column("budget"),
            Column("hit_ratio", "hit %", "right", pct),
            Column("bytes_per_token", "MB/token", "right", lambda v: f"{v / 1e6:.1f}"),
            Column("precision", "precision %", "right", pct),
            Column("recall", "recall %", "right", pct),
            Column("extra_misses", "extra miss %", "right", pct),
            Column("stall_per_token", "stall ms/token", "right", lambda v: f"{1e3 * v:.2f}"),
            Column("traffic", "traffic x", "right", lambda v: f"{v:.2f}"),
            Column("gap_closed", "gap closed %", "right", pct),
            Column("gap_prefetch", "gap vs pf ref %", "right", pct)]


def table_rows(results: Sequence[MoEResult]) -> list[dict[str, Any]]:
    return [{"label": r.label, "budget": r.budget, "hit_ratio": r.hit_ratio,
             "bytes_per_token": r.bytes_per_token, "precision": r.precision,
             "recall": r.recall, "extra_misses": r.extra_misses,
             "stall_per_token": r.stall_per_token, "traffic": r.traffic,
             "gap_closed": r.gap_closed, "gap_prefetch": r.gap_prefetch} for r in results]


def format_table(results: Sequence[MoEResult], *, markdown: bool = False,
                 fmt: str | None = None) -> str:
    """One row per (policy, prefetch, layout, budget) as text (a plain rich table),
    ``markdown`` or ``fmt`` (``text``, ``markdown``, ``csv``, ``json``; :mod:`rkv.ui`)."""
    return render(table_rows(results), _columns(),
                  fmt=fmt or ("markdown" if markdown else "text")).rstrip("\n")


def to_json(results: Sequence[MoEResult], trace: MoETrace, source: Source, compute: float,
            chunk: int | None = None, interference: float = 0.0) -> dict[str, Any]:
    return {"trace": trace.path, "model": trace.model, "fingerprint": trace.fingerprint,
            "tokens": trace.tokens, "layers": trace.layers, "experts": trace.experts,
            "top_k": trace.top_k, "expert_bytes": trace.expert_bytes,
            "hints": trace.hints is not None,
            "source": {"name": source.name, "bandwidth": source.bandwidth,
                       "latency": source.latency},
            "compute_per_layer": compute,
            "cancel_chunk": trace.expert_bytes if chunk is None else min(chunk,
                                                                          trace.expert_bytes),
            "interference": interference, "results": [r.row() for r in results]}


#: The offline references, drawn apart: per-layer caches and one global cache, Belady's MIN
#: without prefetch (the demand-only optimum of its layout) and with the oracle prefetch (the
#: prefetch-aware reference).
_BELADY_STYLE: dict[tuple[str, str], dict[str, Any]] = {
    (NONE, PER_LAYER): {"color": "k", "ls": "--", "marker": "s", "lw": 2.0,
                        "label": "Belady MIN, per-layer caches (demand-only optimum)"},
    (NONE, GLOBAL): {"color": "0.4", "ls": "-.", "marker": "D", "mfc": "none", "lw": 1.8,
                     "label": "Belady MIN, one global cache (demand-only optimum)"},
    (ORACLE, PER_LAYER): {"color": "k", "ls": ":", "marker": "^", "lw": 2.0,
                          "label": "Belady + oracle prefetch, per-layer (reference)"},
    (ORACLE, GLOBAL): {"color": "0.4", "ls": ":", "marker": "v", "mfc": "none", "lw": 1.8,
                       "label": "Belady + oracle prefetch, global (reference)"},
}


def figure(results: Sequence[MoEResult], title: str = "") -> Any:
    """Hit ratio and modeled stall per token against the budget, one line per policy: the
    figure (matplotlib, Agg). Prefetching runs are dotted; each Belady reference and layout
    has its own style and label."""
    try:
        import matplotlib
    except ImportError as exc:  # pragma: no cover - matplotlib is a test dependency
        raise ConfigError("--plot needs matplotlib (pip install 'rkv[plots]')") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[str, list[tuple[float, float, float]]] = {}
    layout: dict[str, tuple[str, str, str]] = {}
    for r in results:
        series.setdefault(r.label, []).append((100 * r.budget_fraction, 100 * r.hit_ratio,
                                               1e3 * r.stall_per_token))
        layout[r.label] = (r.policy, r.prefetch, r.layout)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.6), dpi=110)
    colors = iter(plt.get_cmap("tab20")(i) for i in range(20))
    for name, pts in series.items():
        pts.sort()
        xs = [p[0] for p in pts]
        policy, pf, lay = layout[name]
        style: dict[str, Any] = (dict(_BELADY_STYLE[pf, lay]) if policy == BELADY else
                                 {"marker": "o", "lw": 1.3, "color": next(colors, None),
                                  "ls": "-" if f"+{NONE}" in name or "+" not in name
                                  else ":", "label": name})
        ax1.plot(xs, [p[1] for p in pts], ms=4, **style)
        ax2.plot(xs, [p[2] for p in pts], ms=4, **style)
    ax1.set_ylabel("expert hit ratio (%)")
    ax2.set_ylabel("modeled stall per token (ms)")
    for ax in (ax1, ax2):
        ax.set_xlabel("device cache (% of all experts)")
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)
    fig.suptitle(title or "expert cache replay")
    ax2.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5),
               title="dotted: with prefetch", title_fontsize=7)
    fig.tight_layout()
    return fig


def plot(results: Sequence[MoEResult], path: str | Path, title: str = "") -> None:
    """:func:`figure`, saved to ``path`` (PNG, or what its extension says)."""
    fig = figure(results, title)
    import matplotlib.pyplot as plt

    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        try:
            fig.savefig(path)
        except ValueError as exc:
            raise ConfigError(f"cannot write the plot {path}: {exc}") from exc
    finally:
        plt.close(fig)
