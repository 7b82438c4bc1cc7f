"""Keeping a store honest: reconcile at open, verify, repair, reclaim unreferenced records.

Damage is contained here. A tier counts as *wiped* only when its environment was created by
this open (so it is empty): only then are the index entries that pointed into it dropped. A
tier whose id cannot be read is *damaged* and kept as it is; a tier holding another store's
data is refused. Nothing here deletes a record it cannot account for: unreferenced records
are counted by :func:`verify` and deleted only by an explicit repair, under the writer lock.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rkv.codec.pipeline import Pipeline
from rkv.codec.stages import header_stages
from rkv.errors import (
    ConfigError,
    CorruptStoreError,
    IntegrityError,
    RkvError,
    StoreError,
)
from rkv.format.keys import block_key, split_block_key
from rkv.format.model import ModelSpec
from rkv.format.record import decode_record
from rkv.store.ages import TierAges
from rkv.store.clock import now_ns
from rkv.store.decisions import free_chunk
from rkv.store.index import INDEX_FORMAT
from rkv.store.results import (
    CORRECTED,
    DEGRADED,
    MISSING,
    OK,
    UNCORRECTABLE,
    VerifyReport,
)
from rkv.store.storemix import Mix, stages_label
from rkv.store.txn import Pending

if TYPE_CHECKING:
    from rkv.store.core import StoreCore

log = logging.getLogger("rkv")


def reconcile(core: StoreCore, txn: Any, pending: Pending, drop_tiers: frozenset[str]) -> None:
    """Bind the index to the tiers it is opened with (runs at every writable open)."""
    ix = core.index
    was = ix.upgrade(txn)
    core.migrated_from = was if was != INDEX_FORMAT else None
    ix.set_meta(txn, "config", core.config.to_dict())
    ix.set_meta(txn, "store", core.identity.to_meta())
    try:
        known = ix.get_meta(txn, "tiers")
        if known is not None and not (isinstance(known, dict) and all(
                isinstance(k, str) and isinstance(v, str) for k, v in known.items())):
            raise CorruptStoreError("index metadata 'tiers' is malformed")
    except CorruptStoreError as exc:
        log.warning("%s; binding the configured tiers as they are (nothing dropped)", exc)
        known = None
    known = known or {}
    current = {name: tier.store_id for name, tier in core.tiers.items()}
    lost: set[str] = set()
    for name, sid in known.items():
        tier = core.tiers.get(name)
        if tier is None:
            if name in drop_tiers:
                lost.add(name)
            elif ix.usage(txn).blocks(name) > 0:
                raise ConfigError(
                    f"tier {name!r} holds blocks of this store but is not in the config "
                    f"(renamed or removed?); restore its name, or open with "
                    f"drop_tiers=[{name!r}] to drop the chunks stored there"
                )
        elif tier.state == "damaged" or not tier.store_id:
            current[name] = sid   # keep the binding: its records may still be read
            if tier.state == "damaged":     # logged once, by the watch (rkv.store.tally)
                core.watch.observe(name, "damaged", f"damaged ({tier.damage}); its blocks "
                                   "read as errors")
            else:
                log.warning("tier %s is damaged (%s); its blocks read as errors", name,
                            tier.damage)
        elif tier.store_id != sid:
            if tier.state != "new":
                raise StoreError(
                    f"tier {name} ({getattr(tier, 'path', '?')}) holds another store's data "
                    f"(id {tier.store_id}, expected {sid}); nothing was changed"
                )
            lost.add(name)
    if lost:
        dropped = 0
        for key, meta in list(ix.chunks(txn)):
            if meta is not None and meta.tiers() & lost:
                free_chunk(ix, txn, key, meta, pending)
                dropped += 1
        ix.set_usage(txn, ix.recount_usage(txn))
        prev = core.index.meta_or_none(txn, "dropped") or {}
        ix.set_meta(txn, "dropped", {
            "chunks": int(prev.get("chunks", 0)) + dropped,
            "tiers": sorted(set(prev.get("tiers", [])) | lost),
            "at": time.time_ns(),
        })
        core.dropped_at_open = dropped
        core.decisions.invalidate()
        log.warning("tiers %s were wiped or removed; dropped %d chunks from the index (chunks "
                    "after them in other tiers are kept)", sorted(lost), dropped)
    ix.set_meta(txn, "tiers", {n: sid for n, sid in current.items() if n in core.tiers})


def _is_orphan(ix: Any, txn: Any, tier: str, key: bytes) -> bool:
    """A record that no index entry can account for (an unreadable entry accounts for
    every block key of its chunk: it may be rewritten)."""
    try:
        chunk, layer = split_block_key(key)
    except (ValueError, RkvError):
        return True
    if not ix.has_chunk(txn, chunk):
        return True
    try:
        meta = ix.get_chunk(txn, chunk)
    except CorruptStoreError:
        return False
    return meta is None or layer >= len(meta.blocks) or meta.blocks[layer][0] != tier


def _gone(ix: Any, key: bytes, meta: Any) -> bool:
    with ix.env.read() as txn:
        now = ix.read_chunk(txn, key)
    return now is None or now.blocks != meta.blocks


def verify(core: StoreCore, progress: Callable[[int, int], None] | None,
           repair: bool) -> VerifyReport:
    """Read and check every record the index refers to (see :meth:`Engine.verify`)."""
    ix = core.index
    with ix.env.read() as txn:
        entries = list(ix.chunks(txn))
        raw_models = ix.models(txn)
        dropped = core.index.meta_or_none(txn, "dropped") or {}
    models = {fp: ModelSpec.from_dict(s) for fp, s in raw_models.items() if s is not None}
    keys = {k for k, _ in entries}
    counts: Counter[str] = Counter()
    problems: list[tuple[str, int, str, str]] = []
    unlabelled: list[tuple[bytes, int, str]] = []
    to_repair: list[tuple[bytes, int, str]] = []
    unreadable = unreachable = 0
    for i, (key, meta) in enumerate(entries):
        if meta is None:
            unreadable += 1
            problems.append((key.hex(), -1, "index", "index entry failed its checksum"))
            continue
        if meta.parent and meta.parent not in keys:
            unreachable += 1
        spec = models.get(meta.fingerprint)
        for layer, (tier, _) in enumerate(meta.blocks):
            if spec is None:
                counts[UNCORRECTABLE] += 1
                problems.append((key.hex(), layer, tier, "unknown or damaged model entry"))
                continue
            st = core.reads.check_block(key, layer, meta, spec)
            if st.status == MISSING and _gone(ix, key, meta):
                break   # evicted or moved by a writer since the scan: nothing to check
            counts[st.status] += 1
            if st.status == CORRECTED and repair:
                to_repair.append((key, layer, tier))      # (a repair writes its label)
            elif repair and st.status in (OK, DEGRADED) and not meta.pipe(layer):
                unlabelled.append((key, layer, tier))
            if st.error is not None:
                problems.append((key.hex(), layer, tier, f"{type(st.error).__name__}: "
                                 f"{st.error}"))
        if progress is not None:
            progress(i + 1, len(entries))
    damaged = [n for n, t in core.tiers.items() if t.state == "damaged"]
    orphans = 0
    with ix.env.read() as txn:
        for name, t in core.tiers.items():
            if t.shared:      # other stores' records live there too: none is an orphan
                continue
            try:
                orphans += sum(1 for k in t.iter_keys() if _is_orphan(ix, txn, name, k))
            except RkvError as exc:
                if t.state != "missing" and name not in damaged:
                    damaged.append(name)
                problems.append(("", -1, name, f"cannot list records: {exc}"))
    reclaimed, usage_fixed, repaired, labelled = 0, False, 0, 0
    if repair:
        reclaimed, usage_fixed = core.mutate(lambda txn, p: _reclaim(core, txn, p))
        repaired = repair_blocks(core, to_repair) if to_repair else 0
        if unlabelled:
            labelled = core.mutate(lambda txn, p: _label(core, txn, unlabelled))
    return VerifyReport(
        chunks=len(entries), blocks=sum(counts.values()), ok=counts[OK],
        corrected=counts[CORRECTED], uncorrectable=counts[UNCORRECTABLE],
        missing=counts[MISSING], orphans=orphans, problems=problems, repaired=repaired,
        unreadable_chunks=unreadable, unreachable=unreachable, damaged_tiers=damaged,
        dropped=0 if repair else int(dropped.get("chunks", 0)), reclaimed=reclaimed,
        usage_fixed=usage_fixed, degraded=counts[DEGRADED], labelled=labelled,
    )


def _label(core: StoreCore, txn: Any, items: list[tuple[bytes, int, str]]) -> int:
    """Fill in the pipeline labels of index entries written before labels existed, from the
    records' own headers (so the stored mix and lossy demotion know their bits)."""
    ix = core.index
    done = 0
    by_key: dict[bytes, list[tuple[int, str]]] = {}
    for key, layer, tier in items:
        by_key.setdefault(key, []).append((layer, tier))
    for key, layers in by_key.items():
        meta = ix.get_chunk(txn, key)
        if meta is None:
            continue
        pipes = [meta.pipe(i) for i in range(len(meta.blocks))]
        before = done
        for layer, tier in layers:
            if meta.blocks[layer][0] != tier or pipes[layer]:
                continue     # moved or labelled meanwhile
            try:
                rec, _ = core.tiers[tier].fetch(block_key(key, layer))
                if rec is None:
                    continue
                pipes[layer] = stages_label(*header_stages(decode_record(rec).header))
            except RkvError:
                continue     # unreadable now: reads report it
            done += 1
        if done > before:
            ix.put_chunk(txn, key, meta.with_(pipes=tuple(pipes)), meta)
    return done


def _reclaim(core: StoreCore, txn: Any, pending: Pending) -> tuple[int, bool]:
    """Under the writer lock: delete true orphans, recompute usage, acknowledge drops."""
    ix = core.index
    reclaimed = 0
    for name, tier in core.tiers.items():
        if tier.state == "damaged" or tier.shared:
            continue
        try:
            for k in tier.iter_keys():
                if _is_orphan(ix, txn, name, k):
                    pending.drop(name, k)
                    reclaimed += 1
        except RkvError as exc:
            log.warning("tier %s: cannot list records to reclaim (%s)", name, exc)
    fresh = ix.recount_usage(txn)
    fixed = fresh.tiers != ix.usage(txn).tiers
    ix.set_usage(txn, fresh)
    ix.set_meta(txn, "dropped", {})
    return reclaimed, fixed


def repair_blocks(core: StoreCore, items: list[tuple[bytes, int, str]]) -> int:
    """Rewrite blocks that needed correction (:func:`rewrite_blocks`); how many were."""
    repaired = sum(rewrite_blocks(core, items))
    core.count(blocks_repaired=repaired)
    return repaired


def rewrite_pipeline(core: StoreCore, tier: str, dec: Any) -> Pipeline:
    """What a block rewritten into ``tier`` is re-encoded with (:meth:`Pipeline.reencode`
    keeps the record's own quantization): the tier's pipeline, or with placement the one
    the record has (it was planned for this tier)."""
    if core.placement is None:
        return core.pipeline(tier)
    return Pipeline.of_record(dec.header)


def rewrite_blocks(core: StoreCore, items: list[tuple[bytes, int, str]]) -> list[bool]:
    """Rewrite blocks from their stored record, in one transaction: verified, corrected and
    re-encoded (quantized values are kept, never re-quantized) with their tier's ECC, or
    with placement the code the record has (it was planned for this tier), and stamped
    with the engine's clock (a rewrite is a refresh). Per item, whether it was rewritten:
    not when it moved, was freed or is no longer correctable meanwhile."""
    ix = core.index

    def fn(txn: Any, pending: Pending) -> list[bool]:
        done: list[bool] = []
        stamp = now_ns(core.clock)    # a rewrite: the block starts aging anew
        for key, layer, tier in items:
            done.append(False)
            try:
                meta = ix.get_chunk(txn, key)
                if meta is None or meta.blocks[layer][0] != tier:
                    continue  # moved or freed meanwhile: nothing to repair here
                bkey = block_key(key, layer)
                record, erased = core.tiers[tier].fetch(bkey)
                if record is None:
                    continue
                dec = decode_record(record)
                quant, _ = header_stages(dec.header)
                pipe = rewrite_pipeline(core, tier, dec)
                rec = pipe.reencode(record, dec, erased, stamp)
            except IntegrityError:
                continue  # no longer correctable (or unreadable): reads keep reporting it
            size = memoryview(rec).nbytes
            if size != meta.blocks[layer][1]:
                core.decisions.invalidate()   # a policy's idea of the chunk's size changed
            blocks, pipes = list(meta.blocks), [meta.pipe(i) for i in range(len(meta.blocks))]
            written = [meta.written_at(i) for i in range(len(blocks))]
            blocks[layer], pipes[layer], written[layer] = (tier, size), \
                stages_label(quant, pipe.codec), stamp
            ix.put_chunk(txn, key, meta.with_(blocks=tuple(blocks), pipes=tuple(pipes),
                                              written=tuple(written)), meta)
            pending.write(tier, bkey, rec, size)
            done[-1] = True
        return done

    return list(core.mutate(fn))


def stats(core: StoreCore) -> dict[str, Any]:
    """Store contents, tier usage, block ages and this session's counters (see
    :meth:`Engine.stats`)."""
    core.check()
    core.observe_tiers()
    with core.lock:
        session = dict(core.counters)
        if core.decisions.fallbacks:
            session["placement_fallbacks"] = core.decisions.fallbacks
    ix = core.index
    chunks = pinned = tokens = unreadable = shared = 0
    mix, ages = Mix(), TierAges(now_ns(core.clock))
    with ix.env.read() as txn:
        usage = ix.usage(txn)
        models = ix.models(txn)
        kids = ix.kid_counts(txn)
        for key, m in ix.chunks(txn):
            chunks += 1
            if m is None:
                unreadable += 1
                continue
            pinned += m.pins > 0
            tokens += m.n_tokens
            mix.add(m)
            ages.add(m)
            shared += kids.get(key, 0) + int(m.end) > 1
    tiers = {}
    for name in core.order:
        tc = core.config.tier(name)
        tiers[name] = {
            "kind": tc.kind, "medium": tc.medium, "blocks": usage.blocks(name),
            "bytes": usage.bytes(name),
            "capacity_bytes": tc.capacity_bytes, "fault_model": tc.fault_model,
            "ecc": tc.ecc, **core.tiers[name].stats(), "mix": mix.tier(name),
            "ages": ages.tier(name),
        }
    placed: dict[str, Any] = {}
    if core.placement is not None:
        timing = core.placement.timing
        placed = {"lossy_demotions": core.decisions.lossy,
                  "placement_fallbacks": core.decisions.fallbacks,
                  "plans": int(timing["plans"]), "plan_us": int(timing["plan_us"]),
                  "estimates": core.placement.estimates()}
    return {
        "path": str(core.root),
        "store_id": core.identity.id,
        "readonly": core.readonly,
        "chunk_tokens": core.config.chunk_tokens,
        "chunks": chunks,
        "unreadable_chunks": unreadable,
        "tokens": tokens,
        "pinned_chunks": pinned,
        "shared_chunks": shared,
        "models": [{"fingerprint": fp.hex(), **(spec or {"damaged": True})}
                   for fp, spec in models.items()],
        "tiers": tiers,
        "session": {**session, **placed},
        #: This session's counters per tier and model ({tier: {model: {counter: n}}}),
        #: each tier's availability as this process saw it, and the last scrub pass.
        "session_by": core.tally.nested(),
        "availability": core.watch.summary(core.order),
        "last_scrub": core.tally.last_scrub,
        "now_ns": now_ns(core.clock),
    }
