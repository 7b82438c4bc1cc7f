"""Fault-injection campaigns through the real engine: put, inject, get, classify.

A trial stores ``blocks`` fresh KV blocks (one chunk of one layer each) in a store whose only
tier has the campaign's fault model and protection, draws an error pattern for every stored
record from the model (seeded by the trial's seed), applies it to the record at the tier
boundary, reads every block back through :meth:`Engine.get` and compares it with what was
written:

* **clean**: no fault was drawn for the block;
* **masked**: faults were drawn, yet the read was clean and exact;
* **corrected**: the read reported corrections and the data is exact;
* **DUE**: the read reported the block uncorrectable or missing (a recompute);
* **SDC**: the read returned data without complaint, and it is wrong.

Protection ``raw`` stores the bare data (no record, no checksum) in the same kind of tier, as
today's peers do, and reads it back unverified: whatever the medium does not report is SDC.

Rare events: with ``sampling = "conditional"`` every block gets a pattern drawn *given* at
least one fault (``FaultModel.sample_given_error``), and the conditional outcome rates are
scaled by the analytic probability of any fault (``p_any_error``), so rates near 1e-15 are
estimated without 1e15 trials. ``auto`` picks conditional sampling when faults are rarer than
one in a thousand blocks.

This module runs the trials and summarizes them; the config and the summary types are
:mod:`rkv.eval.faults.campaign_types`'s, one worker's trials :mod:`rkv.eval.faults.bench`'s
and the output :mod:`rkv.eval.faults.campaign_report`'s (``CampaignConfig``, ``Summary``
and ``format_summary`` are importable from here too).
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from rkv.eval import stats
from rkv.eval.faults.bench import OUTCOMES, TrialResult, _Bench, _worker
from rkv.eval.faults.campaign_report import format_summary
from rkv.eval.faults.campaign_types import SAMPLING, CampaignConfig, Summary
from rkv.reliability.analytic import predict
from rkv.reliability.protection import RAW
from rkv.ui.progress import Progress

__all__ = [
    "OUTCOMES",
    "SAMPLING",
    "CampaignConfig",
    "Summary",
    "TrialResult",
    "format_summary",
    "replay_trial",
    "run_campaign",
    "run_with_raw",
    "stderr_progress",
    "wilson",
]

log = logging.getLogger(__name__)


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95 % Wilson score interval for k successes in n trials (:func:`rkv.eval.stats.wilson`)."""
    return stats.wilson(k, n, z)


def _batches(items: list[tuple[int, int]], size: int) -> Iterator[list[tuple[int, int]]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def run_campaign(cfg: CampaignConfig, *,
                 progress: bool | Callable[[int, int], None] | None = None) -> Summary:
    """Run ``cfg.trials`` trials (over ``cfg.workers`` processes) and summarize them.

    ``progress``: ``True`` shows an :class:`rkv.ui.Progress` (a bar on a terminal, plain
    lines on stderr otherwise); a callable is called with (trials done, trials)."""
    if progress is stderr_progress:
        progress = True
    if progress is True:
        label = "raw storage" if cfg.effective_protection() == RAW else "campaign"
        with Progress(label, cfg.trials, unit="trial") as bar:
            return run_campaign(cfg, progress=bar.advance_to)
    model = cfg.model()
    protection = cfg.effective_protection()
    prediction = predict(cfg.protection_pipeline(), cfg.data_bytes, model, cfg.hours)
    record = prediction.record_bytes
    p_any = float(model.p_any_error(record, cfg.hours))
    sampling = cfg.sampling
    if sampling == "auto":
        sampling = "conditional" if p_any < 1e-3 else "direct"
    conditional = sampling == "conditional"
    plan = tilt_plan(cfg, record)
    if plan is not None:
        sampling = "importance"
    log.info("campaign: tier %s, protection %s, fault model %s x %g, %g h, %d trials x %d "
             "blocks, %s sampling, %d worker(s)", cfg.tier, protection,
             cfg.fault_model or "(tier default)", cfg.ber_multiplier, cfg.hours, cfg.trials,
             cfg.blocks, sampling, cfg.workers)
    blocks_out: list[tuple[str, float]] = []
    trials = [(i, cfg.trial_seed(i)) for i in range(cfg.trials)]
    rows_out = open(cfg.rows, "w", encoding="utf-8") if cfg.rows else None  # noqa: SIM115
    counts: Counter[str] = Counter()
    done = 0
    t0 = time.perf_counter()
    cfg_dict = cfg.to_dict()

    def consume(rows: list[dict[str, Any]]) -> None:
        nonlocal done
        for row in rows:
            for o in OUTCOMES:
                counts[o] += row[o]
            if plan is not None:
                blocks_out.extend((b["outcome"], b["log_weight"]) for b in row["blocks"])
            if rows_out is not None:
                rows_out.write(json.dumps(row) + "\n")
        done += len(rows)
        if callable(progress):
            progress(done, cfg.trials)

    try:
        batch = max(1, min(50, cfg.trials // (4 * cfg.workers) or 1))
        if cfg.workers == 1:
            root = Path(tempfile.mkdtemp(prefix="rkv-campaign-"))
            bench = _Bench(cfg, root)
            try:
                for chunk in _batches(trials, batch):
                    consume([bench.run(t, s, conditional, plan).row() for t, s in chunk])
            finally:
                bench.close()
                shutil.rmtree(root, ignore_errors=True)
        else:
            import multiprocessing as mp

            with ProcessPoolExecutor(cfg.workers, mp_context=mp.get_context("spawn")) as pool:
                futs = [pool.submit(_worker, cfg_dict, chunk, conditional, plan)
                        for chunk in _batches(trials, batch)]
                for fut in as_completed(futs):
                    consume(fut.result())
    finally:
        if rows_out is not None:
            rows_out.close()
    seconds = time.perf_counter() - t0
    blocks = cfg.trials * cfg.blocks
    log.info("campaign done: %d blocks in %.1f s: %s", blocks, seconds,
             ", ".join(f"{o} {counts[o]}" for o in OUTCOMES))
    scale = p_any if conditional else 1.0
    rates = {}
    for o in OUTCOMES:
        lo, hi = wilson(counts[o], blocks)
        rates[o] = (scale * counts[o] / blocks, scale * lo, scale * hi)
    importance = None
    if plan is not None:
        importance = weighted_rates(blocks_out, plan)
        for o in OUTCOMES[1:]:
            # The Wilson interval on the estimate's effective counts, not est +- 1.96 se:
            # with few weighted hits the normal interval under-covers (docs/rare-events.md).
            e = importance[o]
            rates[o] = (e["estimate"], e["lo"], e["hi"])
    if conditional or plan is not None:
        # Conditioned on a fault, "clean" means nothing: every block had one.
        rates["clean"] = (1 - p_any, 1 - p_any, 1 - p_any)
    return Summary(cfg_dict, protection, sampling, cfg.trials, blocks,
                   {o: counts[o] for o in OUTCOMES}, p_any, rates, prediction, seconds,
                   importance=importance)


def run_with_raw(cfg: CampaignConfig, *, compare_raw: bool = True,
                 progress: bool | Callable[[int, int], None] | None = None
                 ) -> tuple[Summary, Summary | None]:
    """The campaign, then (unless its protection is already raw, or ``compare_raw`` is
    false) the same campaign on raw storage: what ``format_report`` takes."""
    summary = run_campaign(cfg, progress=progress)
    if not compare_raw or summary.protection == RAW:
        return summary, None
    return summary, run_campaign(replace(cfg, protection=RAW, rows=""), progress=progress)


def tilt_plan(cfg: CampaignConfig, record: int) -> dict[str, Any] | None:
    """The importance-sampling plan of ``cfg`` for records of ``record`` bytes (None when
    ``tilt`` is 0): ``"auto"`` is :func:`rkv.eval.faults.importance_plan.auto_plan`, a number tilts
    every class's count by that factor."""
    if not cfg.tilt:
        return None
    from rkv.eval.faults.importance_plan import auto_plan, uniform_plan

    model = cfg.model()
    if cfg.tilt == "auto":
        plan = auto_plan(model, cfg.effective_protection(), cfg.data_bytes, record, cfg.hours)
    else:
        plan = uniform_plan(model, record, cfg.hours, float(cfg.tilt))
    return plan.to_dict()


def weighted_rates(blocks: list[tuple[str, float]], plan: dict[str, Any]) -> dict[str, Any]:
    """Per outcome: the weighted estimate per block, its standard error, relative error, the
    blocks that had it and their effective number (``importance`` of the summary)."""
    from rkv.eval.faults.importance import estimate, weight_ess

    outcomes = np.array([o for o, _ in blocks])
    log_w = np.array([w for _, w in blocks], dtype=np.float64)
    out: dict[str, Any] = {o: estimate(outcomes == o, log_w).to_dict() for o in OUTCOMES[1:]}
    rec = estimate(np.isin(outcomes, ("masked", "corrected")), log_w)
    out["recovered"] = rec.to_dict()
    out["weight_ess"] = weight_ess(log_w)
    out["plan"] = plan
    return out


def replay_trial(cfg: CampaignConfig, trial: int, seed: int | None = None) -> dict[str, Any]:
    """Run one trial again (same seed, same patterns, same outcome) and return its row.

    It sizes the record from its framing (:meth:`CampaignConfig.record_bytes`) instead of
    predicting its outcomes as :func:`run_campaign` does for its report: the prediction was
    15 of the 18 s one replay took with the default campaign (docs/campaigns.md)."""
    model = cfg.model()
    record = cfg.record_bytes()
    conditional = cfg.sampling == "conditional" or (
        cfg.sampling == "auto" and model.p_any_error(record, cfg.hours) < 1e-3)
    return _worker(cfg.to_dict(), [(trial, cfg.trial_seed(trial) if seed is None else seed)],
                   conditional, tilt_plan(cfg, record))[0]


def stderr_progress(done: int, total: int) -> None:
    """Kept for callers of the old ``(done, total)`` progress callback: passing it to
    :func:`run_campaign` means ``progress=True`` (an :class:`rkv.ui.Progress` display)."""
