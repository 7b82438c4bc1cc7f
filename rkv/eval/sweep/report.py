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
that tier, so that every setting stays comparable. A setting with broken quality windows
(non-finite scores: raw KV with flipped exponent bits) counts as worse in KL than any
setting without.

The summary states only what the run measured: per tier, the cheapest accurate rkv setting,
then raw storage against rkv at the same bits (per-block SDC, DUE and degraded rates from the
campaigns; from the quality windows, how many met faults, were corrected, recomputed, got
wrong KV back or broke, and the KL over the finite ones).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rkv.errors import InputError
from rkv.eval.sweep.report_fmt import (
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
        # A broken window (non-finite scores) is worse than any finite KL.
        vec = [[math.inf if o == "kl" and s.broken_windows else float(objectives(s, rate)[o]
                                                                     or 0.0)
                for o in names] for s in group]
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
            and not s.broken_windows and (s.kl is None or s.kl.mean < max_kl))


def _describe(s: Setting) -> str:
    parts = ["bits and codes planned by placement" if s.bits is None
             else f"{s.bits} bits + {s.code}"]
    if s.overhead is not None:
        parts.append(f"overhead {fmt_num(s.overhead)}"
                     + (f" ({s.bytes_per_token:,.0f} B/token)" if s.bytes_per_token else ""))
    if s.kl is not None:
        w = s.quality_windows
        # A recomputed window is scored on the rebuilt cache: say so next to its KL.
        redone = f" ({w.recomputed}/{w.total} windows recomputed)" if w and w.recomputed else ""
        parts.append(f"KL {fmt_interval(s.kl, 2)}{redone}")
    parts.append(f"DUE {fmt_rate(s.due)}")
    return ", ".join(parts)


def _count(n: int, total: int) -> str:
    return f"{n}/{total}"


def _windows_text(s: Setting) -> str:
    """What the setting's quality windows met and what came of it (measured counts)."""
    w = s.quality_windows
    if w is None:
        return ""
    parts = [f"quality windows: {_count(w.faulted, w.total)} met faults",
             f"{w.corrected} corrected",
             f"{w.recomputed} recomputed ({s.recomputed_tokens} tokens)"]
    if w.wrong_kv is not None:
        parts.append(f"{w.wrong_kv} returned wrong KV")
    if w.degraded_blocks:
        parts.append(f"{w.degraded_blocks} degraded blocks")
    b = w.broken
    parts.append(f"broken {b.n}/{b.total} [{fmt_num(b.lo, 2)}, {fmt_num(b.hi, 2)}]")
    finite = w.total - b.n
    kl = (f"KL {fmt_interval(s.kl, 2)} over {finite} finite window(s)" if finite
          else "KL undefined (no finite window)")
    return ", ".join(parts) + "; " + kl


def _outcomes(name: str, s: Setting) -> str:
    """One measured line: per-block SDC, DUE and degraded rates, then the windows."""
    bits = [f"  {name}: SDC {fmt_rate(s.sdc)}, DUE {fmt_rate(s.due)}"]
    if s.degraded is not None:
        bits.append(f"degraded {fmt_rate(s.degraded)}")
    text = ", ".join(bits)
    win = _windows_text(s)
    if win:
        text += "\n      " + win
    elif s.kl is not None:
        text += f"; KL {fmt_interval(s.kl, 2)}"
    return text


def _raw_vs_rkv(group: Sequence[Setting]) -> list[str]:
    """Raw storage against rkv at the same bits (16: the values as computed), each as
    measured: per-block rates from the campaigns, then the quality windows."""
    raw = [s for s in group if s.raw]
    if not raw:
        return []
    bits = raw[0].bits
    out = [_outcomes(f"raw storage, {bits} bits (no checksum; DUE = the medium reported "
                     "the loss)", raw[0])]
    same = sorted((s for s in group if not s.raw and s.bits == bits),
                  key=lambda s: s.overhead or 0.0)
    out += [_outcomes(f"rkv {label(s)}", s) for s in same]
    return out


def _scope(group: Sequence[Setting]) -> str:
    """The panel's fault model and multipliers, e.g. ``dram-ddr5; block rates at faults
    x1000, quality windows at x30000``."""
    c = group[0].config
    parts = [str(c.get("preset") or "")]
    mults = {s.config.get("ber_multiplier") for s in group}
    if len(mults) == 1 and c.get("ber_multiplier"):
        parts.append(f"block rates at faults x{c['ber_multiplier']:g}")
    qm = {s.quality_multiplier for s in group if s.quality_multiplier is not None}
    if len(qm) == 1:
        parts.append(f"quality windows at x{next(iter(qm)):g}")
    return "; ".join(p for p in parts if p)


def summary(rows: Sequence[Mapping[str, Any]], *, max_kl: float = MAX_KL) -> str:
    """What a new user should learn from this run, in a few plain lines per tier: only what
    the run measured (rates from its campaigns, counts and KL from its quality windows)."""
    sets = settings(rows)
    if not sets:
        return "no results"
    names = sorted({str(r["sweep"]) for r in rows})
    seeds = sorted({int(r["config"]["seed"]) for r in rows})
    out = [f"sweep {', '.join(names)}: {len(rows)} cells = {len(sets)} settings x "
           f"{len(seeds)} seed(s) over {', '.join(tiers(sets))}"]
    if any(s.kl for s in sets):
        w = max(s.windows for s in sets)
        out.append(f"quality: {MODEL_NOTE}; KL in nats/token against its unmodified cache, "
                   f"95 % t interval over the finite windows (up to {w}: wide)")
    safe_tiers, sdc_total, blocks = [], 0, 0
    raw_sdc = raw_blocks = raw_wrong = raw_windows = raw_broken = 0
    for tier in tiers(sets):
        group = [s for s in sets if s.tier == tier]
        rel = [s for s in group if s.sdc is not None and not s.raw]
        sdc_total += sum(s.sdc.n for s in rel if s.sdc)
        blocks += sum(s.sdc.total for s in rel if s.sdc)
        for s in group:
            if s.raw and s.sdc is not None:
                raw_sdc += s.sdc.n
                raw_blocks += s.sdc.total
            if s.raw and s.quality_windows is not None:
                raw_wrong += s.quality_windows.wrong_kv or 0
                raw_windows += s.quality_windows.total
                raw_broken += s.quality_windows.broken.n
        scope = _scope(group)
        out.append(f"{tier}" + (f" ({scope})" if scope else "") + ":")
        ok = sorted((s for s in group if _safe(s, max_kl) and not s.raw),
                    key=lambda s: (s.overhead or 0.0, s.due.hi if s.due else 0.0))
        cond = "no SDC seen" + (f" and KL < {max_kl:g}" if any(s.kl for s in group) else "")
        if ok:
            safe_tiers.append(tier)
            out.append(f"  cheapest with {cond}: {_describe(ok[0])}")
            if ok[0].due is not None and ok[0].due.n:
                kept = [s for s in ok if s.due is not None and s.due.n == 0]
                out.append("  " + (f"cheapest that also lost no block (no DUE seen): "
                                   f"{_describe(kept[0])}" if kept else
                                   "every such setting lost some blocks (DUE)"))
        elif rel:
            out.append(f"  no setting has {cond}")
        else:
            out.append("  no reliability measured; cheapest: "
                       + _describe(min(group, key=lambda s: s.overhead or 0.0)))
        out += _raw_vs_rkv(group)
        bad = [s for s in rel if s.sdc and s.sdc.n]
        if bad:
            out.append(f"  rkv SDC seen in {len(bad)} setting(s): "
                       + "; ".join(f"{label(s)} {fmt_rate(s.sdc)}" for s in bad[:4]))
    tiers_all = tiers(sets)
    if blocks and sdc_total == 0:
        verdict = (f"verdict: rkv returned no silently wrong KV in {blocks:,} fault-injected "
                   f"block reads; {len(safe_tiers)} of {len(tiers_all)} panels have a setting "
                   "that is also cheap and accurate (listed above)")
    elif blocks:
        verdict = (f"verdict: rkv returned {sdc_total} silently wrong block(s) in "
                   f"{blocks:,} fault-injected reads: check the settings listed with SDC")
    else:
        verdict = "verdict: this sweep measured no reliability; add 'reliability' to its metrics"
    out.append(verdict)
    if raw_blocks:
        line = (f"raw storage returned {raw_sdc} silently wrong block(s) in {raw_blocks:,} "
                "fault-injected block reads")
        if raw_windows:
            line += (f", and wrong KV in {raw_wrong} of {raw_windows} quality windows "
                     f"({raw_broken} broken)")
        out.append(line)
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
