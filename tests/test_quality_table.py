"""The quality table through rkv.ui: the same rows as text, markdown, json and csv."""

from __future__ import annotations

import csv
import io
import json

from rkv.eval.quality import Quality
from rkv.eval.quality_table import format_table


def _q(label: str, ppl: list[float], kl: list[float], redo: int = 0) -> Quality:
    w = tuple({"perplexity": p, "ref_perplexity": 10.0, "kl": k, "top1": 0.9,
               "recomputed_tokens": 0} for p, k in zip(ppl, kl, strict=True))
    return Quality(label, sum(ppl) / len(ppl), sum(kl) / len(kl), 0.9, len(ppl), 0, 31.5,
                   {"ok": 90, "corrected": 3}, 0.012, w, redo)


def test_formats() -> None:
    rows = [_q("fp16 (untouched)", [10.0, 10.0, 10.0], [0.0, 0.0, 0.0]),
            _q("4-bit, rs(255,239)", [10.2, 10.4, 10.3], [0.01, 0.02, 0.015], redo=64)]
    text = format_table(rows)
    assert "\x1b[" not in text
    lines = text.splitlines()
    assert "KL nats (95% CI)" in lines[0] and "4-bit, rs(255,239)" in text
    assert "0.300 +/- " in text and "64 tok" in text and "corrected=3, ok=90" in text
    md = format_table(rows, "markdown")
    assert md.splitlines()[1].startswith("|") and "| 4-bit, rs(255,239) |" in md
    doc = json.loads(format_table(rows, "json"))
    assert doc[1]["perplexity"] == rows[1].perplexity and doc[1]["recomputed"] == "64 tok"
    got = list(csv.DictReader(io.StringIO(format_table(rows, "csv"))))
    assert [r["setting"] for r in got] == ["fp16 (untouched)", "4-bit, rs(255,239)"]
