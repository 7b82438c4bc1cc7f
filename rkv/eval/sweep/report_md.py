"""The markdown of ``rkv report`` (``report.md``): what was swept, the figures and how to read
them, the Pareto-optimal settings per tier, and every setting in a table.

Plain markdown tables (no extra dependency); text from the results file is escaped so that a
``|`` in a code name cannot break a table.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rkv.eval.sweep.report_fmt import (
    MODEL_NOTE,
    fmt_interval,
    fmt_num,
    fmt_rate,
    label,
    tiers,
    used_objectives,
    varying,
)
from rkv.eval.sweep.report_rows import Setting


def _cell(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(_cell(h) for h in header) + " |",
             "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _compact(v: Any) -> str:
    if isinstance(v, dict):
        return ", ".join(f"{k}={x}" for k, x in sorted(v.items())) or "{}"
    return "–" if v is None else str(v)


def _setting_row(s: Setting, extra: Sequence[str], front: set[str]) -> list[str]:
    top1 = fmt_interval(s.top1) if s.top1 else "–"
    return ([str(s.bits or "planned"), f"`{s.code}`"] + [_compact(s.config.get(k)) for k in extra]
            + [f"{len(s.seeds)}", fmt_num(s.overhead),
               f"{s.bytes_per_token:,.0f}" if s.bytes_per_token is not None else "–",
               fmt_interval(s.kl), top1, fmt_interval(s.ppl), fmt_interval(s.delta_ppl),
               fmt_rate(s.sdc),
               fmt_rate(s.due), fmt_num(s.p_due, 2), fmt_num(s.p_sdc, 2), _windows(s),
               "**yes**" if s.key in front else ""])


def _windows(s: Setting) -> str:
    """``faulted/recomputed/wrong KV/broken of N`` for the table (``–``: not measured)."""
    w = s.quality_windows
    if w is None:
        return "–"
    wrong = "–" if w.wrong_kv is None else str(w.wrong_kv)
    return f"{w.faulted}/{w.recomputed}/{wrong}/{w.broken.n} of {w.total}"


def _rel(path: Path, base: Path) -> str:
    return Path(os.path.relpath(path, base)).as_posix()


def markdown(rows: Sequence[Mapping[str, Any]], sets: Sequence[Setting],
             front_list: Sequence[Setting], figures: Sequence[Path], out: Path, rate: str,
             summary_text: str, figures_note: str = "") -> str:
    """The report's markdown; ``figures_note`` says why ``figures`` is empty, if it is."""
    front = {s.key for s in front_list}
    sweeps = sorted({str(r["sweep"]) for r in rows})
    versions = sorted({str(r.get("version")) for r in rows if r.get("version")})
    seeds = sorted({int(r["config"]["seed"]) for r in rows})
    have = {m: sum(r.get(m) is not None for r in rows) for m in ("reliability", "quality", "cost")}
    text = [f"# Sweep report: {_cell(', '.join(sweeps))}", "",
            f"{len(rows)} result rows: {len(sets)} settings x {len(seeds)} seed(s) "
            f"({', '.join(map(str, seeds[:8]))}{', …' if len(seeds) > 8 else ''}), tiers "
            f"{', '.join(tiers(sets))}; rkv {', '.join(versions) or 'version unknown'}. "
            "Written by `rkv report`.", ""]
    missing = [f"{m} in {len(rows) - n} of {len(rows)} rows" for m, n in have.items()
               if n < len(rows)]
    if missing:
        text += [f"**Not measured:** {'; '.join(missing)} (the sweep did not ask for them, "
                 "or those cells have not run yet); figures and the front use what exists.", ""]
    text += [
        "How the numbers were made:", "",
        f"- Quality: {MODEL_NOTE}. KL is the mean KL divergence of its next-token "
        "distributions (nats per token) from those of its unmodified KV cache, top-1 the "
        "same-top-token rate, perplexity on the scored tokens (its CI spans the windows' "
        "different texts; the paired change against the unmodified cache, Δ perplexity, is "
        "the one to compare); each with a 95 % t interval over the finite text windows "
        "(with 4 windows, wide). Faults are injected into the quality windows' stored KV "
        "at each setting's quality multiplier; a window whose scores are not finite (raw KV "
        "with a flipped exponent bit) is *broken*: counted with its 95 % Wilson interval "
        "and left out of the means. Seeds of one setting are pooled (mean weighted by "
        "windows; the CI is not narrowed by the number of seeds, which score the same "
        "windows, and widened to the seeds' spread, with the t quantile, where larger).",
        "- Reliability: per-block rates of SDC (silently wrong data returned) and DUE "
        "(detected, uncorrectable: the blocks are recomputed) through rkv's real read path, with "
        "95 % Wilson intervals on the counts pooled over seeds; \"0/N (≤ x)\" means none was "
        "seen in N blocks, x being the upper bound. P(DUE) and P(SDC) analytic are "
        "`rkv.reliability.analytic.predict` for the same setting.",
        "- Storage overhead: `cost.overhead`, stored bytes per token (data, ECC, headers) "
        "divided by the fp16 KV's bytes per token, minus 1 (-0.75: four times smaller).",
        f"- Pareto-optimal: no other setting of the tier is at least as good on every one of "
        f"storage overhead, KL, P(SDC) and P(DUE) and better on one; rates taken at their "
        f"{'95 % upper bound' if rate == 'hi' else 'point estimate'}.", "",
        "## Summary", "", "```text", summary_text, "```", ""]
    if not figures and figures_note:
        text += ["## Figures", "", f"{_cell(figures_note[0].upper() + figures_note[1:])}; "
                 "then `rkv report RESULTS.jsonl` draws them.", ""]
    if figures:
        text += ["## Figures", ""]
        for f in figures:
            if f.suffix == ".png":
                text += [f"![{f.stem}]({_rel(f, out)})", ""]
        others = [f for f in figures if f.suffix != ".png"]
        if others:
            text += ["Also as " + ", ".join(f"[{_rel(f, out)}]({_rel(f, out)})"
                                           for f in others) + ".", ""]
        text += [
            "How to read `pareto`: one panel per tier (or tier and fault preset); each point is "
            "a setting, its marker and colour its protection: raw storage (no check: the KV "
            "comes back as the medium left it), rkv with a checksum only (`chk`), with a code "
            "(`rs239` = rs(255,239), `shard16+2` = shardrs(k=16,m=2)), or planned per block. "
            "Each bit-width's group is labelled once above it. x is the stored bytes per token "
            "(log; left is cheaper), y the KL of the quality windows, which met faults at the "
            "multiplier in the panel's title (linear below 1e-4, logarithmic above; down is "
            "better), with its 95 % t interval over the finite windows; the title also says "
            "what raw storage's windows met (faults, wrong KV, recomputes, broken windows: "
            "non-finite scores, left out of its KL). A DUE is charged as its recompute: the "
            "window is scored on the rebuilt cache. Ringed points are Pareto-optimal. "
            "`reliability` shows the per-block rates of the campaigns per protection and "
            "bits: red SDC, blue DUE (for raw storage: the medium reported the loss), filled "
            "with its 95 % Wilson interval where seen; where none was seen, an open grey "
            "marker with a downward caret at the 95 % upper bound (the rate is at most "
            "that).", ""]
    text += ["## Pareto-optimal settings", ""]
    for tier in tiers(sets):
        group = [s for s in front_list if s.tier == tier]
        extra = varying(sets, tier)
        objs = used_objectives([s for s in sets if s.tier == tier], rate)
        text += [f"### {_cell(tier)}", "",
                 f"Objectives compared: {', '.join(objs) or 'none measured'}.", ""]
        for s in group:
            bits = s.bits or "planned"
            text.append(f"- **{_cell(label(s, extra))}** (`{_cell(s.code)}`, {bits} bits): "
                        f"overhead {fmt_num(s.overhead)}, KL {fmt_interval(s.kl)}, "
                        f"SDC {fmt_rate(s.sdc)}, DUE {fmt_rate(s.due)}")
        text.append("")
    text += ["## All settings", "",
             f"KL, top-1 and perplexity: {MODEL_NOTE}; mean [95 % CI]. Rates per block.", ""]
    for tier in tiers(sets):
        extra = varying(sets, tier)
        group = sorted((s for s in sets if s.tier == tier),
                       key=lambda s: (-(s.bits or 0), s.code, s.overhead or 0.0))
        header = (["bits", "code", *extra, "seeds", "overhead", "bytes/token", "KL (nats)",
                   "top-1", "perplexity", "Δ perplexity (paired)", "P(SDC) seen",
                   "P(DUE) seen", "P(DUE) analytic", "P(SDC) analytic",
                   "windows: faults/recomputed/wrong KV/broken", "Pareto"])
        ref = next((s.ppl_ref for s in group if s.ppl_ref is not None), None)
        text += [f"### {_cell(tier)}", ""]
        if ref is not None:
            text += [f"Reference perplexity (unmodified cache): {ref:.4g}.", ""]
        text += [table(header, [_setting_row(s, extra, front) for s in group]), ""]
    return "\n".join(text)
