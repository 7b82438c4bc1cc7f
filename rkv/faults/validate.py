"""The validation matrix: campaigns against the analytic model, every preset x every code.

Each cell runs a campaign through the real engine (conditional sampling for the presets, so
that every block gets a fault; direct sampling for raw-BER rates where that is already
frequent) and compares, two-sided, the share of faulty blocks that end *lost* (DUE) and
*recovered* (corrected or masked) with what :func:`rkv.faults.reliability.predict` says
conditioned on a fault (``p_due / p_error`` and ``p_corrected / p_error``). The z-score is
``(count - n p) / sqrt(n p (1 - p))``; a cell passes at ``|z| <= 4`` (with one count of
slack when ``n p (1 - p)`` is tiny). A campaign counts outcomes by decoding real records, the
model by binomial tails and class-by-class pattern judgement: two independent estimates.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

from rkv.faults.campaign import CampaignConfig, run_campaign

#: Blocks of the full matrix: 256 tokens x 3 heads x 64 dims x fp16 x (K, V) = 192 KiB, one
#: SmolLM2-135M layer (small blocks would make every sector or row fault fatal, a degenerate
#: check). The quick subset uses 16 KiB blocks (64 tokens x 1 head) to stay within seconds.
FULL_BLOCK = (256, 3, 64)
QUICK_BLOCK = (64, 1, 64)
PRESETS = ("dram-ddr4", "dram-ddr5", "cxl", "nvme-tlc")
CODES = ("none", "rs(255,239)", "rs(255,239,interleave=8)", "bch(m=13,t=8)",
         "shardrs(k=8,m=2)")
#: Raw-BER rates where corrections and losses are both frequent for the codes above.
RAW_BERS = (4e-6, 2e-5, 1e-4)
#: DRAM's word and row faults alone (SC12 rates): conditioned on a fault, the full presets
#: are nearly all bank-sized events that lose any 192 KiB block, so these variants are where
#: poisoned lines, reported as erasures, meet the codes. ``cxl`` adds its link errors.
_OFF = {"fit_transient": 0.0, "fit_permanent": 0.0}
_SMALL_MODES = {"single-word": {"fit_transient": 1.4, "fit_permanent": 0.3},
                "single-row": {"fit_transient": 0.2, "fit_permanent": 8.2},
                "single-bank": _OFF, "multi-bank": _OFF, "multi-rank": _OFF}
VARIANTS: dict[str, dict[str, Any]] = {
    "dram-ddr5 words+rows": {"preset": "dram-ddr5", "modes": _SMALL_MODES},
    "cxl words+rows": {"preset": "cxl", "controller_fit": 0.0,
                       "media": {"preset": "dram-ddr5", "modes": _SMALL_MODES}},
}
Z_LIMIT = 4.0


@dataclass(frozen=True)
class Cell:
    """One campaign of the matrix and its comparison with the model."""

    model: str
    protection: str
    hours: float
    blocks: int
    due: int
    recovered: int
    p_due: float          # analytic, conditioned on a fault
    p_recovered: float
    z_due: float
    z_recovered: float
    seconds: float

    @property
    def ok(self) -> bool:
        return abs(self.z_due) <= Z_LIMIT and abs(self.z_recovered) <= Z_LIMIT


def z_score(count: int, n: int, p: float) -> float:
    """Two-sided z of ``count`` successes in ``n`` against probability ``p`` (0 when the
    difference is within one count of a degenerate expectation)."""
    var = n * p * (1.0 - p)
    diff = count - n * p
    if var < 1.0:
        return 0.0 if abs(diff) <= 1.0 else math.copysign(math.inf, diff)
    return diff / math.sqrt(var)


def grid(quick: bool = False) -> list[tuple[str | dict[str, Any], str, float]]:
    """(fault model, protection, hours) of every cell; ``quick``: a subset for the tests."""
    models: list[str | dict[str, Any]] = [*PRESETS, *VARIANTS]
    models += [{"model": "raw-ber", "ber": b} for b in RAW_BERS]
    codes: Iterable[str] = CODES
    hours: tuple[float, ...] = (1.0, 720.0)
    if quick:
        models = ["nvme-tlc", "cxl words+rows", {"model": "raw-ber", "ber": 1e-4}]
        codes = ("rs(255,239,interleave=8)", "shardrs(k=8,m=2)")
        hours = (24.0,)
    out: list[tuple[str | dict[str, Any], str, float]] = []
    for m in models:
        for code in codes:
            for h in hours:
                if isinstance(m, dict) and h != hours[0]:
                    continue          # a raw BER does not depend on the residency
                out.append((m, code, h))
    return out


def label(model: str | dict[str, Any]) -> str:
    return model if isinstance(model, str) else f"raw-ber {model['ber']:g}"


def run_cell(model: str | dict[str, Any], protection: str, hours: float, *, trials: int = 40,
             seed: int = 1, workers: int = 1,
             block: tuple[int, int, int] = FULL_BLOCK) -> Cell:
    """One cell: ``model`` is a preset, a :data:`VARIANTS` name or a raw-BER dict."""
    spec = VARIANTS.get(model, model) if isinstance(model, str) else model
    raw = isinstance(spec, dict) and spec.get("model") == "raw-ber"
    chunk_tokens, kv_heads, head_dim = block
    cfg = CampaignConfig(tier="nvme", fault_model=spec, protection=protection, hours=hours,
                         trials=trials, blocks=10, seed=seed, workers=workers,
                         sampling="direct" if raw else "conditional",
                         chunk_tokens=chunk_tokens, kv_heads=kv_heads, head_dim=head_dim)
    s = run_campaign(cfg)
    p = s.prediction
    n = s.blocks - s.counts["clean"]          # blocks that got a fault
    share_due = p.p_due / p.p_error if p.p_error > 0 else 0.0
    share_rec = p.p_corrected / p.p_error if p.p_error > 0 else 0.0
    recovered = s.counts["corrected"] + s.counts["masked"]
    return Cell(label(model), protection, hours, n, s.counts["due"], recovered, share_due,
                share_rec, z_score(s.counts["due"], n, share_due),
                z_score(recovered, n, share_rec), s.seconds)


def run_matrix(quick: bool = False, *, trials: int = 40, workers: int = 1,
               progress: Callable[[int, int, Cell], None] | None = None) -> list[Cell]:
    cells = grid(quick)
    out = []
    for i, (model, code, hours) in enumerate(cells):
        cell = run_cell(model, code, hours, trials=trials, workers=workers,
                        block=QUICK_BLOCK if quick else FULL_BLOCK)
        out.append(cell)
        if progress is not None:
            progress(i + 1, len(cells), cell)
    return out


def markdown(cells: list[Cell], fmt: str = "markdown") -> str:
    """The cells as a table through :mod:`rkv.ui` (``markdown`` by default: the form
    docs/reliability.md shows; ``text`` for a terminal)."""
    from rkv.ui import Column, render

    cols = [Column("model"), Column("protection"), Column("hours", align="right", fmt="g"),
            Column("blocks", "faulty blocks", "right"), Column("due", "lost", "right"),
            Column("p_due", "model", "right", ".3g"), Column("z_due", "z", "right", "+.1f"),
            Column("recovered", align="right"),
            Column("p_recovered", "model", "right", ".3g"),
            Column("z_recovered", "z", "right", "+.1f")]
    return render([asdict(c) for c in cells], cols, fmt=fmt).rstrip("\n")


def to_json(cells: list[Cell]) -> list[dict[str, Any]]:
    return [{**asdict(c), "ok": c.ok} for c in cells]
