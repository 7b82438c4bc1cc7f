"""Campaigns over time: a store simulated over days, its blocks aging, scrubbed or not.

One trial keeps ``blocks`` slots filled in one tier of a real engine (the harness's
fault-injecting tier) on a simulated clock. Each slot holds one block (one chunk of a
one-layer model, the campaign's block shape) for a residency drawn from the tier's
residency distribution (exponential with ``residency_hours`` as its mean: KV blocks come
and go); when it ends, the workload reads the block (its outcome is counted: clean,
corrected, DUE, SDC) and a new block takes the slot. Every record's faults arrive in time
(:func:`rkv.reliability.timeline.draw_timeline`: persistent ones change the stored record when
they arrive, transient ones the next read), so errors accumulate with age, including latent
faults present at the write when the model has them.

With ``scrub_hours``, the real :class:`rkv.store.scrub.Scrubber` runs a pass every
``scrub_hours`` on the engine's simulated clock: corrected blocks are rewritten, blocks
past ``refresh_hours`` refreshed (a rewrite: the record's faults start over), and blocks it
finds uncorrectable are dropped (counted as DUE: lost before the workload read them; the
slot then holds the block recomputed). Without it, a block's faults accumulate until its
read. Rates are per block-day of residency, with exact (Garwood) Poisson intervals over
all trials; the scrubber's bandwidth is its bytes read per simulated second.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from rkv.checks import as_float, as_int, check_keys
from rkv.eval.faults.planned import poisson_ci

#: Mean residency of a KV block per default tier when none is given (assumptions: DRAM
#: holds the hot working set for about an hour, CXL for hours, NVMe for a week).
RESIDENCY_HOURS = {"dram": 1.0, "cxl": 8.0, "nvme": 168.0}
NS_PER_HOUR = 3600 * 10**9
EPOCH_NS = 1_700_000_000 * 10**9


@dataclass(frozen=True)
class OverTimeConfig:
    """A campaign over time. ``campaign``: the tier, fault model, protection, block shape,
    bits and ``ber_multiplier`` (:class:`rkv.eval.faults.campaign.CampaignConfig` fields);
    ``days`` simulated per trial; ``blocks`` slots; ``residency_hours`` the mean residency
    (default per tier, :data:`RESIDENCY_HOURS`); ``scrub_hours`` the scrub interval (None:
    no scrubbing); ``refresh_hours`` the scrubber's refresh age (None: from the tier's
    schedule at ``target_p_due``; inf: never); ``step_hours`` the simulation step (None:
    a tenth of the shorter of the scrub interval and the residency)."""

    campaign: Mapping[str, Any] = field(default_factory=dict)
    days: float = 30.0
    blocks: int = 32
    trials: int = 4
    residency_hours: float | None = None
    scrub_hours: float | None = None
    refresh_hours: float | None = None
    target_p_due: float = 1e-9
    step_hours: float | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("days", "residency_hours", "scrub_hours", "step_hours"):
            v = getattr(self, name)
            if v is not None:
                as_float(v, name, lo=0, lo_open=True)
        if self.refresh_hours is not None:       # inf: never
            as_float(self.refresh_hours, "refresh_hours", lo=0, lo_open=True, finite=False)
        for name in ("blocks", "trials"):
            as_int(getattr(self, name), name, lo=1)
        self.base()                       # the campaign fields, validated now

    def base(self) -> Any:
        from rkv.eval.faults.campaign import CampaignConfig

        check_keys(self.campaign, (f.name for f in fields(CampaignConfig)), "campaign")
        return CampaignConfig(**{**self.campaign, "workers": 1})

    @property
    def residency(self) -> float:
        return float(self.residency_hours or RESIDENCY_HOURS[self.base().tier])

    @property
    def step(self) -> float:
        if self.step_hours is not None:
            return float(self.step_hours)
        return min(self.residency, self.scrub_hours or math.inf) / 10.0


@dataclass
class OverTimeResult:
    """Counts over all trials: block-days of residency, workload reads by outcome, blocks
    the scrubber found lost, rewrote, and the bytes it read; rates per block-day."""

    config: OverTimeConfig
    block_days: float = 0.0
    reads: Counter[str] = field(default_factory=Counter)
    scrub: Counter[str] = field(default_factory=Counter)
    scrub_bytes: int = 0
    scrub_passes: int = 0
    sim_hours: float = 0.0
    refresh_hours: float = math.inf

    @property
    def due(self) -> int:
        return self.reads["due"] + self.scrub["lost"]

    @property
    def sdc(self) -> int:
        return self.reads["sdc"]

    def rate(self, count: int) -> dict[str, float]:
        """A count per block-day with its 95 % exact Poisson interval."""
        lo, hi = poisson_ci(count)
        d = self.block_days or math.nan
        return {"n": count, "per_block_day": count / d, "lo": lo / d, "hi": hi / d}

    def to_dict(self) -> dict[str, Any]:
        hours = self.sim_hours or math.nan
        return {
            "block_days": self.block_days, "reads": dict(self.reads),
            "scrub": dict(self.scrub), "scrub_passes": self.scrub_passes,
            "scrub_mb_per_s": self.scrub_bytes / 1e6 / (hours * 3600.0),
            "refresh_hours": None if math.isinf(self.refresh_hours) else self.refresh_hours,
            "due": self.rate(self.due), "sdc": self.rate(self.sdc),
        }


@dataclass
class _Slot:
    tokens: list[int]
    kv: np.ndarray
    written: float                 # sim hours of the record's last write
    ends: float                    # sim hours of the workload's read
    events: list[Any]
    applied: int = 0
    born: float = 0.0
    chunk: bytes = b""             # the chunk's key (its one block: layer 0)


class _Trial:
    def __init__(self, cfg: OverTimeConfig, trial: int, result: OverTimeResult,
                 progress: Callable[[float], None] | None) -> None:
        from rkv.eval.faults.harness import Harness

        self.cfg, self.base, self.res = cfg, cfg.base(), result
        self.rng = np.random.default_rng([cfg.seed, trial])
        self.model = self.base.model()
        self.spec = self.base.model_spec()
        tier = self.base.tier_config()
        self.h = Harness.temporary(quant=tier.quant, ecc=tier.ecc,
                                   chunk_tokens=self.base.chunk_tokens, seed=cfg.seed + trial)
        assert self.h.engine is not None
        self.engine = self.h.engine
        self.now = 0.0
        self.engine.clock = lambda: EPOCH_NS + round(self.now * NS_PER_HOUR)
        self.progress = progress
        self._next_token = trial * 10**7
        self.horizon = cfg.days * 24.0

    # -- blocks ---------------------------------------------------------------------------
    def _new_tokens(self) -> list[int]:
        n = self.base.chunk_tokens
        start = self._next_token
        self._next_token += n
        return [(start + i) % (1 << 31) for i in range(n)]

    def _key(self, slot: _Slot) -> bytes:
        from rkv.format.keys import as_token_array, block_key, chunk_keys

        if not slot.chunk:
            slot.chunk = chunk_keys(as_token_array(slot.tokens), self.spec.fingerprint(),
                                    self.h.chunk_tokens)[0]
        return block_key(slot.chunk, 0)

    def _timeline(self, slot: _Slot) -> None:
        from rkv.reliability.timeline import draw_timeline

        nbytes = self.h.record_bytes(self._key(slot))
        span = max(1e-6, min(slot.ends, self.horizon) - slot.written) + self.cfg.step
        # A power of two hours (events past the span are never applied): every block of a
        # run shares a few timeline grids instead of computing one each.
        span = 2.0 ** math.ceil(math.log2(span))
        slot.events = draw_timeline(self.model, nbytes, span, self.rng)
        slot.applied = 0

    def _write(self, tokens: list[int] | None = None) -> _Slot:
        from rkv.eval.demo import synthetic_kv

        toks = tokens or self._new_tokens()
        kv = synthetic_kv(self.spec, np.asarray(toks, dtype=np.int64))
        self.h.put(toks, kv, self.spec)
        life = float(self.rng.exponential(self.cfg.residency))
        slot = _Slot(toks, self.h.reference(kv[0])[None], self.now, self.now + life, [],
                     born=self.now)
        self._timeline(slot)
        return slot

    def _apply(self, slot: _Slot) -> None:
        """Put the faults that have arrived by now into the record (or its next read)."""
        if slot.applied == len(slot.events):
            return
        age = self.now - slot.written
        key = self._key(slot)
        while slot.applied < len(slot.events) and slot.events[slot.applied].hours <= age:
            ev = slot.events[slot.applied]
            slot.applied += 1
            if self.h.record_bytes(key):
                self.h.inject(key, ev.pattern)

    def _read(self, slot: _Slot) -> None:
        """The workload's read at the end of the residency, then a new block."""
        inj = _Clean()
        outcome, _ = self.h.classify(slot.tokens, self.spec, slot.kv, inj)   # type: ignore[arg-type]
        if outcome == "clean" and any(
                e.hours <= self.now - slot.written for e in slot.events):
            outcome = "masked"
        self.res.reads[outcome] += 1
        self.res.block_days += (self.now - slot.born) / 24.0
        self.engine.delete(slot.tokens, model=self.spec)

    # -- the scrubber ----------------------------------------------------------------------
    def _scrub(self, slots: list[_Slot], scrubber: Any) -> None:
        before = {id(s): self._written_ns(s) for s in slots}
        rep = scrubber.run()
        self.res.scrub_passes += 1
        self.res.scrub_bytes += rep.bytes_read
        for what in ("corrected", "refreshed", "lost", "repaired"):
            self.res.scrub[what] += rep.total(what)
        for i, s in enumerate(slots):
            now_w = self._written_ns(s)
            if now_w is None:                  # dropped: lost; the workload recomputes it
                self.res.block_days += (self.now - s.born) / 24.0
                slots[i] = self._write()
            elif now_w != before[id(s)]:       # rewritten: its faults start over
                s.written = self.now
                self._timeline(s)

    def _written_ns(self, slot: _Slot) -> int | None:
        ix = self.engine.core.index
        with ix.env.read() as txn:
            self._key(slot)
            meta = ix.get_chunk(txn, slot.chunk)
        return None if meta is None else meta.written_at(0)

    # -- the run ----------------------------------------------------------------------------
    def run(self) -> None:
        from rkv.store.scrub import Scrubber, ScrubConfig

        cfg = self.cfg
        slots = [self._write() for _ in range(cfg.blocks)]
        scrubber = None
        if cfg.scrub_hours is not None:
            refresh = cfg.refresh_hours
            if refresh is None:
                refresh = self.res.refresh_hours = _refresh_hours(self.base, self.h,
                                                                  cfg.target_p_due)
            self.res.refresh_hours = refresh
            scrubber = Scrubber(self.engine.core, ScrubConfig(refresh_hours={"t0": refresh},
                                                         interval_hours=cfg.scrub_hours))
        next_scrub = cfg.scrub_hours or math.inf
        step = cfg.step
        while self.now < self.horizon - 1e-9:
            self.now = min(self.horizon, self.now + step)
            for i, s in enumerate(slots):
                if s.ends <= self.now:
                    self._apply(s)
                    self._read(s)
                    slots[i] = self._write()
                else:
                    self._apply(s)
            if scrubber is not None and self.now >= next_scrub - 1e-9:
                self._scrub(slots, scrubber)
                next_scrub += cfg.scrub_hours or math.inf
            if self.progress is not None:
                self.progress(step)
        for s in slots:                        # still resident at the end: censored
            self.res.block_days += (self.now - s.born) / 24.0
        self.res.sim_hours += self.horizon
        self.h.close()


class _Clean:
    """What :meth:`Harness.classify` needs of an injection: its faults are tracked here."""

    empty = True
    lost = False
    erasures = ()


def _refresh_hours(base: Any, h: Any, target: float) -> float:
    """The tier's refresh age for the trial's blocks (:func:`rkv.reliability.schedule.schedule`)."""
    from rkv.reliability.schedule import schedule

    s = schedule(base.model(), base.effective_protection(), base.data_bytes, target)
    return float(s.refresh_hours) if s.refresh_hours > 0 else math.inf


def run_over_time(cfg: OverTimeConfig, *, progress: Callable[[float], None] | None = None
                  ) -> OverTimeResult:
    """Run ``cfg.trials`` trials; ``progress(hours)`` after each simulated step."""
    res = OverTimeResult(cfg)
    for t in range(cfg.trials):
        _Trial(cfg, t, res, progress).run()
    return res
