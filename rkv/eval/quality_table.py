"""The quality table (``rkv quality``): one row per setting, means over windows with 95 %
t half-widths, through :mod:`rkv.ui` (text, markdown, json, csv)."""

from __future__ import annotations

import math

from rkv.eval.quality import MeanCI, Quality
from rkv.ui import Column, render


def _pm(c: MeanCI | None, fmt: str) -> str:
    if c is None or math.isnan(c.half):
        return "" if c is None else f"{c.mean:{fmt}}"
    return f"{c.mean:{fmt}} +/- {c.half:{fmt}}"


def format_table(rows: list[Quality], fmt: str = "text") -> str:
    """The table: means over windows with 95 % t half-widths (the perplexity change is paired
    with the untouched cache window by window), through :mod:`rkv.ui` (text, markdown, json,
    csv)."""
    cols = [Column("setting"), Column("perplexity", align="right", fmt=".3f"),
            Column("d_ppl", "d ppl (95% CI)", "right"),
            Column("kl", "KL nats (95% CI)", "right"),
            Column("top1", "top-1 (95% CI)", "right"),
            Column("snr_db", "SNR dB", "right", ".1f"),
            Column("attn_err", "attn err", "right", ".2g"),
            Column("recomputed", align="right"), Column("blocks")]
    out = []
    for q in rows:
        ci = q.ci()
        out.append({
            "setting": q.label, "perplexity": q.perplexity,
            "d_ppl": _pm(ci.get("delta_perplexity"), ".3f"), "kl": _pm(ci.get("kl"), ".3g"),
            "top1": _pm(ci.get("top1"), ".3f"), "snr_db": q.snr_db,
            "attn_err": q.attention_error,
            "recomputed": f"{q.recomputed_tokens} tok" if q.recomputed_tokens else "0",
            "blocks": ", ".join(f"{k}={v}" for k, v in sorted(q.report.items()) if v)})
    return render(out, cols, fmt=fmt)
