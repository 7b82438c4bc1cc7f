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
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from rkv.checks import as_float, as_int, as_str, as_table, check_keys, one_of
from rkv.errors import ConfigError
from rkv.eval.faults.bench import OUTCOMES, TrialResult, _Bench, _worker
from rkv.format.model import ModelSpec
from rkv.reliability.analytic import Prediction, predict
from rkv.reliability.protection import RAW
from rkv.store.config import TierConfig, default_tiers
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

SAMPLING = ("auto", "direct", "conditional")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CampaignConfig:
    """What a campaign runs. Round-trips to dicts and TOML (``[campaign]`` table or top level).

    ``tier`` picks a default tier (``dram``, ``cxl``, ``nvme``) for its fault model and
    protection; ``fault_model`` (a preset name, or a table with ``preset`` and overrides) and
    ``protection`` (a codec spec, ``none`` for the end-to-end checksum alone, ``raw`` for no
    protection at all) override it. The block shape defaults to one SmolLM2-135M block
    (256 tokens x 3 KV heads x 64 dims, fp16: 192 KiB). ``ber_multiplier`` accelerates the
    fault model (:func:`faultmodels.accelerate`: its raw fault rates times that factor); the
    analytic prediction judges the same accelerated model.
    """

    tier: str = "nvme"
    fault_model: str | dict[str, Any] = ""
    protection: str = ""
    hours: float = 24.0
    trials: int = 100
    blocks: int = 8
    chunk_tokens: int = 256
    kv_heads: int = 3
    head_dim: int = 64
    dtype: str = "float16"
    bits: int = 16
    seed: int = 0
    workers: int = 1
    sampling: str = "auto"
    rows: str = ""
    tilt: float | str = 0.0
    ber_multiplier: float = 1.0

    def __post_init__(self) -> None:
        one_of(self.tier, [t.name for t in default_tiers()], "campaign tier")
        for name in ("trials", "blocks", "chunk_tokens", "kv_heads", "head_dim", "workers"):
            as_int(getattr(self, name), f"campaign {name}", lo=1)
        as_float(self.hours, "campaign hours", lo=0)
        one_of(self.sampling, SAMPLING, "campaign sampling")
        one_of(self.bits, (16, 8, 4, 2), "campaign bits (16: values as they are)")
        one_of(self.dtype, ("float16", "bfloat16", "float32"), "campaign dtype")
        as_int(self.seed, "campaign seed", lo=0)
        if not isinstance(self.fault_model, str):
            as_table(self.fault_model, "campaign fault_model", what="a preset name or a table")
        as_str(self.protection, "campaign protection")
        as_str(self.rows, "campaign rows")
        if self.tilt != "auto":
            as_float(self.tilt, 'campaign tilt (0: off, a factor > 0, or "auto")', lo=0)
        import faultmodels

        try:
            faultmodels.check_multiplier(self.ber_multiplier)
        except faultmodels.FaultModelError as exc:
            raise ConfigError(f"campaign {exc}") from exc
        self.tier_config()  # validates the protection's codec spec
        model = self.model()        # validates the fault model
        if self.ber_multiplier != 1:
            try:            # an accelerated class past probability 1 says so now
                model.events(self.data_bytes, self.hours)
            except faultmodels.FaultModelError as exc:
                raise ConfigError(f"campaign ber_multiplier: {exc}") from exc

    # -- derived --------------------------------------------------------------------------
    def tier_config(self) -> TierConfig:
        base = next(t for t in default_tiers() if t.name == self.tier)
        prot = self.effective_protection()
        fm = self.fault_model if isinstance(self.fault_model, str) and self.fault_model else (
            base.fault_model if not self.fault_model else "custom")
        return replace(base, ecc="none" if prot == RAW else prot, fault_model=fm,
                       quant=self.quant_spec(), capacity_bytes=1 << 40, path="tier")

    def quant_spec(self) -> str:
        return "none" if self.bits >= 16 else f"kivi(bits={self.bits})"

    def effective_protection(self) -> str:
        if self.protection:
            return self.protection.strip()
        return next(t for t in default_tiers() if t.name == self.tier).ecc

    def protection_pipeline(self) -> Any:
        """What ``predict`` judges: the stored record's pipeline (quantizer and code; the
        record header lists both, so the framing counts them), or ``"raw"``."""
        prot = self.effective_protection()
        if prot == RAW:
            return RAW
        from rkv.codec.pipeline import Pipeline

        shape = (2, self.chunk_tokens, self.kv_heads, self.head_dim)
        return Pipeline.parse(self.quant_spec(), prot).for_block(shape, self.dtype)

    def model(self) -> Any:
        import faultmodels

        spec: Any = self.fault_model or next(
            t for t in default_tiers() if t.name == self.tier).fault_model
        try:
            return faultmodels.accelerate(faultmodels.get_model(spec), self.ber_multiplier)
        except ValueError as exc:
            raise ConfigError(f"bad fault model {spec!r}: {exc}") from exc

    def model_spec(self) -> ModelSpec:
        return ModelSpec("campaign/block", n_layers=1, n_kv_heads=self.kv_heads,
                         head_dim=self.head_dim, dtype=self.dtype)

    @property
    def data_bytes(self) -> int:
        """Bytes of one block's data as stored (after quantization, before any ECC)."""
        shape = (2, self.chunk_tokens, self.kv_heads, self.head_dim)
        if self.bits < 16:
            from rkv.codec.stages import quantizer_for

            q = quantizer_for(self.quant_spec())
            assert q is not None
            return int(q.encoded_size(shape, self.dtype))
        return 2 * self.chunk_tokens * self.kv_heads * self.head_dim * (
            4 if self.dtype == "float32" else 2)

    def trial_seed(self, trial: int) -> int:
        """The seed of trial ``trial``: replaying it needs nothing else."""
        return int(np.random.SeedSequence([self.seed, trial]).generate_state(1, np.uint64)[0])

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CampaignConfig:
        if not isinstance(d, dict):
            raise ConfigError("campaign config must be a table")
        d = d.get("campaign", d) if isinstance(d.get("campaign"), dict) else d
        check_keys(d, [f.name for f in fields(cls)], "campaign")
        try:
            return cls(**d)
        except TypeError as exc:
            raise ConfigError(f"bad campaign config: {exc}") from exc

    @classmethod
    def load(cls, path: str | Path) -> CampaignConfig:
        from rkv.inputs import read_toml

        return cls.from_dict(read_toml(path, "campaign config"))


@dataclass
class Summary:
    config: dict[str, Any]
    protection: str
    sampling: str
    trials: int
    blocks: int
    counts: dict[str, int]
    p_any_error: float
    rates: dict[str, tuple[float, float, float]]     # outcome -> (rate, low, high), per block
    prediction: Prediction
    seconds: float
    extra: dict[str, Any] = field(default_factory=dict)
    #: Under importance sampling: outcome -> estimate, stderr, rel_err, hits, ess; and "plan",
    #: "weight_ess".
    importance: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "trials": self.trials, "blocks": self.blocks, **self.counts,
            "protection": self.protection, "sampling": self.sampling,
            "p_any_error": self.p_any_error,
            "rates": {k: {"rate": r, "ci95": [lo, hi]} for k, (r, lo, hi) in self.rates.items()},
            "analytic": self.prediction.to_dict(),
            "seconds": self.seconds,
            "blocks_per_second": self.blocks / self.seconds if self.seconds else 0.0,
            "config": self.config, **self.extra,
            **({"importance": self.importance} if self.importance is not None else {}),
        }


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95 % Wilson score interval for k successes in n trials."""
    # Kept as this closed form on purpose: the libraries that provide it (statsmodels'
    # proportion_confint, scipy's binomtest) pull in scipy (tens of MB) for five lines,
    # and tests check it against exact binomial tails.
    if n == 0:
        return 0.0, 1.0
    p = k / n
    den = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return max(0.0, centre - half), min(1.0, centre + half)


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
            e = importance[o]
            rates[o] = (e["estimate"], max(0.0, e["estimate"] - 1.96 * e["stderr"]),
                        e["estimate"] + 1.96 * e["stderr"])
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
    """Run one trial again (same seed, same patterns, same outcome) and return its row."""
    model = cfg.model()
    prediction = predict(cfg.protection_pipeline(), cfg.data_bytes, model, cfg.hours)
    conditional = cfg.sampling == "conditional" or (
        cfg.sampling == "auto" and model.p_any_error(prediction.record_bytes, cfg.hours) < 1e-3)
    return _worker(cfg.to_dict(), [(trial, cfg.trial_seed(trial) if seed is None else seed)],
                   conditional, tilt_plan(cfg, prediction.record_bytes))[0]


def format_summary(s: Summary, fmt: str = "text") -> str:
    """One run's header and outcome table: :func:`rkv.eval.faults.campaign_report.format_summary`
    (the campaign's whole output, verdict first, is ``campaign_report.format_report``)."""
    from rkv.eval.faults.campaign_report import format_summary as fs

    return fs(s, fmt)


def stderr_progress(done: int, total: int) -> None:
    """Kept for callers of the old ``(done, total)`` progress callback: passing it to
    :func:`run_campaign` means ``progress=True`` (an :class:`rkv.ui.Progress` display)."""
