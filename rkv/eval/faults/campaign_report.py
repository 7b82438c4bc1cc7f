"""What a campaign's output says: a verdict first (silent corruptions and recomputes, rkv next
to raw storage), the fault model by name, why raw and protected agree when they do, then the
outcome tables (text, JSON, CSV or Markdown through :mod:`rkv.ui.tables`)."""

from __future__ import annotations

import math
from functools import lru_cache
from importlib import resources
from typing import Any

from rkv.errors import ConfigError
from rkv.eval.faults.campaign_types import CampaignConfig, Summary
from rkv.eval.faults.harness import OUTCOMES
from rkv.ui.sizes import human_bytes
from rkv.ui.tables import Column, check_format, render

__all__ = ["explain_agreement", "fault_model_text", "format_report", "format_summary",
           "outcome_rows", "verdict"]

#: Verdict rates are per 10^k stored blocks, the largest k of these that keeps them readable.
_SCALES = (12, 9, 6, 3, 0)


# -- the fault model and the block ----------------------------------------------------------------
@lru_cache(maxsize=32)
def _preset_note(name: str) -> str:
    """A preset's one-line description (the parenthesis on its file's first line)."""
    try:
        first = (resources.files("faultmodels") / "presets" / f"{name}.toml").read_text(
            encoding="utf-8").splitlines()[0]
    except (OSError, IndexError):
        return ""
    return first[first.find("(") + 1:first.rfind(")")] if "(" in first else ""


def _config(s: Summary) -> CampaignConfig:
    return CampaignConfig.from_dict(dict(s.config))


def fault_model_text(cfg: CampaignConfig) -> str:
    """``nvme-tlc (3D TLC NAND SSD ...)``, then any overridden parameter and acceleration."""
    from rkv.store.config import default_tiers

    spec: Any = cfg.fault_model or next(
        t for t in default_tiers() if t.name == cfg.tier).fault_model
    over: dict[str, Any] = {}
    if isinstance(spec, dict):
        over = {k: v for k, v in spec.items() if k not in ("preset", "model")}
        name = str(spec.get("preset") or spec.get("model") or "custom")
    else:
        name = str(spec)
    note = _preset_note(name)
    text = name + (f" ({note})" if note else "")
    if not cfg.fault_model:
        text += f", the {cfg.tier} tier's default"
    if over:
        text += "; with " + ", ".join(f"{k}={v}" for k, v in sorted(over.items()))
    if cfg.ber_multiplier != 1:
        text += f"; every fault rate x {cfg.ber_multiplier:g} (accelerated)"
    return text


def block_text(cfg: CampaignConfig, record_bytes: int) -> str:
    """The stored block as it is: data bytes after quantization, and the record with code
    and header."""
    shape = f"{cfg.chunk_tokens} tokens x {cfg.kv_heads} KV heads x {cfg.head_dim} dims"
    form = cfg.dtype if cfg.bits >= 16 else f"{cfg.bits}-bit KIVI of {cfg.dtype}"
    return (f"blocks of {human_bytes(cfg.data_bytes)} ({shape}, K and V, {form}) stored as "
            f"{human_bytes(record_bytes)} records")


# -- the verdict ----------------------------------------------------------------------------------
def _scale(summaries: list[Summary]) -> int:
    top = max(s.rates[o][0] for s in summaries for o in ("sdc", "due"))
    return next((k for k in _SCALES if top * 10.0 ** k < 1e5), 0)


def _per(cfg: CampaignConfig, k: int) -> str:
    unit = "block-days" if cfg.hours == 24 else f"blocks kept {cfg.hours:g} h"
    return (f"per 10^{k} {unit}" if k else f"per {unit[:-1] if cfg.hours == 24 else unit}"
            ).replace("per blocks kept", "per block kept")


def _num(x: float) -> str:
    return "0" if x == 0 else (f"{x:,.0f}" if x >= 100 else f"{x:.2g}")


def _side(s: Summary, k: int, *, bound: bool) -> tuple[str, str]:
    """(counts, rates per 10^k blocks) of one run: silent corruptions and recomputes."""
    c = s.counts
    sdc, due = c["sdc"], c["due"]
    counts = (f"{sdc} silent corruption{'s' * (sdc != 1)}, {due} recompute{'s' * (due != 1)}"
              + (f", {c['corrected']} corrected" if c["corrected"] else ""))

    def one(o: str) -> str:
        r, _, hi = s.rates[o]
        text = _num(r * 10.0 ** k)
        if bound and r == 0 and hi > 0:
            text += f" (≤ {_num(hi * 10.0 ** k)} at 95 %)"
        return text

    return counts, f"silent {one('sdc')}, recomputes {one('due')}"


def verdict(s: Summary, raw: Summary | None = None) -> str:
    """One or two lines: what rkv returned, then what raw storage returned, from the same
    fault model. Counts are of fault-injected reads; rates are per 10^12 stored blocks."""
    cfg = _config(s)
    head = (f"{s.blocks:,} fault-injected reads" if s.sampling != "direct"
            else f"{s.blocks:,} reads ({s.blocks - s.counts['clean']:,} with a fault)")
    name = "raw storage" if s.protection == "raw" else "rkv"
    k = _scale([s] if raw is None else [s, raw])
    counts, rates = _side(s, k, bound=True)
    lines = [f"{name}: {counts} in {head}; {_per(cfg, k)}: {rates}"]
    if raw is not None:
        rc, rr = _side(raw, k, bound=False)
        lines.append(f"raw storage (no checksum, no code), same faults: {rc}; "
                     f"{_per(cfg, k)}: {rr}")
    return "\n".join(lines)


#: Per fault model kind, a parameter that raises the faults its medium does not report.
_UNREPORTED_KNOB = {"cxl": "--param link_ber=1e-6 (the link's flits escaping CRC)",
                    "nand": "--param silent_rate=1e-3 (the drive's silent corruptions)"}


def _unreported(cfg: CampaignConfig) -> tuple[float, list[str]]:
    """The share of the model's fault rate that its medium does not report, and those
    faults' names. Reported faults (poisoned lines, unreadable sectors) are seen by raw
    storage too, which then recomputes."""
    events = cfg.model().events(cfg.data_bytes, cfg.hours)
    total = sum(e.mean for e in events)
    silent = [e for e in events if not e.detected and e.mean > 0]
    share = sum(e.mean for e in silent) / total if total > 0 else 0.0
    return share, sorted({e.label for e in silent})


def explain_agreement(s: Summary, raw: Summary | None) -> str:
    """Why rkv and raw storage gave the same numbers (empty when they did not)."""
    if raw is None:
        return ""
    if s.sampling == "direct" and s.counts["clean"] == s.blocks:
        return (f"No fault hit any of the {s.blocks:,} blocks (P(any fault) = "
                f"{s.p_any_error:.2g} per block), so rkv and raw storage both read back "
                "exact data and this campaign measured nothing: use --sampling conditional "
                "(every block gets a fault), or --ber-multiplier to accelerate the model.")
    if any(s.counts[o] != raw.counts[o] for o in ("corrected", "due", "sdc")):
        return ""
    cfg = _config(s)
    share, names = _unreported(cfg)
    if not names:
        return ("rkv and raw storage agree here: every fault this model draws is reported "
                "by the medium itself (poisoned lines, unreadable sectors), so raw storage "
                "knows the block is bad and recomputes it, as rkv does; rkv's checksum and "
                "code are for the faults a medium does not report. To see them, use a model "
                "that has some, e.g. --fault-model raw-ber (independent bit flips) or "
                "--tier cxl --param link_ber=1e-6.")
    kind = str(cfg.model().params().get("model", ""))
    knob = _UNREPORTED_KNOB.get(kind, "--fault-model raw-ber (independent bit flips)")
    return (f"rkv and raw storage agree here: the faults drawn were all reported by the "
            f"medium (poisoned lines, unreadable sectors), so raw storage recomputed those "
            f"blocks as rkv did. The faults it does not report ({'; '.join(names)}), which "
            f"rkv's checksum and code are for, are {share:.2g} of this model's fault rate: "
            f"about {s.blocks * share:.2g} expected in {s.blocks:,} faulty blocks. "
            f"--ber-multiplier scales every fault alike and keeps that share; raise those "
            f"faults alone to see the difference: {knob}.")


# -- the tables -----------------------------------------------------------------------------------
def _analytic(s: Summary) -> dict[str, float | None]:
    p = s.prediction
    return {"clean": 1 - p.p_error, "masked": None, "corrected": p.p_corrected,
            "degraded": p.p_degraded, "due": p.p_due, "sdc": p.p_sdc}


def outcome_rows(s: Summary) -> list[dict[str, Any]]:
    """One row per outcome: count, rate per block, its 95 % interval, the analytic rate.
    Under conditional or importance sampling every block was given a fault, so there is no
    ``clean`` row (its rate, 1 - P(any fault), is in the header instead)."""
    analytic = _analytic(s)
    rows = []
    for o in OUTCOMES:
        if o == "clean" and s.sampling != "direct":
            continue
        if o == "degraded" and not s.counts[o] and not s.prediction.p_degraded:
            continue        # only layouts with a tolerant part can degrade
        r, lo, hi = s.rates[o]
        rows.append({"storage": s.protection, "outcome": o, "count": s.counts[o], "rate": r,
                     "ci_low": lo, "ci_high": hi, "analytic": analytic[o],
                     "ci": f"[{lo:.3g}, {hi:.3g}]"})
    return rows


def _importance_rows(s: Summary) -> list[dict[str, Any]]:
    imp = s.importance or {}
    analytic = {**_analytic(s), "recovered": s.prediction.p_corrected, "corrected": None}
    return [{"storage": s.protection, "outcome": o, "blocks": imp[o]["hits"],
             "estimate": imp[o]["estimate"], "stderr": imp[o]["stderr"],
             "ci": (f"[{imp[o]['lo']:.3g}, {imp[o]['hi']:.3g}]" if "lo" in imp[o] else None),
             "rel_err": imp[o]["rel_err"] if math.isfinite(imp[o]["rel_err"]) else None,
             "ess": imp[o]["ess"], "analytic": analytic.get(o)}
            for o in ("masked", "corrected", "recovered", "due", "sdc")]


_G = ".3g"
OUTCOME_COLUMNS = [Column("outcome"), Column("count", align="right"),
                   Column("rate", "rate/block", "right", _G), Column("ci", "95% CI", "right"),
                   Column("analytic", align="right", fmt=_G)]
IMPORTANCE_COLUMNS = [Column("outcome"), Column("blocks", align="right"),
                      Column("estimate", "estimate/block", "right", ".4g"),
                      Column("stderr", align="right", fmt=_G),
                      Column("ci", "95% CI", "right"),     # Estimate.interval, not +-1.96 se
                      Column("rel_err", "rel.err", "right", ".2%"),
                      Column("ess", align="right", fmt=".1f"),
                      Column("analytic", align="right", fmt=".4g")]
_MACHINE = ["storage", "outcome", "count", "rate", "ci_low", "ci_high", "analytic"]


def format_summary(s: Summary, fmt: str = "text") -> str:
    """One run's header and outcome table (``fmt``: text, json, csv or markdown rows)."""
    check_format(fmt)
    cfg = _config(s)
    p = s.prediction
    if fmt in ("json", "csv"):
        if s.importance is not None:
            return render(_importance_rows(s), fmt=fmt)
        return render(outcome_rows(s), [Column(k) for k in _MACHINE], fmt=fmt)
    lines = [f"{'raw storage' if s.protection == 'raw' else 'rkv'}: protection "
             f"{s.protection}, tier {cfg.tier}, {cfg.hours:g} h, {s.trials} trials x "
             f"{cfg.blocks} blocks, {s.sampling} sampling",
             f"P(any fault per {p.record_bytes:,}-byte record) = {s.p_any_error:.3g}"]
    if s.sampling != "direct":
        lines.append("every block was given at least one fault; rates are per stored block "
                     f"(x P(any fault)); no fault at all: 1 - {s.p_any_error:.3g}")
    if s.importance is not None:
        imp = s.importance
        lines += [f"importance sampling: {imp['plan'].get('note', '')}", "",
                  render(_importance_rows(s), IMPORTANCE_COLUMNS, fmt=fmt, indent=2).rstrip(),
                  "", f"weights' effective sample size {imp['weight_ess']:.1f} of {s.blocks} "
                  "blocks; recovered = masked + corrected (the analytic 'corrected')"]
    else:
        lines += ["", render(outcome_rows(s), OUTCOME_COLUMNS, fmt=fmt, indent=2).rstrip(), ""]
        if s.protection != "raw":
            lines.append(f"without the end-to-end checksum, analytic SDC would be "
                         f"{p.p_sdc_unchecked:.3g} per block")
    lines.append(f"{s.blocks} blocks in {s.seconds:.1f} s "
                 f"({s.blocks / s.seconds if s.seconds else 0:.0f} blocks/s)")
    return "\n".join(lines)


def format_report(s: Summary, raw: Summary | None = None, fmt: str = "text") -> str:
    """The whole campaign output: verdict, fault model, agreement note, tables. ``json`` is
    ``Summary.to_json()`` with ``raw``, ``verdict`` and ``fault_model`` added; ``csv`` is the
    outcome rows of both runs (a ``storage`` column tells them apart)."""
    import json

    check_format(fmt)
    cfg = _config(s)
    if fmt == "json":
        doc = s.to_json()
        if raw is not None:
            doc["raw"] = raw.to_json()
        doc["verdict"] = verdict(s, raw)
        doc["fault_model"] = fault_model_text(cfg)
        return json.dumps(doc, indent=2) + "\n"
    if fmt == "csv":
        out = format_summary(s, "csv")
        if raw is None:
            return out
        head, _, rows = format_summary(raw, "csv").partition("\n")
        if head != out.partition("\n")[0]:     # e.g. importance sampling on one run only
            raise ConfigError("csv: the raw run's table has other columns; use json")
        return out + rows
    note = explain_agreement(s, raw)
    lines = [verdict(s, raw), "",
             f"fault model: {fault_model_text(cfg)}",
             block_text(cfg, s.prediction.record_bytes) + f", kept {cfg.hours:g} h",
             *([note] if note else []), "", format_summary(s, fmt)]
    if raw is not None:
        lines += ["", "the same campaign on raw storage (no header, no checksum: what peers "
                  "do):", format_summary(raw, fmt)]
    return "\n".join(lines) + "\n"
