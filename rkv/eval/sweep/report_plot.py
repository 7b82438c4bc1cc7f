"""The figures of ``rkv report``, one panel per tier (or tier and fault preset):

* ``pareto``: quality loss (KL, 95 % t interval over the finite windows) against stored
  bytes per token; raw storage and every rkv protection are their own marker and colour, so
  raw is read against rkv at the same bytes; the title says what raw's quality windows met;
* ``reliability``: the per-block SDC and DUE rates (95 % Wilson intervals) of every setting,
  grouped by protection (raw first), bits within a group.

A rate with no event seen is not zero: it is drawn at its 95 % upper bound as an open grey
marker with a downward caret (the truth is at or below it), never in the colour of a
measured rate. matplotlib is imported here only (Agg backend), so that the rest of the
report works where it is not installed: it is an extra (``rkv[plots]``), and without it
``rkv report`` writes ``report.md`` and says how to get the figures (:data:`NO_MATPLOTLIB`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rkv.errors import ConfigError
from rkv.eval.sweep.report_fmt import MODEL_NOTE, short_code, tiers
from rkv.eval.sweep.report_rows import Rate, Setting

#: What the report says instead of drawing its figures when matplotlib is not installed.
NO_MATPLOTLIB = "figures not drawn: matplotlib is not installed (pip install 'rkv[plots]')"
#: Artist ids the tests (and anyone post-processing an SVG) can find the kinds of points by.
GID_MEASURED, GID_BOUND, GID_CARET = "measured", "upper-bound", "upper-bound-caret"
BOUND_COLOUR = "0.45"
#: Protection -> (marker, colour); codes not listed take the spare styles in turn.
_STYLES = {"raw": ("X", "black"), "chk": ("o", "tab:blue"), "rs239": ("s", "tab:green"),
           "shard16+2": ("D", "tab:purple"), "planned": ("*", "tab:orange")}
_SPARE = [("P", "tab:brown"), ("h", "tab:cyan"), ("v", "tab:olive"), ("<", "tab:pink"),
          (">", "tab:gray")]
_NAMES = {"raw": "raw storage (no check)", "chk": "rkv, checksum only",
          "planned": "rkv, planned per block"}


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


def protection(s: Setting) -> str:
    """The setting's protection as the figures name it: ``raw``, ``planned`` or its short
    code (``chk``, ``rs239``, ``shard16+2``)."""
    if s.raw or s.bits is None:
        return "raw" if s.raw else "planned"
    return short_code(s.code)


def _order(sets: Sequence[Setting]) -> list[str]:
    """Protections in drawing order: raw, checksum only, the codes as met, planned."""
    seen = list(dict.fromkeys(protection(s) for s in sets))
    first = [p for p in ("raw", "chk") if p in seen]
    return first + [p for p in seen if p not in (*first, "planned")] + (
        ["planned"] if "planned" in seen else [])


def _styles(sets: Sequence[Setting]) -> dict[str, tuple[str, str]]:
    spare = iter(_SPARE * 4)
    return {p: _STYLES.get(p) or next(spare) for p in _order(sets)}


def _save(fig: Any, stem: Path, formats: Sequence[str]) -> list[Path]:
    paths = []
    for f in formats:
        p = stem.with_suffix("." + f)
        meta = {"Date": None} if f in ("svg", "pdf") else {"Software": None}
        fig.savefig(p, dpi=130, bbox_inches="tight", metadata=meta)
        paths.append(p)
    return paths


def _grid(plt: Any, n: int) -> tuple[Any, list[Any]]:
    cols = min(n, 2)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.2 * cols, 4.4 * rows), squeeze=False)
    flat = [a for row in axes for a in row]
    for a in flat[n:]:
        a.set_visible(False)
    return fig, flat[:n]


def _scope(group: Sequence[Setting], tier: str) -> str:
    """``tier (preset; faults x1000, quality windows x3e4)``."""
    c = group[0].config
    bits = []
    if len({s.config.get("preset") for s in group}) == 1 and c.get("preset") and \
            "/" not in tier:
        bits.append(str(c["preset"]))
    if len({s.config.get("ber_multiplier") for s in group}) == 1 and c.get("ber_multiplier"):
        bits.append(f"faults x{c['ber_multiplier']:g}")
    qm = {s.quality_multiplier for s in group if s.quality_multiplier is not None}
    if len(qm) == 1:
        bits.append(f"quality windows x{next(iter(qm)):g}")
    return _tex(tier + (f" ({'; '.join(bits)})" if bits else ""))


def bound_marker(ax: Any, x: float, y: float, marker: str, size: float = 30.0) -> None:
    """A zero-event rate: an open grey marker at its 95 % upper bound ``y`` with a caret
    pointing down (the rate is at most this)."""
    ax.scatter([x], [y], marker=marker, s=size, facecolors="none", edgecolors=BOUND_COLOUR,
               linewidths=0.9, zorder=2, gid=GID_BOUND)
    ax.plot([x, x], [y, y / 2.5], color=BOUND_COLOUR, lw=0.7, zorder=1, gid=GID_CARET)
    ax.plot([x], [y / 2.5], marker=7, ms=3.5, color=BOUND_COLOUR, ls="", zorder=1,
            gid=GID_CARET)


# -- quality against bytes --------------------------------------------------------------------
def _raw_line(group: Sequence[Setting]) -> str:
    """What raw storage's quality windows met, for the panel's title."""
    raw = [s for s in group if s.raw and s.quality_windows is not None]
    if not raw:
        return ""
    w = raw[0].quality_windows
    assert w is not None
    wrong = "" if w.wrong_kv is None else f", {w.wrong_kv} got wrong KV"
    return (f"raw: {w.faulted}/{w.total} windows met faults{wrong}, {w.recomputed} "
            f"recomputed, {w.broken.n}/{w.total} broken (non-finite)")


def _x(s: Setting, cost: bool) -> float:
    if cost and s.bytes_per_token is not None:
        return float(s.bytes_per_token)
    return float(s.bits or 0)


def figure_pareto(plt: Any, sets: Sequence[Setting], front: set[str]) -> Any:
    """Quality loss against stored bytes per token (see the module docstring): the figure."""
    from matplotlib.transforms import offset_copy

    names = tiers(sets)
    fig, axes = _grid(plt, len(names))
    styles = _styles(sets)
    order = list(styles)
    for ax, tier in zip(axes, names, strict=True):
        group = [s for s in sets if s.tier == tier]
        cost = any(s.bytes_per_token is not None for s in group)
        pts = [s for s in group if s.kl is not None and math.isfinite(s.kl.mean)
               and (s.bytes_per_token is not None or not cost)]
        notes = [_raw_line(group)]
        undefined = [s for s in group if s.kl is not None and not math.isfinite(s.kl.mean)]
        if undefined:
            notes.append(f"KL undefined (every window broken): "
                         f"{', '.join(protection(s) for s in undefined)}")
        if not any(s.kl is not None for s in group):
            notes.append("no quality metric in this sweep: see the reliability figure")
        clusters: dict[str, list[tuple[float, float]]] = {}
        spread: dict[str, float] = {}
        for b in {s.bits for s in pts if s.bits is not None}:
            same = sorted((s for s in pts if s.bits == b),
                          key=lambda s: (_x(s, cost), order.index(protection(s))))
            for i, s in enumerate(same):
                spread[s.key] = 8.0 * (i - (len(same) - 1) / 2)
        for s in pts:
            assert s.kl is not None
            x, y = _x(s, cost), max(s.kl.mean, 0.0)
            hi = max(s.kl.hi, y) if math.isfinite(s.kl.hi) else y
            lo = min(max(s.kl.lo, 0.0), y) if math.isfinite(s.kl.lo) else y
            marker, colour = styles[protection(s)]
            # Protections of one bit-width store nearly the same bytes: each is drawn a few
            # points aside, in the order of its bytes (so that the offsets never swap two
            # points' places), so that no marker hides another.
            dx = spread.get(s.key, 0.0)
            at = offset_copy(ax.transData, fig=fig, x=dx, y=0, units="points")
            ax.errorbar([x], [y], yerr=[[y - lo], [hi - y]], fmt="none", ecolor=colour,
                        alpha=0.6, elinewidth=0.8, capsize=2, zorder=1, transform=at)
            ax.scatter([x], [y], s=70 if marker == "*" else 34, marker=marker, color=colour,
                       zorder=3, gid=GID_MEASURED, transform=at)
            if s.key in front:
                ax.scatter([x], [y], s=120, marker="o", facecolors="none", edgecolors="k",
                           linewidths=0.6, zorder=2, transform=at)
            if s.bits is None:     # planned bytes fall between bit-widths: labelled aside
                ax.annotate("planned", (x, y), xytext=(dx + 7, 0), textcoords="offset points",
                            ha="left", va="center", fontsize=6.5, color="0.25")
            else:
                clusters.setdefault(f"{s.bits}b", []).append((x, hi))
        tops = [(_x(s, cost), max(s.kl.hi, s.kl.mean)) for s in pts if s.kl is not None
                and math.isfinite(s.kl.hi)]
        for name, xy in clusters.items():
            # One label per bit-width, above the highest interval in its group's span (a
            # planned point's included): never on a marker or an error bar.
            x = math.exp(sum(math.log(max(p[0], 1e-9)) for p in xy) / len(xy))
            left, right = min(p[0] for p in xy) / 1.05, max(p[0] for p in xy) * 1.05
            top = max([p[1] for p in xy] + [t for u, t in tops if left <= u <= right])
            ax.annotate(name, (x, top), xytext=(0, 5), textcoords="offset points",
                        ha="center", va="bottom", fontsize=6.5, color="0.25")
        ax.set_yscale("symlog", linthresh=1e-4)
        if cost:
            ax.set_xscale("log")
        xs = [_x(s, cost) for s in pts]
        if xs:       # points drawn with an offset transform do not move the data limits
            lo_x, hi_x = min(xs), max(xs)
            ax.set_xlim(*((lo_x / 1.2, hi_x * 1.2) if cost and lo_x > 0
                          else (lo_x - 1.0, hi_x + 1.0)))
        if pts:
            ax.set_ylim(bottom=-0.2e-4, top=max(max(s.kl.hi if s.kl and math.isfinite(s.kl.hi)
                                                    else 0.0 for s in pts) * 8, 1e-3))
        ax.set_xlabel("stored bytes per token (log)" if cost else "bits per value")
        ax.set_ylabel("KL (nats/token), 95 % t interval")
        line = "; ".join(n for n in notes if n)
        ax.set_title(_scope(group, tier) + ("\n" + _tex(line) if line else ""), fontsize=7.5)
        ax.grid(True, which="major", lw=0.3, alpha=0.5)
    handles = [plt.Line2D([], [], ls="", marker=m, color=c, label=_NAMES.get(p, f"rkv, {p}"))
               for p, (m, c) in styles.items()]
    handles.append(plt.Line2D([], [], ls="", marker="o", ms=9, mfc="none", mec="k",
                              label="Pareto-optimal"))
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 6), fontsize=7,
               frameon=False, bbox_to_anchor=(0.5, -0.03))
    fig.suptitle(f"Quality loss vs stored bytes, raw storage vs rkv, faults in the quality "
                 f"windows; {MODEL_NOTE}; y linear below 1e-4", fontsize=8.5)
    fig.tight_layout(rect=(0, 0.03, 1, 0.97))
    return fig


# -- reliability per protection ---------------------------------------------------------------
def _rate_point(ax: Any, x: float, r: Rate, marker: str, colour: str) -> None:
    """A measured rate (filled, with its Wilson interval) or a zero-event upper bound."""
    if r.n == 0:
        if r.hi > 0:
            bound_marker(ax, x, r.hi, marker)
        return
    # A rate scaled by P(any fault) can sit just above its Wilson bound.
    ax.errorbar([x], [r.rate], yerr=[[max(r.rate - r.lo, 0.0)], [max(r.hi - r.rate, 0.0)]],
                fmt="none", ecolor=colour, elinewidth=0.9, capsize=2, zorder=1)
    ax.scatter([x], [r.rate], marker=marker, s=30, color=colour, zorder=3, gid=GID_MEASURED)


#: outcome, marker, colour, offset from the setting's x (so that two bounds never overlap).
OUTCOME_STYLE = (("sdc", "o", "tab:red", -0.2), ("due", "^", "tab:blue", 0.2),
                 ("degraded", "d", "tab:olive", 0.0))


def figure_reliability(plt: Any, sets: Sequence[Setting], front: set[str]) -> Any:
    """Per-block SDC, DUE and degraded rates per protection and bits: the figure."""
    del front            # every setting is drawn the same: rates are not a front
    from matplotlib.legend_handler import HandlerTuple

    names = tiers(sets)
    fig, axes = _grid(plt, len(names))
    for ax, tier in zip(axes, names, strict=True):
        group = [s for s in sets if s.tier == tier and s.sdc is not None and s.due is not None]
        ticks: list[float] = []
        labels: list[str] = []
        x = 0.0
        prots = _order(group)
        for k, prot in enumerate(prots):
            members = sorted((s for s in group if protection(s) == prot),
                             key=lambda s: -(s.bits or 0))
            start = x
            for s in members:
                for outcome, marker, colour, dx in OUTCOME_STYLE:
                    r = getattr(s, outcome)
                    if r is not None and (outcome != "degraded" or r.n):
                        _rate_point(ax, x + dx, r, marker, colour)
                ticks.append(x)
                labels.append("mix" if s.bits is None else str(s.bits))
                x += 1.0
            ax.text((start + x - 1.0) / 2, -0.085, prot, transform=ax.get_xaxis_transform(),
                    ha="center", va="top", fontsize=7, color="0.15")
            if k < len(prots) - 1:          # a gap and a rule between protections
                ax.axvline(x - 0.25, color="0.85", lw=0.6, zorder=0)
                x += 0.5
        ax.set_xticks(ticks, labels, fontsize=6.5)
        ax.set_xlim(-0.7, max(x - 0.3, 0.7))
        ax.set_yscale("log")
        ax.set_xlabel("bits per value, by protection", labelpad=20)
        ax.set_ylabel("per-block rate, 95 % Wilson interval")
        ax.set_title(_scope(group or [s for s in sets if s.tier == tier], tier)
                     + ("" if group else "\nno reliability metric for this tier"),
                     fontsize=7.5)
        ax.grid(True, axis="y", which="major", lw=0.3, alpha=0.5)
    handles: list[Any] = [
        plt.Line2D([], [], ls="", marker="o", color="tab:red", label="SDC: wrong data, unflagged"),
        plt.Line2D([], [], ls="", marker="^", color="tab:blue",
                   label="DUE: detected, recomputed (raw: the medium reported it)"),
        *([plt.Line2D([], [], ls="", marker="d", color="tab:olive", label="degraded")]
          if any(s.degraded is not None and s.degraded.n for s in sets) else []),
        # The bound's own look (open grey marker over a caret), not a bare caret.
        (plt.Line2D([], [], ls="", marker="o", mfc="none", mec=BOUND_COLOUR),
         plt.Line2D([], [], ls="", marker=7, ms=3.5, color=BOUND_COLOUR)),
    ]
    labels = [h.get_label() for h in handles[:-1]] + [
        "upper bound (no events seen): 95 %, the rate is at or below it"]
    fig.legend(handles=handles, labels=labels, loc="lower center", ncol=4, fontsize=7,
               frameon=False, bbox_to_anchor=(0.5, -0.03),
               handler_map={tuple: HandlerTuple(ndivide=None, pad=0.0)})
    fig.suptitle("Per-block outcomes of the fault campaigns, raw storage vs rkv "
                 "(fault rates as configured per tier)", fontsize=8.5)
    fig.tight_layout(rect=(0, 0.03, 1, 0.97))
    return fig


def plot_pareto(plt: Any, sets: Sequence[Setting], front: set[str], stem: Path,
                formats: Sequence[str]) -> list[Path]:
    """:func:`figure_pareto`, saved in every format."""
    fig = figure_pareto(plt, sets, front)
    try:
        return _save(fig, stem, formats)
    finally:
        plt.close(fig)


def plot_reliability(plt: Any, sets: Sequence[Setting], front: set[str], stem: Path,
                     formats: Sequence[str]) -> list[Path]:
    """:func:`figure_reliability`, saved in every format."""
    fig = figure_reliability(plt, sets, front)
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
