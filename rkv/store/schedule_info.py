"""``rkv info --schedule``: the scrub schedule of each tier of a store
(:mod:`rkv.reliability.schedule`).

Per tier: its fault model, the code and bits of its typical block (the pipeline holding the
most bytes in the tier's stored mix; the tier's ``ecc`` at 16 bits when it is empty), the
block's data bytes (K and V of one layer of one chunk of the store's first model, times
bits / 16; a 192 KiB SmolLM2-135M block when the store has no model yet), and the schedule
for the store's ``EngineConfig.scrub_target_p_due``.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from rkv.format.dtypes import itemsize
from rkv.reliability.schedule import DEFAULT_BLOCK_BYTES, schedule
from rkv.ui.tables import Column, render

log = logging.getLogger(__name__)

__all__ = ["add_schedule", "block_bytes", "human_hours", "schedule_rows", "schedule_text"]



def block_bytes(stats: dict[str, Any]) -> tuple[int, str]:
    """(data bytes of a full-precision block, where the figure comes from)."""
    tokens = int(stats.get("chunk_tokens", 256))
    for m in stats.get("models", []):
        try:
            n = 2 * tokens * int(m["n_kv_heads"]) * int(m["head_dim"]) * itemsize(m["dtype"])
        except (KeyError, TypeError, ValueError):
            continue
        if n > 0:
            return n, str(m.get("model_id", "model"))
    return DEFAULT_BLOCK_BYTES, "SmolLM2-135M (no model stored yet)"


def _typical_pipeline(tier: dict[str, Any]) -> tuple[int, str]:
    """(bits, code) of the pipeline holding the most bytes in the tier (mix is largest first);
    a block with split K and V widths counts as their mean."""
    for entry in tier.get("mix", {}).values():
        if entry.get("code") is not None and entry.get("bits") is not None:
            vbits = entry.get("vbits") or entry["bits"]
            return (int(entry["bits"]) + int(vbits)) // 2, str(entry["code"])
    return 16, str(tier.get("ecc", "none"))


def add_schedule(stats: dict[str, Any], target: float) -> dict[str, Any]:
    """Put ``stats["schedule"]`` = per tier ``ScrubSchedule.to_dict()`` (plus ``bits`` and the
    block's source) into `Engine.stats` output, and return it. Takes seconds per tier: every
    schedule runs `predict` a handful of times."""
    full, source = block_bytes(stats)
    out: dict[str, Any] = {"target_p_due": target, "block_source": source, "tiers": {}}
    for name, tier in stats["tiers"].items():
        bits, code = _typical_pipeline(tier)
        nbytes = max(1, full * bits // 16)
        s = schedule(tier["fault_model"], code, nbytes, target, name=tier["fault_model"])
        log.info("schedule: tier %s (%s, %d-bit %s, %d-byte blocks): refresh %s, scrub %s",
                 name, tier["fault_model"], bits, code, nbytes, human_hours(s.refresh_hours),
                 human_hours(s.scrub_hours))
        out["tiers"][name] = {"bits": bits, **s.to_dict()}
    stats["schedule"] = out
    return out


def human_hours(h: float | None) -> str:
    """1.6 min, 3.2 h, 12 d, 4.1 y; ``never`` for inf (None in JSON)."""
    if h is None or math.isinf(h):
        return "never"
    if h <= 0.0:
        return "infeasible"
    if h < 1.0 / 60.0:
        return f"{h * 3600.0:.3g} s"
    if h < 1.0:
        return f"{h * 60.0:.3g} min"
    if h < 48.0:
        return f"{h:.3g} h"
    if h < 2 * 8766.0:
        return f"{h / 24.0:.3g} d"
    return f"{h / 8766.0:.3g} y"


def schedule_rows(stats: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per tier of the schedule `add_schedule` filled in (hours: None for never)."""
    out = []
    for name, sc in stats["schedule"]["tiers"].items():
        out.append({"tier": name, "data_bytes": sc["data_bytes"], "bits": sc["bits"],
                    "code": sc["code"], "refresh_hours": sc["refresh_hours"],
                    "scrub_hours": sc["scrub_hours"],
                    "p_due_per_block_day_scrubbed": sc["p_due_per_block_day_scrubbed"],
                    "p_due_per_block_day_unscrubbed": sc["p_due_per_block_day_unscrubbed"],
                    "note": sc.get("note") or ""})
    return out


def _g2(x: float) -> str:
    return f"{x:.2g}"


def _kib(n: int) -> str:
    return f"{n / 1024:.4g} KiB"


_COLUMNS = [Column("tier"), Column("data_bytes", "data", "right", _kib),
            Column("bits", align="right"), Column("code"),
            Column("refresh_hours", "refresh age", "right", human_hours),
            Column("scrub_hours", "scrub every", "right", human_hours),
            Column("p_due_per_block_day_scrubbed", "scrubbed", "right", _g2),
            Column("p_due_per_block_day_unscrubbed", "unscrubbed", "right", _g2)]


def schedule_text(stats: dict[str, Any], fmt: str = "text") -> str:
    """The table `add_schedule` filled in, as ``rkv info --schedule`` prints it (``fmt``:
    text, json, csv or markdown; the machine formats are :func:`schedule_rows`)."""
    rows = schedule_rows(stats)
    if fmt in ("json", "csv"):
        return render(rows, [*(Column(k) for k in rows[0])] if rows else None, fmt=fmt)
    sch = stats["schedule"]
    horizon = next(iter(sch["tiers"].values()))["horizon_hours"] if rows else 0.0
    head = (f"scrub schedule (target P(DUE) {sch['target_p_due']:g} per block; blocks of "
            f"{sch['block_source']}; P(DUE) per block-day scrubbed at the interval, and "
            f"unscrubbed over {human_hours(horizon)}):")
    notes = [f"  note ({r['tier']}): {r['note']}" for r in rows if r["note"]]
    table = render(rows, _COLUMNS, fmt=fmt, indent=2)
    return "\n".join([head, *([""] if fmt == "markdown" else []), table.rstrip("\n"),
                      *notes]) + "\n"
