"""Patrol scrubbing: read stored blocks within a bandwidth budget, riskiest first, and act
before latent errors outgrow the code.

One pass (:meth:`Scrubber.run`) lists every stored block from the index (no record reads),
orders them by risk and reads each through the real read path (verified, copied nowhere):

* **risk**: the block's age over its tier's refresh age (the age at which the tier's fault
  model says an untouched block passes the target P(DUE), :mod:`rkv.reliability.schedule`), plus
  one for a block this scrubber saw corrected on an earlier pass (a fault that stays in
  place); blocks of unknown age (written before records carried their time) count as due;
  ties go to the most recently used chunk (the one most likely to be read again).
* **corrected** blocks (ECC symbols, header copies or erasures repaired) are rewritten from
  their corrected data, as a read with ``repair`` does; blocks that would pass the refresh
  age before the next pass (``lead_hours`` away) are rewritten as they are (restamped: a
  rewrite is a refresh, NAND retention starts over), so no block outlives its refresh age.
* **uncorrectable** blocks are repaired from a verified copy of the same block in another
  tier when one exists, else their chunk is dropped from the index (counted as lost; a read
  would recompute it anyway, and the dropped entry no longer costs a failed read).

Reads happen outside the writer lock; every rewrite or drop is a short transaction of at
most ``batch`` blocks that re-checks the index entry (a block moved or evicted meanwhile is
skipped), so readers and writers keep going. A pass killed at any point leaves a consistent
store: each transaction commits whole or not at all, and records are written before the
index points at them (the engine's own ordering). ``stop`` (a :class:`threading.Event`) ends
a pass between blocks; the report says it was interrupted.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from policies.base import Reason
from rkv.errors import ConfigError, IntegrityError
from rkv.format.keys import block_key
from rkv.format.model import ModelSpec
from rkv.format.record import decode_record
from rkv.store.ages import block_ages
from rkv.store.decisions import Protected, free_chunk
from rkv.store.results import CORRECTED, DEGRADED, MISSING, OK, UNCORRECTABLE
from rkv.store.scrub_report import ScrubConfig, ScrubReport, TierScrub
from rkv.store.upkeep import rewrite_blocks, rewrite_pipeline
from rkv.store.upkeep import stats as store_stats

__all__ = ["BackgroundScrubber", "ScrubConfig", "ScrubReport", "Scrubber", "TierScrub",
           "scrub", "start_background", "tier_schedules"]

if TYPE_CHECKING:
    from rkv.store.core import StoreCore

log = logging.getLogger("rkv")

NS_PER_HOUR = 3600 * 10**9
ACTIONS = ("scanned", "ok", "corrected", "refreshed", "repaired", "lost", "skipped")


@dataclass(frozen=True)
class _Block:
    key: bytes
    layer: int
    tier: str
    size: int
    risk: float
    at: int


class Scrubber:
    """Scrubs ``engine`` (see the module docstring). ``progress(done, total)`` is called
    after each block; ``stop`` ends a pass early. A scrubber remembers the blocks it saw
    corrected, so a later pass reads them first."""

    def __init__(self, core: StoreCore, config: ScrubConfig | None = None, *,
                 progress: Callable[[int, int], None] | None = None,
                 stop: threading.Event | None = None) -> None:
        self.core = core
        self.config = config or ScrubConfig()
        self.progress = progress
        self.stop = stop or threading.Event()
        self._seen_corrected: set[tuple[bytes, int]] = set()
        #: Test hooks: "read" (every block of the pass read, before any rewrite or drop is
        #: committed) and "drop" (about to re-check and drop lost blocks). Tests hold race
        #: windows open with them; production code never sets them.
        self.hooks: dict[str, Callable[[], None]] = {}
        #: Hours until the next pass (the interval, when passes repeat): a block that would
        #: pass its refresh age before then is refreshed now. 0 for a single pass.
        self.lead_hours = float(self.config.interval_hours or 0.0)
        names = self.config.tiers or tuple(core.tiers)
        unknown = [n for n in names if n not in core.tiers]
        if unknown:
            raise ConfigError(f"scrub: no tier {', '.join(unknown)} (tiers: "
                              f"{', '.join(core.tiers)})")
        self.tier_names = tuple(names)
        # A tier's schedule takes seconds (predict runs a handful of times): each is computed
        # on first need, for a tier that holds blocks, so a pass over an empty store or tier
        # costs nothing; a refresh age the config gives needs no schedule at all.
        self._schedules: dict[str, dict[str, Any]] = {}
        self._refresh_ns: dict[str, float] = {}

    # -- schedule ---------------------------------------------------------------------------
    def schedules(self) -> dict[str, dict[str, Any]]:
        """The scrubbed tiers' schedules (:func:`tier_schedules`), each computed once."""
        return {n: s for n in self.tier_names if (s := self.schedule(n)) is not None}

    def schedule(self, tier: str) -> dict[str, Any] | None:
        """``tier``'s schedule, computed on first use (None: it cannot be computed)."""
        if tier not in self._schedules:
            self._schedules[tier] = tier_schedules(self.core, (tier,)).get(tier, {})
        return self._schedules[tier] or None

    def refresh_ns(self, tier: str) -> float:
        """The age (ns) past which ``tier``'s blocks are rewritten: the config's, else the
        tier's schedule's (inf: never)."""
        limit = self._refresh_ns.get(tier)
        if limit is None:
            h = self.config.refresh_hours.get(tier)
            if h is None:
                r = (self.schedule(tier) or {}).get("refresh_hours", math.inf)
                h = math.inf if r is None else float(r)
            limit = h * NS_PER_HOUR if math.isfinite(h) and h > 0 else math.inf
            self._refresh_ns[tier] = limit
        return limit

    def interval_hours(self) -> float | None:
        """The shortest scrub interval of the scrubbed tiers' schedules (inf: none needs
        one; None: none is known)."""
        sch = self.schedules()
        hours = [sch[t].get("scrub_hours") for t in self.tier_names if t in sch]
        finite = [float(h) for h in hours if h is not None and math.isfinite(float(h))]
        if finite:
            return min(finite)
        return math.inf if hours else None

    @property
    def lead_ns(self) -> float:
        return self.lead_hours * NS_PER_HOUR

    # -- one pass ---------------------------------------------------------------------------
    def order(self) -> list[_Block]:
        """Every stored block of the scrubbed tiers, riskiest first."""
        now = self.core.clock()
        out: list[_Block] = []
        scrubbed = set(self.tier_names)
        ages = [b for b in block_ages(self.core) if b.tier in scrubbed]
        # Only the tiers that hold blocks need their refresh age (and so their schedule);
        # computed after the walk, outside its read transaction.
        limits = {t: self.refresh_ns(t) for t in {b.tier for b in ages}}
        for b in ages:
            limit = limits[b.tier]
            if b.written_ns is None:
                age_risk = 1.0
            elif math.isinf(limit):
                age_risk = 0.0
            else:       # as old as it will be when the next pass comes
                age_risk = (max(0, now - b.written_ns) + self.lead_ns) / limit
            risk = age_risk + (1.0 if (b.key, b.layer) in self._seen_corrected else 0.0)
            out.append(_Block(b.key, b.layer, b.tier, b.nbytes, risk, b.at))
        out.sort(key=lambda b: (-b.risk, -b.at))
        return out

    def run(self) -> ScrubReport:
        """One pass over the scrubbed tiers."""
        t0 = time.perf_counter()
        report = ScrubReport({n: TierScrub() for n in self.tier_names})
        blocks = self.order()
        report.total_blocks = len(blocks)
        specs = self._specs()
        budget = self.config.budget_mbps
        rewrite: list[tuple[bytes, int, str, str]] = []
        lost: list[tuple[bytes, int, str]] = []
        read = 0
        for i, b in enumerate(blocks):
            if self.stop.is_set():
                report.interrupted = True
                break
            self._one(b, specs, report, rewrite, lost)
            read += b.size
            if len(rewrite) >= self.config.batch and "read" not in self.hooks:
                self._rewrite(rewrite, report)
            if budget is not None:            # pace: never ahead of budget x elapsed
                ahead = read / (budget * 1e6) - (time.perf_counter() - t0)
                if ahead > 0 and self.stop.wait(ahead):
                    report.interrupted = True
                    break
            if self.progress is not None:
                self.progress(i + 1, len(blocks))
        if "read" in self.hooks:
            self.hooks["read"]()
        self._rewrite(rewrite, report)
        if lost:
            self._handle_lost(lost, specs, report)
        report.seconds = time.perf_counter() - t0
        self.core.tally.add(Counter({(f"scrub_{k}", tier, ""): int(n)
                                     for tier, t in report.tiers.items()
                                     for k, n in vars(t).items() if n}))
        self.core.tally.scrubbed(self.core.clock(), report.total_blocks,
                                 report.total("scanned"), report.interrupted)
        return report

    def _specs(self) -> dict[bytes, ModelSpec]:
        ix = self.core.index
        with ix.env.read() as txn:
            raw = ix.models(txn)
        return {fp: ModelSpec.from_dict(s) for fp, s in raw.items() if s is not None}

    def _one(self, b: _Block, specs: Mapping[bytes, ModelSpec], report: ScrubReport,
             rewrite: list[tuple[bytes, int, str, str]], lost: list[tuple[bytes, int, str]]
             ) -> None:
        ix = self.core.index
        t = report.tiers[b.tier]
        with ix.env.read() as txn:
            meta = ix.get_chunk(txn, b.key)
        if meta is None or b.layer >= len(meta.blocks) or meta.blocks[b.layer][0] != b.tier:
            t.skipped += 1
            return
        spec = specs.get(meta.fingerprint)
        t.scanned += 1
        t.bytes_read += meta.blocks[b.layer][1]
        if spec is None:            # a damaged model entry: verify reports it
            t.skipped += 1
            return
        st = self.core.reads.check_block(b.key, b.layer, meta, spec)
        pos = (b.key, b.layer)
        if st.status == CORRECTED:
            again = pos in self._seen_corrected
            self._seen_corrected.add(pos)
            if st.corrected >= self.config.margin or st.header_repairs:
                # Corrected again after a rewrite: the fault stays where the block is.
                why = "moved" if again and self._below(b.tier) else "corrected"
                rewrite.append((b.key, b.layer, b.tier, why))
                return
            t.ok += 1
        elif st.status == OK:
            t.ok += 1
            if b.risk - (1.0 if pos in self._seen_corrected else 0.0) >= 1.0:   # aged
                rewrite.append((b.key, b.layer, b.tier, "refreshed"))
        elif st.status == DEGRADED:
            t.degraded += 1
        elif st.status in (UNCORRECTABLE, MISSING):
            lost.append((b.key, b.layer, b.tier))

    def _below(self, tier: str) -> str | None:
        """The next tier down from ``tier`` (where a block with a fault in place moves)."""
        order = list(self.core.tiers)
        i = order.index(tier)
        return order[i + 1] if i + 1 < len(order) else None

    def _move(self, items: list[tuple[bytes, int, str, str]]) -> list[bool]:
        """Move the chunks of ``items`` one tier down (verified and re-encoded there, as a
        demotion does), in one transaction; per item, whether it moved."""

        core, ix = self.core, self.core.index
        decide = core.decisions

        def fn(txn: Any, pending: Any) -> list[bool]:
            stats: Counter[str] = Counter()
            protect = Protected({k for k, *_ in items}, decide, txn)
            done = []
            for key, layer, tier, _ in items:
                meta = ix.read_chunk(txn, key)
                dst = self._below(tier)
                done.append(bool(
                    meta is not None and layer < len(meta.blocks)
                    and meta.blocks[layer][0] == tier and dst is not None
                    and decide.usable(dst)
                    and decide.move(txn, key, meta, tier, dst, protect, pending, stats,
                                    Reason.DEMOTED)))
            return done

        return list(core.mutate(fn))

    def _rewrite(self, items: list[tuple[bytes, int, str, str]], report: ScrubReport) -> None:
        """Rewrite ``items`` (corrected or aged) in short transactions; move those whose
        fault stays in place, or rewrite them when they cannot move."""
        if not items:
            return

        moving = [it for it in items if it[3] == "moved"]
        moved = dict(zip(((k, layer) for k, layer, *_ in moving), self._move(moving),
                         strict=True)) if moving else {}
        items[:] = [it if moved.get((it[0], it[1]), True) else (*it[:3], "corrected")
                    for it in items if not moved.get((it[0], it[1]), False)]
        for (key, layer), ok in moved.items():
            if ok:
                tier = next(t for k, lay, t, _ in moving if (k, lay) == (key, layer))
                report.tiers[tier].moved += 1
                self._seen_corrected.discard((key, layer))
        done = rewrite_blocks(self.core, [(k, layer, tier) for k, layer, tier, _ in items])
        for (_, _, tier, why), ok in zip(items, done, strict=True):
            t = report.tiers[tier]
            if ok:
                setattr(t, why, getattr(t, why) + 1)
            else:
                t.skipped += 1
        items.clear()

    def _handle_lost(self, items: list[tuple[bytes, int, str]],
                     specs: Mapping[bytes, ModelSpec], report: ScrubReport) -> None:
        """Rebuild each uncorrectable block from a verified copy in another tier, or drop
        its chunk."""

        core = self.core
        ix = core.index
        copies: dict[tuple[bytes, int], tuple[str, Any]] = {}
        for key, layer, tier in items:
            hit = self._find_copy(key, layer, tier, specs)
            if hit is not None:
                copies[(key, layer)] = hit

        if "drop" in self.hooks:
            self.hooks["drop"]()

        def fn(txn: Any, pending: Any) -> list[str]:
            outcome = []
            dropped: set[bytes] = set()
            for key, layer, tier in items:
                meta = ix.get_chunk(txn, key)
                if (meta is None or layer >= len(meta.blocks)
                        or meta.blocks[layer][0] != tier):
                    outcome.append("skipped" if key not in dropped else "lost")
                    continue
                spec = specs.get(meta.fingerprint)
                # Under the writer lock, read it again: a writer may have stored the chunk
                # anew since the pass read it (then it is not lost, and not ours to drop).
                if spec is None or core.reads.check_block(key, layer, meta, spec).status \
                        not in (UNCORRECTABLE, MISSING):
                    outcome.append("skipped")
                    continue
                copy = copies.get((key, layer))
                if copy is not None:
                    rec = copy[1]
                    size = memoryview(rec).nbytes
                    blocks = list(meta.blocks)
                    blocks[layer] = (tier, size)
                    # The rebuilt record carries the rebuild's time: so does its entry.
                    written = [meta.written_at(i) for i in range(len(blocks))]
                    written[layer] = decode_record(rec).header.written_ns or 0
                    ix.put_chunk(txn, key, meta.with_(blocks=tuple(blocks),
                                                      written=tuple(written)), meta)
                    pending.write(tier, block_key(key, layer), rec, size)
                    outcome.append("repaired")
                    continue
                free_chunk(ix, txn, key, meta, pending)
                dropped.add(key)
                outcome.append("lost")
            return outcome

        outcomes = core.mutate(fn)
        dropped_chunks = set()
        for (key, layer, tier), what in zip(items, outcomes, strict=True):
            t = report.tiers[tier]
            setattr(t, what, getattr(t, what) + 1)
            if what == "lost":
                dropped_chunks.add(key)
                self._seen_corrected.discard((key, layer))
        report.chunks_dropped += len(dropped_chunks)
        if dropped_chunks:
            core.decisions.invalidate()
            core.count(scrub_chunks_dropped=len(dropped_chunks))

    def _find_copy(self, key: bytes, layer: int, tier: str, specs: Mapping[bytes, ModelSpec]
                   ) -> tuple[str, Any] | None:
        """A record of the same block in another tier that verifies, re-encoded for
        ``tier`` (its code), or None."""

        core = self.core
        ix = core.index
        with ix.env.read() as txn:
            meta = ix.get_chunk(txn, key)
        if meta is None:
            return None
        spec = specs.get(meta.fingerprint)
        if spec is None:
            return None
        bkey = block_key(key, layer)
        for name, other in core.tiers.items():
            if name == tier:
                continue
            try:
                rec, erased = other.fetch(bkey)
                if rec is None:
                    continue
                # The same write of the block only: a copy stamped otherwise is stale.
                core.reads.verify_into(rec, key, layer, meta.fingerprint, spec,
                                          meta.n_tokens, None, -1, erased,
                                          meta.written_at(layer))
                dec = decode_record(rec)
                return name, rewrite_pipeline(core, tier, dec).reencode(
                    rec, dec, erased, written_ns=core.clock())
            except IntegrityError:
                continue
        return None


def tier_schedules(core: StoreCore, tiers: Iterable[str] | None = None
                   ) -> dict[str, dict[str, Any]]:
    """Per tier (of ``tiers``; default: all), its schedule
    (:func:`rkv.store.schedule_info.add_schedule`: refresh age and scrub interval for the
    engine's ``scrub_target_p_due``, from its fault model and the code of its typical
    block); empty when it cannot be computed. Takes seconds per tier."""
    from rkv.store.schedule_info import add_schedule

    target = float(getattr(core.config, "scrub_target_p_due", 1e-9))
    stats = store_stats(core)
    if tiers is not None:
        wanted = set(tiers)
        stats = {**stats, "tiers": {n: t for n, t in stats["tiers"].items() if n in wanted}}
    try:
        return dict(add_schedule(stats, target)["tiers"])
    except (ConfigError, ValueError, ArithmeticError):
        return {}


def start_background(core: StoreCore) -> BackgroundScrubber | None:
    """The background scrubber of ``engine``'s ``[scrub]`` table (None: ``enabled = false``)."""
    if core.config.scrub.get("enabled", True) is False:
        return None
    return BackgroundScrubber(core, core.config.scrub_config)


def scrub(core: StoreCore, config: ScrubConfig | None = None, *,
          progress: Callable[[int, int], None] | None = None,
          stop: threading.Event | None = None) -> ScrubReport:
    """One scrub pass over ``engine`` (see :class:`Scrubber`)."""
    return Scrubber(core, config, progress=progress, stop=stop).run()


class BackgroundScrubber:
    """A daemon thread that runs a pass every ``interval_hours`` of wall time (None: the
    shortest scrub interval of the scrubbed tiers' schedules, computed in the thread; none:
    one pass) until :meth:`close`, which stops the current pass between blocks and joins
    the thread. ``reports`` keeps the last ten passes' reports; ``error`` what ended it."""

    def __init__(self, core: StoreCore, config: ScrubConfig) -> None:
        self.core = core
        self.config = config
        self.stop = threading.Event()
        self.reports: list[ScrubReport] = []
        self.error: BaseException | None = None
        #: Set after every pass (and when the thread ends): waiters need no polling.
        self.passed = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rkv-scrub", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        try:
            scrubber = Scrubber(self.core, self.config, stop=self.stop)
            hours = self.config.interval_hours
            if hours is None:
                hours = scrubber.interval_hours()
            if hours is not None and math.isfinite(hours):
                scrubber.lead_hours = hours
            while not self.stop.is_set():
                start = time.monotonic()
                self.reports = [*self.reports[-9:], scrubber.run()]
                self.passed.set()
                if hours is None or not math.isfinite(hours):
                    return
                if self.stop.wait(max(0.0, hours * 3600.0 - (time.monotonic() - start))):
                    return
        except Exception as exc:          # kept for close() and stats; the engine goes on
            self.error = exc
            log.warning("background scrubber stopped: %s", exc)
        finally:
            self.passed.set()

    def close(self, timeout: float | None = 30.0) -> None:
        self.stop.set()
        self._thread.join(timeout)

