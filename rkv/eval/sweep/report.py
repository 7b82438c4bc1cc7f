"""``rkv report``'s library: the Pareto-optimal settings of a sweep, a terminal summary, and a
markdown report with figures.

A *setting* is a sweep cell without its seed (seeds are pooled, :mod:`rkv.eval.sweep.report_rows`).
Within a tier, setting A dominates B when A is no worse on every objective and better on one;
the objectives, all minimised, are storage overhead (``cost.overhead``), quality loss (mean KL
divergence, nats per token) and unreliability: P(SDC) and P(DUE) per block, taken at their
95 % upper confidence bound by default (``rate="hi"``: a setting that saw no SDC in few blocks
is not rewarded for a small sample) or at the point estimate (``rate="point"``). SDC and DUE
are separate objectives, so a cheap setting that loses blocks (DUE: recomputed) and a dearer
one that corrects them are both on the front; lists are ordered by SDC, then DUE. An
objective that some setting of a tier lacks (its sweep did not measure it) is left out for
that tier, so that every setting stays comparable.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rkv.errors import InputError
from rkv.eval.sweep.report_fmt import (
    CHECKSUM_ONLY,
    MODEL_NOTE,
    OBJECTIVES,
    fmt_interval,
    fmt_num,
    fmt_rate,
    label,
    objectives,
    tiers,
    used_objectives,
    varying,
)
from rkv.eval.sweep.report_md import markdown
from rkv.eval.sweep.report_plot import NO_MATPLOTLIB, have_matplotlib, plot_all
from rkv.eval.sweep.report_rows import (
    Interval,
    Rate,
    Setting,
    TornLineWarning,
    load_rows,
    settings,
)
from rkv.eval.sweep.results import ResultsError
from rkv.ui.tables import Column, check_format, render

__all__ = ["OBJECTIVES", "Report", "ResultsError", "TornLineWarning", "front_rows", "front_table",
           "load_rows", "objectives", "pareto", "pareto_settings", "settings", "summary",
           "write_report"]

#: Quality loss below which a setting counts as "as good as the unmodified cache" in summaries.
MAX_KL = 0.01


def _rate_mode(rate: str) -> str:
    if rate not in ("hi", "point"):
        raise InputError(f"rate must be 'hi' (95 % upper bound) or 'point', not {rate!r}")
    return rate


def _dominates(a: Sequence[float], b: Sequence[float]) -> bool:
    return all(x <= y for x, y in zip(a, b, strict=True)) and any(
        x < y for x, y in zip(a, b, strict=True))


def pareto_settings(sets: Sequence[Setting], rate: str = "hi") -> list[Setting]:
    """The settings no setting of the same tier dominates, per tier in :func:`tiers` order,
    each tier's ordered by SDC, DUE, then overhead."""
    _rate_mode(rate)
    out: list[Setting] = []
    for tier in tiers(sets):
        group = [s for s in sets if s.tier == tier]
        names = used_objectives(group, rate)
        vec = [[float(objectives(s, rate)[o] or 0.0) for o in names] for s in group]
        front = [s for s, v in zip(group, vec, strict=True)
                 if not any(_dominates(w, v) for w in vec)]
        out += sorted(front, key=lambda s: _order(s, rate))
    return out


def _order(s: Setting, rate: str) -> tuple[float, ...]:
    o = objectives(s, rate)
    return tuple(math.inf if o[k] is None else float(o[k] or 0.0)
                 for k in ("sdc", "due", "overhead", "kl"))


def pareto(rows: Sequence[Mapping[str, Any]], *, rate: str = "hi") -> list[dict[str, Any]]:
    """The Pareto-optimal settings of checked result rows (see the module docstring), as
    dicts: tier, key, label, config (without seed), seeds, objectives and the pooled stats."""
    sets = settings(rows)
    return [setting_dict(s, rate, varying(sets, s.tier))
            for s in pareto_settings(sets, rate)]


def setting_dict(s: Setting, rate: str = "hi", extra: Sequence[str] = ()) -> dict[str, Any]:
    def iv(x: Interval | None) -> dict[str, float] | None:
        return None if x is None else {"mean": x.mean, "lo": x.lo, "hi": x.hi}

    def rt(x: Rate | None) -> dict[str, Any] | None:
        return None if x is None else {"n": x.n, "blocks": x.total, "rate": x.rate,
                                       "lo": x.lo, "hi": x.hi, "pooled": x.pooled}

    return {"tier": s.tier, "key": s.key, "label": label(s, extra), "config": s.config,
            "seeds": list(s.seeds), "rows": s.rows, "objectives": objectives(s, rate),
            "overhead": s.overhead, "bytes_per_token": s.bytes_per_token,
            "kl": iv(s.kl), "ppl": iv(s.ppl), "top1": iv(s.top1), "windows": s.windows,
            "sdc": rt(s.sdc), "due": rt(s.due), "p_sdc": s.p_sdc, "p_due": s.p_due}


# -- the terminal summary -----------------------------------------------------------------------
def _safe(s: Setting, max_kl: float) -> bool:
    return (s.sdc is not None and s.sdc.n == 0 and s.overhead is not None
            and (s.kl is None or s.kl.mean < max_kl))


def _describe(s: Setting) -> str:
    parts = ["bits and codes planned by placement" if s.bits is None
             else f"{s.bits} bits + {s.code}"]
    if s.overhead is not None:
        parts.append(f"overhead {fmt_num(s.overhead)}"
                     + (f" ({s.bytes_per_token:,.0f} B/token)" if s.bytes_per_token else ""))
    if s.kl is not None:
        parts.append(f"KL {fmt_interval(s.kl, 2)}")
    parts.append(f"DUE {fmt_rate(s.due)}")
    return ", ".join(parts)


def _unprotected(group: Sequence[Setting]) -> list[str]:
    """What storage without rkv's protection did: raw cells if the sweep has them, else what
    checksum-only cells caught (raw storage would have returned those blocks unchecked)."""
    raw = [s for s in group if s.code == "raw" and s.sdc is not None]
    if raw:
        worst = max(raw, key=lambda s: s.sdc.rate if s.sdc else 0.0)
        text = (f"  raw storage (no checksum, what peers do), {worst.bits} bits: silently "
                f"wrong KV P(SDC) {fmt_rate(worst.sdc)}, analytic {fmt_num(worst.p_sdc, 2)}")
        if worst.kl is not None:
            text += f", KL {fmt_interval(worst.kl, 2)}"
        return [text]
    chk = [s for s in group if s.code.replace(" ", "") in CHECKSUM_ONLY and s.due]
    if not chk:
        return []
    worst = max(chk, key=lambda s: s.due.rate if s.due else 0.0)
    if not (worst.due and worst.due.n):
        return []
    return [f"  unprotected: with a checksum only ({worst.bits} bits), P(DUE) = "
            f"{worst.due.rate:.2g} per block (detected, recomputed); raw storage, with no "
            "checksum, would have returned those blocks as silently wrong KV"]


def summary(rows: Sequence[Mapping[str, Any]], *, max_kl: float = MAX_KL) -> str:
    """What a new user should learn from this run, in a few plain lines per tier."""
    sets = settings(rows)
    if not sets:
        return "no results"
    names = sorted({str(r["sweep"]) for r in rows})
    seeds = sorted({int(r["config"]["seed"]) for r in rows})
    out = [f"sweep {', '.join(names)}: {len(rows)} cells = {len(sets)} settings x "
           f"{len(seeds)} seed(s) over tiers {', '.join(tiers(sets))}"]
    if any(s.kl for s in sets):
        w = max(s.windows for s in sets)
        out.append(f"quality: {MODEL_NOTE}; KL in nats/token against its unmodified cache, "
                   f"95 % CI over up to {w} windows")
    safe_tiers, sdc_total, blocks = [], 0, 0
    for tier in tiers(sets):
        group = [s for s in sets if s.tier == tier]
        rel = [s for s in group if s.sdc is not None and s.code != "raw"]
        sdc_total += sum(s.sdc.n for s in rel if s.sdc)
        blocks += sum(s.sdc.total for s in rel if s.sdc)
        ok = sorted((s for s in group if _safe(s, max_kl) and s.code != "raw"),
                    key=lambda s: (s.overhead or 0.0, s.due.hi if s.due else 0.0))
        cond = "no SDC seen" + (f" and KL < {max_kl:g}" if any(s.kl for s in group) else "")
        if ok:
            safe_tiers.append(tier)
            out.append(f"{tier}: cheapest with {cond}: {_describe(ok[0])}")
            if ok[0].due is not None and ok[0].due.n:
                kept = [s for s in ok if s.due is not None and s.due.n == 0]
                out.append("  " + (f"cheapest that also lost no block (no DUE seen): "
                                   f"{_describe(kept[0])}" if kept else
                                   "every such setting lost some blocks (DUE)"))
        elif rel:
            out.append(f"{tier}: no setting has {cond}")
        else:
            out.append(f"{tier}: no reliability measured; cheapest: "
                       + _describe(min(group, key=lambda s: s.overhead or 0.0)))
        out += _unprotected(group)
        bad = [s for s in rel if s.sdc and s.sdc.n and s.code != "raw"]
        if bad:
            out.append(f"  SDC seen in {len(bad)} setting(s): "
                       + "; ".join(f"{label(s)} {fmt_rate(s.sdc)}" for s in bad[:4]))
    tiers_all = tiers(sets)
    if blocks and sdc_total == 0:
        verdict = (f"verdict: rkv returned no silently wrong KV in {blocks:,} fault-injected "
                   f"block reads; {len(safe_tiers)} of {len(tiers_all)} tiers have a setting "
                   "that is also cheap and accurate (listed above)")
    elif blocks:
        verdict = (f"verdict: {sdc_total} silently wrong block(s) in {blocks:,} reads: check "
                   "the settings listed with SDC before using them")
    else:
        verdict = "verdict: this sweep measured no reliability; add 'reliability' to its metrics"
    out.append(verdict)
    return "\n".join(out)


# -- the Pareto front as a table ------------------------------------------------------------------
_FRONT_TEXT = [Column("tier"), Column("setting"), Column("overhead", align="right"),
               Column("kl", "KL (nats/token)", "right"), Column("sdc", "P(SDC)", "right"),
               Column("due", "P(DUE)", "right")]


def front_rows(rows: Sequence[Mapping[str, Any]], rate: str = "hi") -> list[dict[str, Any]]:
    """The Pareto-optimal settings (:func:`pareto_settings`) as flat rows of numbers: tier,
    setting, overhead, KL mean and 95 % interval, SDC and DUE counts, blocks and rates with
    their 95 % intervals (None where the sweep did not measure them)."""
    _rate_mode(rate)
    sets = settings(rows)
    out = []
    for s in pareto_settings(sets, rate):
        row: dict[str, Any] = {"tier": s.tier, "setting": label(s, varying(sets, s.tier)),
                               "overhead": s.overhead,
                               "kl": s.kl.mean if s.kl else None,
                               "kl_lo": s.kl.lo if s.kl else None,
                               "kl_hi": s.kl.hi if s.kl else None}
        for name, r in (("sdc", s.sdc), ("due", s.due)):
            row.update({f"{name}_n": r.n if r else None, f"{name}_blocks": r.total if r else None,
                        f"{name}_rate": r.rate if r else None, f"{name}_lo": r.lo if r else None,
                        f"{name}_hi": r.hi if r else None})
        out.append(row)
    return out


def front_table(rows: Sequence[Mapping[str, Any]], fmt: str = "text", rate: str = "hi") -> str:
    """The Pareto front per tier as a table (``fmt``: text, markdown, json or csv; the
    machine formats are :func:`front_rows`)."""
    check_format(fmt)
    if fmt in ("json", "csv"):
        return render(front_rows(rows, rate), fmt=fmt)
    _rate_mode(rate)
    sets = settings(rows)
    shown = [{"tier": s.tier, "setting": label(s, varying(sets, s.tier)),
              "overhead": fmt_num(s.overhead), "kl": fmt_interval(s.kl, 2),
              "sdc": fmt_rate(s.sdc), "due": fmt_rate(s.due)}
             for s in pareto_settings(sets, rate)]
    return render(shown, _FRONT_TEXT, fmt=fmt, title="Pareto-optimal settings")


# -- the report ---------------------------------------------------------------------------------
@dataclass
class Report:
    """What :func:`write_report` wrote; ``note`` says why it drew no figures (empty when
    it drew them)."""

    markdown: Path
    figures: list[Path] = field(default_factory=list)
    summary: str = ""
    note: str = ""


def write_report(rows: Sequence[Mapping[str, Any]], out_dir: Path, *,
                 formats: Sequence[str] = ("png", "svg"), rate: str = "hi",
                 max_kl: float = MAX_KL) -> Report:
    """Write ``report.md`` and the figures (``pareto.*``, ``reliability.*``) to ``out_dir``;
    without matplotlib, ``report.md`` only (the report's ``note`` says how to get them)."""
    _rate_mode(rate)
    if not rows:
        raise InputError("no result rows to report on")
    bad = [f for f in formats if f not in ("png", "svg", "pdf")]
    if bad or not formats:
        raise InputError(f"figure formats must be among png, svg, pdf (got {','.join(formats)})")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sets = settings(rows)
    front = pareto_settings(sets, rate)
    drawn = have_matplotlib()
    figures = plot_all(sets, {s.key for s in front}, out, formats, rate) if drawn else []
    note = "" if drawn else NO_MATPLOTLIB
    text = summary(rows, max_kl=max_kl)
    md = out / "report.md"
    md.write_text(markdown(rows, sets, front, figures, out, rate, text, note), encoding="utf-8")
    return Report(md, figures, text, note)
