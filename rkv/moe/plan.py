"""Per-expert tier, bits and code for :class:`~rkv.adapters.moe.RkvExperts`: the plan a
store is created with, and re-placement from the loads the adapter has seen (docs/moe.md,
"Per-expert bits and codes").

Both ask :func:`rkv.moe.expert_plans.plan_experts`, the one place where an expert's
(tier, bits, code) is decided. At create time an expert's expected loads per token are the
``usage`` given (e.g. activation rates from a routing trace), else equal. :func:`replan`
learns them: the device cache's misses per forward step since the store was opened, so an
expert the cache keeps needs no fast tier, and one it keeps missing earns one. Re-placing
moves records between tiers and re-encodes them under a new code through the verified read
path (never from unverified bytes); without the original weights their bits stay as stored.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from policies.base import Reason
from rkv.errors import ConfigError, InputError, IntegrityError, TierFullError
from rkv.format.dtypes import numpy_dtype
from rkv.moe.cache import DeviceCache, Key
from rkv.moe.expert_plans import ExpertInput, ExpertPlan, plan_experts
from rkv.moe.experts import ExpertWeights
from rkv.moe.store import (
    FULL,
    ExpertInfo,
    dtype_of,
    encode_expert,
    pack,
    pipeline_for,
    read_expert,
    read_manifest,
    tier_key,
    write_manifest,
)
from rkv.placement.config import PlacementConfig, TierInput
from rkv.store.config import TierConfig
from rkv.tiers import Tier

if TYPE_CHECKING:
    from rkv.moe.profile import ExpertProfile

_BATCH = 32            # moves per manifest update


class ReplanTarget(Protocol):
    """What :func:`replan` needs of the adapter whose records it moves
    (:class:`rkv.adapters.moe.RkvExperts`, above this package): the store's directory,
    fingerprint, tiers and their configs, the experts' records (``infos``, which a replan
    switches to the moved ones), the device cache, the loads seen, and the adapter's lock and
    fault report."""

    infos: list[list[ExpertInfo]]

    @property
    def root(self) -> Path: ...

    @property
    def fingerprint(self) -> bytes: ...

    @property
    def tier_configs(self) -> Sequence[TierConfig]: ...

    @property
    def tiers(self) -> Mapping[str, Tier]: ...

    @property
    def cache(self) -> DeviceCache: ...

    @property
    def _lock(self) -> AbstractContextManager[Any]: ...

    def usage(self) -> tuple[dict[Key, float], int]: ...

    def settle(self) -> None: ...

    def _fault(self, layer: int, expert: int, tier: str, exc: BaseException) -> None: ...


def tier_inputs(cfgs: Sequence[TierConfig], reserved: Mapping[str, int]) -> list[TierInput]:
    """The tiers as the planner sees them, less what copies already hold."""
    out = []
    for t in cfgs:
        free = int(t.capacity_bytes) - int(reserved.get(t.name, 0))
        if free < 0:
            raise TierFullError(f"tier {t.name} cannot hold the copies placed there "
                                f"({reserved[t.name]} bytes, capacity {t.capacity_bytes})")
        out.append(TierInput(t.name, t.fault_model, free, t.read_gbps, t.latency_us))
    return out


def plan_new(experts: Sequence[Sequence[ExpertWeights]], cfgs: Sequence[TierConfig], *,
             placement: PlacementConfig | Mapping[str, Any] | None,
             profile: ExpertProfile | None, usage: Mapping[tuple[int, int], float] | None,
             low_bit_copy: int | None, backup_tier: str | None,
             kl_budget: float | None) -> ExpertPlan:
    """The plan of a new store. Low-bit copies (first tier) and backup copies (at 16 bits
    under the backup tier's code, an upper bound) are reserved before planning."""
    reserved: dict[str, int] = {}
    inputs = []
    for li, layer in enumerate(experts):
        for ei, w in enumerate(layer):
            shape, dt = tuple(pack(w).shape), dtype_of(w)
            if low_bit_copy is not None:
                p = pipeline_for(low_bit_copy, cfgs[0].ecc).for_block(shape, dt)
                reserved[cfgs[0].name] = reserved.get(cfgs[0].name, 0) + p.record_bytes(
                    shape, dt)
            if backup_tier is not None:
                ecc = next(t.ecc for t in cfgs if t.name == backup_tier)
                p = pipeline_for(16, ecc).for_block(shape, dt)
                reserved[backup_tier] = reserved.get(backup_tier, 0) + p.record_bytes(shape, dt)
            loads = 1.0 if usage is None else float(usage.get((li, ei), 0.0))
            inputs.append(ExpertInput(li, ei, int(w.gate.shape[0]), int(w.gate.shape[1]), dt,
                                      loads))
    return plan_experts(inputs, tier_inputs(cfgs, reserved), placement, profile,
                        kl_budget=kl_budget)


@dataclass(frozen=True)
class ReplanReport:
    """What :func:`replan` did: the plan, experts moved to a faster or slower tier,
    re-encoded under another code or bit-width, left where they were because no copy could be
    read (``unreadable``), bytes written, and the time it took."""

    plan: ExpertPlan
    steps: int
    promoted: int
    demoted: int
    recoded: int
    rebitted: int
    unreadable: int
    bytes_written: int
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if k != "plan"}
        return {**d, "plan": {k: v for k, v in self.plan.to_dict().items() if k != "choices"}}


def replan(rx: ReplanTarget, placement: PlacementConfig | Mapping[str, Any] | None = None,
           profile: ExpertProfile | None = None, *,
           experts: Sequence[Sequence[ExpertWeights]] | None = None,
           kl_budget: float | None = None, min_steps: int = 1) -> ReplanReport:
    """Re-place ``rx``'s experts from the loads it observed (module docstring). ``experts``:
    the original weights, letting bits change too. Runs under the adapter's lock: loads
    wait until it returns."""
    t0 = time.perf_counter()
    loads, steps = rx.usage()
    if steps < min_steps:
        raise InputError(f"replan needs at least {min_steps} observed forward steps, "
                         f"has {steps}")
    infos = rx.infos
    if experts is not None and [len(x) for x in experts] != [len(x) for x in infos]:
        raise InputError("experts must have the store's layers and experts")
    first = rx.tier_configs[0].name
    ecc = {t.name: t.ecc for t in rx.tier_configs}
    reserved: dict[str, int] = {first: sum(i.low_bytes for layer in infos for i in layer)}
    inputs, fixed = [], {}
    for li, layer in enumerate(infos):
        for ei, info in enumerate(layer):
            if info.backup is not None:
                p = pipeline_for(info.bits, ecc[info.backup]).for_block(info.shape, info.dtype)
                reserved[info.backup] = reserved.get(info.backup, 0) + p.record_bytes(
                    info.shape, info.dtype)
            inputs.append(ExpertInput(li, ei, info.n, info.d, info.dtype,
                                      loads.get((li, ei), 0.0)))
            fixed[(li, ei)] = info.bits
    plan = plan_experts(inputs, tier_inputs(rx.tier_configs, reserved), placement, profile,
                        kl_budget=kl_budget, fixed_bits=None if experts is not None else fixed)
    rank = {t.name: i for i, t in enumerate(rx.tier_configs)}
    counts = dict.fromkeys(("promoted", "demoted", "recoded", "rebitted", "unreadable",
                            "bytes_written"), 0)
    todo = [c for c in plan.choices if (c.tier, c.bits, c.code) != (
        infos[c.layer][c.expert].tier, infos[c.layer][c.expert].bits,
        infos[c.layer][c.expert].ecc)]
    # Demotions first: they free the fast tiers the promotions need.
    todo.sort(key=lambda c: rank[c.tier] - rank[infos[c.layer][c.expert].tier], reverse=True)
    rx.settle()
    with rx._lock:
        for i in range(0, len(todo), _BATCH):
            _move_batch(rx, todo[i:i + _BATCH], experts, rank, counts)
    return ReplanReport(plan, steps, counts["promoted"], counts["demoted"], counts["recoded"],
                        counts["rebitted"], counts["unreadable"], counts["bytes_written"],
                        time.perf_counter() - t0)


def _move_batch(rx: ReplanTarget, batch: Sequence[Any],
                experts: Sequence[Sequence[ExpertWeights]] | None, rank: Mapping[str, int],
                counts: dict[str, int]) -> None:
    """Write the batch's new records, switch the manifest (and the adapter) to them, then
    delete the old ones: a crash leaves the manifest naming records that exist."""
    fp = rx.fingerprint
    new: dict[tuple[int, int], ExpertInfo] = {}
    old: list[tuple[str, bytes]] = []
    for c in batch:
        info = rx.infos[c.layer][c.expert]
        key = tier_key(fp, c.layer, c.expert, FULL)
        pipe = pipeline_for(c.bits, c.code)
        record = _new_record(rx, info, c, pipe, experts)
        if record is None:
            counts["unreadable"] += 1
            continue
        rx.tiers[c.tier].put(key, record)
        counts["bytes_written"] += len(record)
        if c.tier != info.tier:
            old.append((info.tier, key))
        counts["promoted" if rank[c.tier] < rank[info.tier] else
               "demoted" if rank[c.tier] > rank[info.tier] else "recoded"] += 1
        if c.bits != info.bits:
            counts["rebitted"] += 1
            rx.cache.remove((c.layer, c.expert), Reason.DELETED)
        new[(c.layer, c.expert)] = replace(info, tier=c.tier, bits=c.bits, ecc=c.code,
                                           record_bytes=len(record),
                                           backup=None if info.backup == c.tier else
                                           info.backup)
    if not new:
        return
    infos = [[new.get((li, ei), i) for ei, i in enumerate(layer)]
             for li, layer in enumerate(rx.infos)]
    body = read_manifest(rx.root)
    body["layers"] = [[i.to_dict() for i in layer] for layer in infos]
    write_manifest(rx.root, body)
    rx.infos = infos
    for tier, key in old:
        rx.tiers[tier].delete(key)


def _new_record(rx: ReplanTarget, info: ExpertInfo, c: Any, pipe: Any,
                experts: Sequence[Sequence[ExpertWeights]] | None) -> Any:
    """The expert's record under its new pipeline: from the original weights when its bits
    change, else re-encoded from a verified read of its current record or backup (None when
    neither can be read)."""
    fp = rx.fingerprint
    if c.bits != info.bits:
        if experts is None:
            raise ConfigError("internal: bits changed without the original weights")
        w = experts[c.layer][c.expert]
        cast = ExpertWeights(*(a.astype(numpy_dtype(info.dtype)) for a in (w.gate, w.up,
                                                                           w.down)))
        return encode_expert(fp, c.layer, c.expert, pack(cast), info.dtype, pipe)
    codec = pipe.for_block(info.shape, info.dtype).codec
    for tier in (info.tier, info.backup):
        if tier is None:
            continue
        try:
            with rx.tiers[tier].reader() as r:
                v = read_expert(r, fp, c.layer, c.expert, info, FULL, heal=True,
                                heal_codec=codec)
            return v.heal
        except IntegrityError as exc:
            rx._fault(c.layer, c.expert, tier, exc)
    return None
