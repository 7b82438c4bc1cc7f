"""MoE experts streamed from rkv's tiers: :class:`RkvExperts`, an
:class:`~rkv.moe.experts.ExpertProvider` (docs/moe.md, "The adapter: experts in rkv").

Every expert is written once as a verified rkv record (:mod:`rkv.moe.store`: one
record per expert, keyed by model fingerprint, layer and expert id), protected by its tier's
ECC and placed across the tiers (the most used experts highest). A device cache of decoded
experts within a byte budget (:mod:`rkv.moe.cache`) is run by the ``policies``
objects the KV engine uses. A miss loads the record through the verified read path; a record
that cannot be verified is reported, then read from a second copy (``backup_tier``), else
served from the low-bit copy (``low_bit_copy``, marked :class:`ApproximateExpert` and counted),
else :class:`ExpertLoadError`: never silently wrong weights::

    RkvExperts.create(path, layers, fingerprint="smollm2-moe", device_budget_bytes=64 << 20)
    provider = RkvExperts.open(path, device_budget_bytes=64 << 20, prefetch="queue")
    model.set_provider(provider)
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from policies import make_prefetch
from policies.base import Item, PrefetchPolicy
from rkv.errors import (
    ConfigError,
    InputError,
    IntegrityError,
    RecordMismatchError,
    RkvError,
    StoreError,
)
from rkv.moe.cache import DeviceCache, Key
from rkv.moe.experts import ExpertWeights
from rkv.moe.plan import ReplanReport, plan_new, replan
from rkv.moe.store import (
    FULL,
    LOW,
    ExpertInfo,
    infos_from,
    model_fingerprint,
    open_tiers,
    pipeline_for,
    read_expert,
    read_manifest,
    tier_configs,
    tier_key,
    write_store,
)
from rkv.placement.config import PlacementConfig
from rkv.store.config import TierConfig
from rkv.tiers import Tier

if TYPE_CHECKING:
    from rkv.moe.profile import ExpertProfile

log = logging.getLogger("rkv.moe")


@dataclass(frozen=True)
class ApproximateExpert(ExpertWeights):
    """Weights served from the low-bit copy (verified, but ``bits``-bit, not the original)."""

    bits: int = 4
    reason: str = "loss"      # "loss": the exact record was unreadable; "miss": low_bit_on_miss


class ExpertLoadError(IntegrityError):
    """No verified copy of an expert could be read (and no low-bit copy was usable)."""

    def __init__(self, layer: int, expert: int, errors: Sequence[tuple[str, BaseException]]):
        self.layer, self.expert, self.errors = layer, expert, tuple(errors)
        why = "; ".join(f"{t}: {type(e).__name__}: {e}" for t, e in errors) or "no copy"
        super().__init__(f"expert {expert} of layer {layer} is unreadable ({why})")


class RkvExperts:
    """Experts in rkv tiers behind a policy-run device cache. Build with :meth:`create` (writes
    the store) or :meth:`open`; thread-safe; close it (or use ``with``)."""

    def __init__(self, root: Path, body: dict[str, Any], tiers: dict[str, Tier], *,
                 device_budget_bytes: int, eviction: str, per_layer: bool,
                 admission: str | None, prefetch: str | None, prefetch_mode: str,
                 lookahead: bool, low_bit_on_miss: bool, repair: bool) -> None:
        if prefetch_mode not in ("sync", "background", "off"):
            raise ConfigError(f"prefetch_mode must be 'sync', 'background' or 'off', got "
                              f"{prefetch_mode!r}")
        if not isinstance(device_budget_bytes, int) or device_budget_bytes < 0:
            raise ConfigError(f"device_budget_bytes must be an int >= 0, got "
                              f"{device_budget_bytes!r}")
        self.root = root
        self.fingerprint = bytes.fromhex(body["fingerprint"])
        self.tier_configs = tuple(TierConfig.from_dict(t) for t in body["tiers"])
        self.infos = infos_from(body)
        self.low_bit_copy: int | None = body.get("low_bit_copy")
        self.tiers = tiers
        self.cache = DeviceCache(device_budget_bytes, len(self.infos), eviction, per_layer,
                                 admission)
        self.prefetcher: PrefetchPolicy | None = (
            make_prefetch(prefetch) if prefetch and prefetch_mode != "off" else None)
        self.prefetch_mode = prefetch_mode
        self.lookahead = lookahead
        self.low_bit_on_miss = low_bit_on_miss and self.low_bit_copy is not None
        self.repair = repair
        self._lock = threading.RLock()
        self._now = 0
        self._inflight: dict[Key, Future[ExpertWeights | None]] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._closed = False
        self._c: Counter[str] = Counter()
        self._loads: Counter[Key] = Counter()     # exact loads from the tiers per expert
        self._steps = 0                            # forward steps (calls for layer 0)
        self._tier_c: dict[str, Counter[str]] = {t: Counter() for t in tiers}
        self._errors_by_type: Counter[str] = Counter()
        self.recent_errors: deque[str] = deque(maxlen=32)

    # -- building ------------------------------------------------------------------------------
    @classmethod
    def create(cls, path: str | Path, experts: Sequence[Sequence[ExpertWeights]], *,
               fingerprint: bytes | str, device_budget_bytes: int,
               tiers: Sequence[TierConfig] | None = None, eviction: str = "lru",
               per_layer: bool = False, admission: str | None = None,
               prefetch: str | None = "queue", prefetch_mode: str = "sync",
               lookahead: bool = False, bits: int | Mapping[tuple[int, int], int] = 16,
               ecc: Mapping[str, str] | None = None, low_bit_copy: int | None = None,
               backup_tier: str | None = None,
               usage: Mapping[tuple[int, int], float] | None = None,
               placement: PlacementConfig | Mapping[str, Any] | None = None,
               profile: ExpertProfile | None = None, kl_budget: float | None = None,
               low_bit_on_miss: bool = False, repair: bool = True) -> RkvExperts:
        """Write every expert of ``experts[layer][id]`` once as rkv records under ``path``
        (a new directory), then :meth:`open` it with the cache options given here.

        ``bits``: 16 (exact), 8 or 4 (``rowq``), for all experts or per ``(layer, id)``
        (missing: 16). ``ecc``: codec spec per tier name, overriding the tiers' own.
        ``low_bit_copy``: 4 or 8 keeps a ``rowq`` copy of every expert in the first tier.
        ``backup_tier``: a second copy of every expert not placed there. ``usage``: expected
        use per ``(layer, id)``; the most used are placed highest. ``placement`` (a
        ``[placement]`` table or :class:`PlacementConfig`): plan each expert's tier, bits and
        code instead (:mod:`rkv.moe.plan`; ``usage`` as loads per token, bits from
        ``profile``, an :class:`~rkv.moe.profile.ExpertProfile`, within ``kl_budget``;
        ``bits`` is then unused). ``TierFullError`` when the tiers cannot hold it all,
        ``InfeasiblePlanError`` when no plan meets the targets, ``StoreError`` when
        ``path`` already holds a store."""
        root = Path(path)
        fp = model_fingerprint(fingerprint)
        cfgs = tier_configs(tiers, ecc)
        plan = None if placement is None else plan_new(
            experts, cfgs, placement=placement, profile=profile, usage=usage,
            low_bit_copy=low_bit_copy, backup_tier=backup_tier, kl_budget=kl_budget)
        write_store(root, experts, fp, cfgs, bits=bits, low_bit_copy=low_bit_copy,
                    backup_tier=backup_tier, usage=usage,
                    plan=None if plan is None else plan.assignments(),
                    extra=None if plan is None else {"plan": {
                        k: v for k, v in plan.to_dict().items() if k != "choices"}})
        return cls.open(root, fingerprint=fp, device_budget_bytes=device_budget_bytes,
                        eviction=eviction, per_layer=per_layer, admission=admission,
                        prefetch=prefetch, prefetch_mode=prefetch_mode, lookahead=lookahead,
                        low_bit_on_miss=low_bit_on_miss, repair=repair)

    @classmethod
    def open(cls, path: str | Path, *, device_budget_bytes: int,
             fingerprint: bytes | str | None = None, eviction: str = "lru",
             per_layer: bool = False, admission: str | None = None,
             prefetch: str | None = "queue", prefetch_mode: str = "sync",
             lookahead: bool = False, low_bit_on_miss: bool = False, repair: bool = True,
             readonly: bool = False) -> RkvExperts:
        """Reopen a store :meth:`create` wrote. ``fingerprint``, when given, must be the
        store's (``RecordMismatchError``). Cache options: ``eviction`` (a ``policies`` spec),
        ``per_layer``, ``admission`` (e.g. ``"after(n=2)"``), ``prefetch`` (a prefetch spec,
        None: hints ignored), ``prefetch_mode`` (``sync``: a hint loads before it returns;
        ``background``: a worker thread; ``off``), ``lookahead`` (after each layer, offer
        every expert of the next layer to the prefetch policy), ``low_bit_on_miss`` (serve a
        miss from the low-bit copy and load the exact expert in the background), ``repair``
        (rewrite records whose read needed a correction)."""
        root = Path(path)
        body = read_manifest(root)
        if fingerprint is not None and model_fingerprint(fingerprint).hex() != body[
                "fingerprint"]:
            raise RecordMismatchError(f"{root} holds another model's experts")
        cfgs = [TierConfig.from_dict(t) for t in body["tiers"]]
        tiers = open_tiers(root, cfgs, readonly)
        try:
            return cls(root, body, tiers, device_budget_bytes=device_budget_bytes,
                       eviction=eviction, per_layer=per_layer, admission=admission,
                       prefetch=prefetch, prefetch_mode=prefetch_mode, lookahead=lookahead,
                       low_bit_on_miss=low_bit_on_miss, repair=repair and not readonly)
        except BaseException:
            for t in tiers.values():
                t.close()
            raise

    @staticmethod
    def destroy(path: str | Path) -> None:
        """Delete a store (its tiers under ``path``; tiers configured elsewhere stay)."""
        shutil.rmtree(path, ignore_errors=True)

    # -- what the model calls ----------------------------------------------------------------
    @property
    def n_layers(self) -> int:
        return len(self.infos)

    def n_experts(self, layer: int) -> int:
        return len(self.infos[layer])

    def info(self, layer: int, expert: int) -> ExpertInfo:
        return self.infos[layer][expert]

    def record_key(self, layer: int, expert: int, *, low: bool = False) -> bytes:
        """The tier key of an expert's record (``low``: of its low-bit copy)."""
        return tier_key(self.fingerprint, layer, expert, LOW if low else FULL)

    def _item(self, key: Key) -> Item:
        info = self.infos[key[0]][key[1]]
        t = next(c for c in self.tier_configs if c.name == info.tier)
        cost = t.latency_us * 1e-6 + info.record_bytes / (t.read_gbps * 1e9)
        return Item(key, info.nbytes, info.tier, key[0], key[0], miss_cost=cost)

    def _check(self, layer: int, ids: Iterable[int]) -> list[int]:
        if self._closed:
            raise StoreError("RkvExperts is closed")
        if not 0 <= layer < len(self.infos):
            raise InputError(f"layer {layer} out of range [0, {len(self.infos)})")
        out = list(dict.fromkeys(int(i) for i in ids))
        bad = [i for i in out if not 0 <= i < len(self.infos[layer])]
        if bad:
            raise InputError(f"layer {layer} has no experts {bad}")
        return out

    def experts(self, layer: int, ids: Sequence[int]) -> dict[int, ExpertWeights]:
        """The verified weights of experts ``ids`` of ``layer``: hits from the device cache,
        misses loaded from the tiers (an :class:`ApproximateExpert` only from the low-bit
        copy, counted), or :class:`ExpertLoadError`."""
        want = self._check(layer, ids)
        out: dict[int, ExpertWeights] = {}
        with self._lock:
            self._steps += layer == 0
            self._now += 1
            now = self._now
            misses: list[tuple[int, Future[ExpertWeights | None] | None]] = []
            for e in want:
                key = (layer, e)
                entry = self.cache.lookup(key, self._item(key), now)
                if self.prefetcher is not None:
                    self.prefetcher.on_access(key, entry is not None, now)
                if entry is not None:
                    self._c["hits"] += 1
                    if entry.prefetched:
                        entry.prefetched = False
                        self._c["prefetch_used"] += 1
                    out[e] = entry.weights
                else:
                    self._c["misses"] += 1
                    misses.append((e, self._inflight.get(key)))
        protected = {(layer, e) for e in want}
        for e, fut in misses:
            w = fut.result() if fut is not None else None
            if w is not None:
                self._count("prefetch_late")
            elif self.low_bit_on_miss:
                try:
                    w = self._low(layer, e, "miss")
                    self._prefetch([(layer, e)], background=True)
                except IntegrityError:
                    w = None
            if w is None:
                w = self._load(layer, e)
            if not isinstance(w, ApproximateExpert):
                with self._lock:
                    self.cache.admit(self._item((layer, e)), w, now, protected)
                    entry = self.cache.entries.get((layer, e))
                    if entry is not None:      # a late prefetch's entry: used now
                        entry.prefetched = False
            out[e] = w
        if self.lookahead and layer + 1 < len(self.infos):
            self.hint(layer + 1, range(len(self.infos[layer + 1])))
        return {e: out[e] for e in want}

    def hint(self, layer: int, ids: Iterable[int]) -> None:
        """Prefetch what the prefetch policy picks of ``ids`` (not cached, not in flight)
        into the device cache; never raises for a load (failures are counted)."""
        if self.prefetcher is None or self._closed or not 0 <= layer < len(self.infos):
            return
        n = len(self.infos[layer])
        with self._lock:
            cands = [self._item((layer, e)) for e in dict.fromkeys(int(i) for i in ids)
                     if 0 <= e < n and (layer, e) not in self.cache.entries
                     and (layer, e) not in self._inflight]
            if not cands:
                return
            keys: list[Key] = self.prefetcher.hints(
                cands, self.cache.policy(layer).capacity)  # type: ignore[assignment]
        if keys:
            self._prefetch(keys, background=self.prefetch_mode == "background")

    def _prefetch(self, keys: list[Key], background: bool) -> None:
        with self._lock:
            keys = [k for k in keys if k not in self._inflight]
            for k in keys:
                self._inflight[k] = Future()
            self._c["prefetch_issued"] += len(keys)
        if not keys:
            return
        if background:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="rkv-moe-prefetch")
            self._pool.submit(self._run_prefetch, keys)
        else:
            self._run_prefetch(keys)

    def _run_prefetch(self, keys: list[Key]) -> None:
        protected = set(keys)
        for k in keys:
            w: ExpertWeights | None = None
            try:
                w = self._load_exact(*k)
            except Exception as exc:  # a prefetch never fails the model
                self._count("prefetch_failed")
                log.debug("prefetch of expert %s failed: %s", k, exc)
            finally:
                with self._lock:
                    if w is not None:
                        self.cache.admit(self._item(k), w, self._now, protected, True)
                    fut = self._inflight.pop(k)
                fut.set_result(w)

    # -- the verified read path and its faults -----------------------------------------------
    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._c[name] += n

    def _fault(self, layer: int, expert: int, tier: str, exc: BaseException) -> None:
        with self._lock:
            self._c["uncorrectable"] += 1
            self._errors_by_type[type(exc).__name__] += 1
            self.recent_errors.append(f"{layer}/{expert} in {tier}: {type(exc).__name__}: {exc}")
        log.warning("expert %d of layer %d in tier %s is unreadable: %s: %s", expert, layer,
                    tier, type(exc).__name__, exc)

    def _write(self, tier: str, key: bytes, record: Any, what: str) -> None:
        try:
            self.tiers[tier].put(key, record)
        except RkvError as exc:
            log.warning("could not %s in tier %s: %s", what, tier, exc)
            self._count("repairs_failed")
            return
        with self._lock:
            self._c["repaired"] += 1
            self._tier_c[tier]["bytes_written"] += len(record)

    def _read(self, tier: str, layer: int, expert: int, variant: int,
              heal: bool = False) -> ExpertWeights:
        info = self.infos[layer][expert]
        t0 = time.perf_counter()
        codec = (pipeline_for(info.bits, info.ecc).for_block(info.shape, info.dtype).codec
                 if heal else None)
        with self.tiers[tier].reader() as r:
            v = read_expert(r, self.fingerprint, layer, expert, info, variant,
                            repair=self.repair, heal_codec=codec, heal=heal)
        with self._lock:
            self._c["load_seconds_us"] += int((time.perf_counter() - t0) * 1e6)
            self._c["loads"] += 1
            self._tier_c[tier]["reads"] += 1
            self._tier_c[tier]["bytes_read"] += v.record_bytes
            if variant == FULL:
                self._loads[(layer, expert)] += 1
            if v.corrected:
                self._c["corrected"] += 1
        key = tier_key(self.fingerprint, layer, expert, variant)
        if v.rewrite is not None and self.repair:
            self._write(tier, key, v.rewrite, "repair a corrected record")
        if v.heal is not None and self.repair:
            self._write(info.tier, key, v.heal, "restore a record from its copy")
        return v.weights

    def _load_exact(self, layer: int, expert: int) -> ExpertWeights:
        info = self.infos[layer][expert]
        errors: list[tuple[str, BaseException]] = []
        for tier, heal in ((info.tier, False), (info.backup, True)):
            if tier is None:
                continue
            try:
                w = self._read(tier, layer, expert, FULL, heal=heal)
            except IntegrityError as exc:
                if self.infos[layer][expert] is not info:     # moved by replan meanwhile
                    return self._load_exact(layer, expert)
                errors.append((tier, exc))
                self._fault(layer, expert, tier, exc)
                continue
            if heal:
                self._count("reloaded_from_copy")
            return w
        raise ExpertLoadError(layer, expert, errors)

    def _low(self, layer: int, expert: int, reason: str) -> ApproximateExpert:
        w = self._read(self.tier_configs[0].name, layer, expert, LOW)
        with self._lock:
            self._c["approximate"] += 1
        assert self.low_bit_copy is not None
        return ApproximateExpert(w.gate, w.up, w.down, bits=self.low_bit_copy, reason=reason)

    def _load(self, layer: int, expert: int) -> ExpertWeights:
        try:
            return self._load_exact(layer, expert)
        except ExpertLoadError as exc:
            if not self.infos[layer][expert].low_bytes:
                raise
            try:
                return self._low(layer, expert, "loss")
            except IntegrityError as low_exc:
                self._fault(layer, expert, self.tier_configs[0].name, low_exc)
                raise ExpertLoadError(layer, expert, [*exc.errors,
                                                      ("low-bit copy", low_exc)]) from exc

    # -- bookkeeping -------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Counters since open: hits, misses, loads and their time, bytes per tier, prefetches
        (issued, used: hit before anything else touched them, late: a miss that waited for
        one, wasted: evicted unused, failed), faults (corrected, uncorrectable by error type,
        reloaded from the copy, repaired, approximate), the cache's size."""
        with self._lock:
            c = self._c
            looked = c["hits"] + c["misses"]
            return {
                "hits": c["hits"], "misses": c["misses"],
                "hit_rate": c["hits"] / looked if looked else 0.0,
                "loads": c["loads"], "load_seconds": c["load_seconds_us"] / 1e6,
                "tiers": {t: {k: v[k] for k in ("reads", "bytes_read", "bytes_written")}
                          for t, v in self._tier_c.items()},
                "prefetch": {"issued": c["prefetch_issued"], "used": c["prefetch_used"],
                             "late": c["prefetch_late"], "wasted": self.cache.prefetch_wasted,
                             "failed": c["prefetch_failed"],
                             "in_flight": len(self._inflight)},
                "corrected": c["corrected"], "uncorrectable": c["uncorrectable"],
                "errors": dict(self._errors_by_type),
                "reloaded_from_copy": c["reloaded_from_copy"], "repaired": c["repaired"],
                "repairs_failed": c["repairs_failed"], "approximate": c["approximate"],
                "cache": {"entries": len(self.cache.entries), "bytes": self.cache.used,
                          "budget": self.cache.budget, "evictions": self.cache.evictions,
                          "refused": self.cache.refused},
            }

    def usage(self) -> tuple[dict[Key, float], int]:
        """(tier loads per forward step of each expert loaded since open, steps)."""
        with self._lock:
            n = max(self._steps, 1)
            return {k: v / n for k, v in self._loads.items()}, self._steps

    def replan(self, placement: PlacementConfig | Mapping[str, Any] | None = None,
               profile: ExpertProfile | None = None, **kw: Any) -> ReplanReport:
        """Re-place the experts from :meth:`usage` (:func:`rkv.moe.plan.replan`)."""
        return replan(self, placement, profile, **kw)

    def settle(self) -> None:
        """Wait for the background prefetches queued so far."""
        with self._lock:
            futs = list(self._inflight.values())
        for f in futs:
            f.result()

    def wrap_tier(self, name: str, wrap: Callable[[Tier], Tier]) -> Tier:
        """Replace tier ``name`` by ``wrap(tier)`` (e.g. a FaultyTier); returns the new one."""
        self.tiers[name] = wrap(self.tiers[name])
        return self.tiers[name]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        with self._lock:
            self.cache.clear()
        for t in self.tiers.values():
            t.close()

    def __enter__(self) -> RkvExperts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
