"""The figures of ``rkv report``: quality loss against storage overhead coloured by reliability,
and unreliability against storage overhead; one panel per tier.

Rates of zero cannot go on a log scale, and a zero seen in a few thousand blocks is not zero:
such a point is drawn at its 95 % upper bound with an open marker. matplotlib is imported
here only (Agg backend), so that the rest of the report works where it is not installed: it
is an extra (``rkv[plots]``), and without it ``rkv report`` writes ``report.md`` and says
how to get the figures (:data:`NO_MATPLOTLIB`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rkv.errors import ConfigError
from rkv.eval.sweep.report_fmt import MODEL_NOTE, label, tiers, varying
from rkv.eval.sweep.report_rows import Rate, Setting

XLABEL = "storage overhead: stored bytes/token ÷ fp16 − 1"
#: What the report says instead of drawing its figures when matplotlib is not installed.
NO_MATPLOTLIB = "figures not drawn: matplotlib is not installed (pip install 'rkv[plots]')"


def have_matplotlib() -> bool:
    """Whether matplotlib can be imported (the ``plots`` extra is installed)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _plt() -> Any:
    try:
        import matplotlib
    except ImportError as exc:   # write_report asks have_matplotlib first; other callers
        raise ConfigError(NO_MATPLOTLIB) from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.hashsalt": "rkv-report", "font.size": 8})
    return plt


def _tex(text: str) -> str:
    """Text from the results file, safe from matplotlib's mathtext (``$`` starts a formula)."""
    return text.replace("$", r"\$")


def _shown(r: Rate) -> tuple[float, bool]:
    """Where a rate is drawn, and whether it was observed (False: drawn at its upper bound)."""
    return (r.rate, True) if r.n else (r.hi, False)


def _save(fig: Any, stem: Path, formats: Sequence[str]) -> list[Path]:
    paths = []
    for f in formats:
        p = stem.with_suffix("." + f)
        meta = {"Date": None} if f in ("svg", "pdf") else {"Software": None}
        fig.savefig(p, dpi=130, bbox_inches="tight", metadata=meta)
        paths.append(p)
    return paths


def _grid(plt: Any, n: int) -> tuple[Any, list[Any]]:
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.4 * cols, 4.6 * rows), squeeze=False)
    flat = [a for row in axes for a in row]
    for a in flat[n:]:
        a.set_visible(False)
    return fig, flat[:n]


def _title(group: Sequence[Setting], tier: str) -> str:
    c = group[0].config
    bits = [tier]
    if len({s.config.get("preset") for s in group}) == 1 and c.get("preset"):
        bits.append(str(c["preset"]))
    if len({s.config.get("ber_multiplier") for s in group}) == 1 and c.get("ber_multiplier"):
        bits.append(f"fault rates x{c['ber_multiplier']:g}")
    return _tex(", ".join(bits))


def _x(s: Setting, cost: bool) -> float:
    return float(s.overhead if cost and s.overhead is not None else (s.bits or 0))


def _labels(fig: Any, ax: Any, pts: Sequence[tuple[Setting, float, float]],
            extra: Sequence[str], by: str = "bits") -> None:
    """Label points compactly: settings with the same ``by`` (bits for quality, code for
    rates) sit close together, so their labels are stacked in a column right of the group,
    each with a thin leader line to its point."""
    from matplotlib.transforms import offset_copy

    groups: dict[Any, list[tuple[Setting, float, float]]] = {}
    for p in pts:
        groups.setdefault(p[0].config.get(by), []).append(p)
    for group in groups.values():
        group.sort(key=lambda p: (p[1], p[2]))
        right = max(p[1] for p in group)
        base = max(p[2] for p in group)
        for j, (s, x, y) in enumerate(group):
            where = offset_copy(ax.transData, fig=fig, x=10, y=2 + 7.5 * j, units="points")
            ax.annotate(_tex(label(s, extra)), (x, y), xytext=(right, base), textcoords=where,
                        fontsize=5.5, color="0.2", va="bottom",
                        arrowprops={"arrowstyle": "-", "lw": 0.3, "color": "0.6",
                                    "shrinkA": 0, "shrinkB": 3})
    xs = [p[1] for p in pts]
    if xs:
        span = (max(xs) - min(xs)) or 1.0
        ax.set_xlim(min(xs) - 0.05 * span, max(xs) + 0.25 * span)
    tops = [p[2] for p in pts]
    if tops and max(tops) > 0:
        ax.set_ylim(top=max(tops) * 12)


def _code_labels(fig: Any, ax: Any, pts: Sequence[tuple[Setting, float, float]],
                 extra: Sequence[str]) -> None:
    """Rates depend mostly on the code: each point gets its bits, each code one label right of
    its rightmost point (labels at nearly the same height are stacked)."""
    from matplotlib.transforms import offset_copy

    groups: dict[str, list[tuple[Setting, float, float]]] = {}
    for s, x, y in pts:
        ax.annotate(str(s.bits), (x, y), xytext=(0, -7), textcoords="offset points",
                    fontsize=5, color="0.35", ha="center", va="top")
        name = label(s, extra).split(" ", 1)[1]
        groups.setdefault(name, []).append((s, x, y))
    ends = sorted(((max((p[1], p[2]) for p in g), name) for name, g in groups.items()),
                  key=lambda e: e[0][1])
    clusters: list[list[tuple[tuple[float, float], str]]] = []
    for end in ends:                # labels less than ~0.15 decade apart share a column
        if clusters and math.log10(end[0][1]) - math.log10(clusters[-1][-1][0][1]) < 0.15:
            clusters[-1].append(end)
        else:
            clusters.append([end])
    for cl in clusters:
        for j, ((x, y), name) in enumerate(cl):
            where = offset_copy(ax.transData, fig=fig, x=8, y=7.5 * (j - (len(cl) - 1) / 2) - 3,
                                units="points")
            ax.annotate(_tex(name), (x, y), xytext=(x, y), textcoords=where, fontsize=6,
                        color="0.15")
    xs = [p[1] for p in pts]
    if xs:
        span = (max(xs) - min(xs)) or 1.0
        ax.set_xlim(min(xs) - 0.05 * span, max(xs) + 0.2 * span)


def _note(ax: Any, lines: list[str]) -> None:
    if lines:
        ax.text(0.01, 0.01, _tex("; ".join(lines)), transform=ax.transAxes, fontsize=6.5,
                va="bottom", color="0.35", wrap=True)


def plot_pareto(plt: Any, sets: Sequence[Setting], front: set[str], stem: Path,
                formats: Sequence[str]) -> list[Path]:
    """KL (with its CI) against overhead, colour = log10 P(SDC), marker = DUE seen or not."""
    names = tiers(sets)
    fig, axes = _grid(plt, len(names))
    shown = [_shown(s.sdc)[0] for s in sets if s.sdc is not None]
    logs = [math.log10(v) for v in shown if v > 0]
    lo, hi = (min(logs), max(logs)) if logs else (-6.0, -1.0)
    norm = plt.Normalize(lo - 0.5, hi + 0.5) if hi - lo < 1 else plt.Normalize(lo, hi)
    cmap = plt.get_cmap("plasma")
    for ax, tier in zip(axes, names, strict=True):
        group = [s for s in sets if s.tier == tier]
        extra = varying(sets, tier)
        cost = any(s.overhead is not None for s in group)
        have_q = any(s.kl is not None for s in group)
        notes = []
        if not cost:
            notes.append("no cost metric: x is bits")
        if not any(s.sdc is not None for s in group):
            notes.append("no reliability metric: grey")
        pts = [s for s in group if s.kl is not None and math.isfinite(s.kl.mean)
               and (s.overhead is not None or not cost)]
        if not have_q:
            notes.append("no quality metric in this sweep: see the reliability figure")
        elif len(pts) < len(group):
            notes.append(f"{len(group) - len(pts)} setting(s) without quality, cost or with "
                         "undefined KL not shown")
        for s in pts:
            assert s.kl is not None
            x, y = _x(s, cost), max(s.kl.mean, 0.0)
            err = [[max(y - max(s.kl.lo, 0.0), 0.0)], [max(s.kl.hi - y, 0.0)]]
            ax.errorbar([x], [y], yerr=err, fmt="none", ecolor="0.6", elinewidth=0.8,
                        capsize=2, zorder=1)
            if s.sdc is not None:
                v, seen = _shown(s.sdc)
                colour = cmap(norm(math.log10(v))) if v > 0 else cmap(norm(lo))
            else:
                colour, seen = (0.6, 0.6, 0.6, 1.0), True
            marker = "^" if s.due is not None and s.due.n else "o"
            ax.scatter([x], [y], s=46, marker=marker, zorder=3, linewidths=1.4,
                       facecolors=colour if seen else "none", edgecolors=colour)
            if s.key in front:
                ax.scatter([x], [y], s=130, marker="o", facecolors="none", edgecolors="k",
                           linewidths=0.8, zorder=2)
        ax.set_yscale("symlog", linthresh=1e-5)
        _labels(fig, ax, [(s, _x(s, cost), max(s.kl.mean if s.kl else 0.0, 0.0)) for s in pts],
                extra)
        line = sorted((s for s in pts if s.key in front and (s.sdc is None or s.sdc.n == 0)),
                      key=lambda s: (_x(s, cost), s.kl.mean if s.kl else 0.0))
        xs: list[float] = []
        ys: list[float] = []
        for s in line:
            y = max(s.kl.mean if s.kl else 0.0, 0.0)
            if not ys or y < ys[-1]:
                xs.append(_x(s, cost))
                ys.append(y)
        if xs:
            ax.step(xs, ys, where="post", color="k", lw=0.9, alpha=0.7, zorder=0,
                    label="Pareto front, no SDC seen")
        ax.set_xlabel(XLABEL if cost else "bits per value")
        ax.set_ylabel("quality loss: KL (nats/token), 95 % CI")
        ax.set_title(_title(group, tier))
        ax.grid(True, which="major", lw=0.3, alpha=0.5)
        _note(ax, notes)
    proxies = [
        plt.Line2D([], [], ls="", marker="o", mfc="0.5", mec="0.5", label="no DUE seen"),
        plt.Line2D([], [], ls="", marker="^", mfc="0.5", mec="0.5", label="DUE seen"),
        plt.Line2D([], [], ls="", marker="o", mfc="none", mec="0.5",
                   label="no SDC seen (colour: 95 % upper bound)"),
        plt.Line2D([], [], ls="", marker="o", ms=10, mfc="none", mec="k", label="Pareto-optimal"),
        plt.Line2D([], [], color="k", lw=0.9, label="front among settings with no SDC seen"),
    ]
    fig.legend(handles=proxies, loc="lower center", ncol=5, fontsize=7, frameon=False,
               bbox_to_anchor=(0.5, -0.02))
    sm = plt.cm.ScalarMappable(norm=norm, cmap=cmap)
    fig.colorbar(sm, ax=axes, shrink=0.8, pad=0.01,
                 label="log10 P(SDC) per block (open marker: none seen, upper bound)")
    fig.suptitle(f"Quality loss vs storage overhead; {MODEL_NOTE}", fontsize=9)
    try:
        return _save(fig, stem, formats)
    finally:
        plt.close(fig)


def plot_reliability(plt: Any, sets: Sequence[Setting], front: set[str], stem: Path,
                     formats: Sequence[str]) -> list[Path]:
    """P(DUE) and P(SDC) per block against overhead (log scale, open: none seen)."""
    names = tiers(sets)
    fig, axes = _grid(plt, len(names))
    for ax, tier in zip(axes, names, strict=True):
        group = [s for s in sets if s.tier == tier]
        cost = any(s.overhead is not None for s in group)
        extra = varying(sets, tier)
        pts = [s for s in group if s.sdc is not None and s.due is not None
               and (s.overhead is not None or not cost)]
        for s in pts:
            x = _x(s, cost)
            for r, colour, marker in ((s.due, "tab:blue", "^"), (s.sdc, "tab:red", "o")):
                assert r is not None
                v, seen = _shown(r)
                if v <= 0:
                    continue
                # A rate scaled by P(any fault) can sit just above its Wilson bound.
                ax.errorbar([x], [v], yerr=[[max(v - r.lo, 0.0) if seen else 0.0],
                                            [max(r.hi - v, 0.0)]],
                            fmt="none", ecolor=colour, alpha=0.35, elinewidth=0.8, zorder=1)
                ax.scatter([x], [v], marker=marker, s=40 if s.key in front else 22,
                           facecolors=colour if seen else "none", edgecolors=colour, zorder=2)
        ax.set_yscale("log")
        _code_labels(fig, ax, [(s, _x(s, cost), _shown(s.due)[0]) for s in pts
                               if s.due is not None and _shown(s.due)[0] > 0], extra)
        ax.set_xlabel(XLABEL if cost else "bits per value")
        ax.set_ylabel("per-block rate (95 % CI)")
        ax.set_title(_title(group, tier))
        ax.grid(True, which="major", lw=0.3, alpha=0.5)
        _note(ax, [] if pts else ["no reliability metric for this tier"])
    proxies = [
        plt.Line2D([], [], ls="", marker="^", color="tab:blue", label="DUE (detected, recomputed)"),
        plt.Line2D([], [], ls="", marker="o", color="tab:red", label="SDC (silently wrong)"),
        plt.Line2D([], [], ls="", marker="o", mfc="none", mec="0.4",
                   label="none seen: 95 % upper bound"),
        plt.Line2D([], [], ls="", marker="o", ms=8, color="0.4", label="large: Pareto-optimal"),
    ]
    fig.legend(handles=proxies, loc="lower center", ncol=4, fontsize=7, frameon=False,
               bbox_to_anchor=(0.5, -0.02))
    fig.suptitle("Unreliability vs storage overhead (fault rates as configured per tier)",
                 fontsize=9)
    fig.tight_layout(rect=(0, 0.04, 1, 0.97))
    try:
        return _save(fig, stem, formats)
    finally:
        plt.close(fig)


def plot_all(sets: Sequence[Setting], front: set[str], out: Path, formats: Sequence[str],
             rate: str) -> list[Path]:
    """Both figures, each in every format; the reliability one only if something has rates."""
    del rate        # the figures show observed rates or upper bounds, whatever the front used
    plt = _plt()
    paths = plot_pareto(plt, sets, front, out / "pareto", formats)
    if any(s.sdc is not None for s in sets):
        paths += plot_reliability(plt, sets, front, out / "reliability", formats)
    return paths
