"""The write path: a put's new chunks encoded into records, placed by the decisions module.

Runs inside one mutation (:mod:`rkv.store.txn`): for each chunk in prefix order, a chunk already
stored is reported to the policies as a use and skipped; a new one is reported as a miss,
given a tier by :meth:`Decisions.place` (which may demote or evict others, never the chunks
of this put up to it, pinned chunks or chunks being read), and its blocks are planned as
records encoded with that tier's quantizer and ECC.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from policies.base import Item, Reason
from rkv.codec.blockcodec import (
    BlockToEncode,
    encode_blocks,
)
from rkv.codec.pipeline import Pipeline
from rkv.errors import ConfigError, CorruptStoreError, TierFullError
from rkv.format.keys import block_key
from rkv.format.model import ModelSpec
from rkv.format.record import RecordHeader, encode_array_record
from rkv.store.clock import now_ns as stamped
from rkv.store.decisions import RECOMPUTE_TPS, Protected, free_chunk
from rkv.store.index import ChunkMeta
from rkv.store.results import PutResult
from rkv.store.storemix import pipeline_label
from rkv.store.txn import Pending

if TYPE_CHECKING:
    from rkv.placement import PlacementConfig
    from rkv.store.core import StoreCore


class Scratch:
    """A reusable, growable uint8 buffer (records are encoded into it one at a time)."""

    def __init__(self) -> None:
        self._buf = np.empty(0, dtype=np.uint8)

    def __call__(self, n: int) -> np.ndarray:
        if self._buf.size < n:
            self._buf = np.empty(n, dtype=np.uint8)
        return self._buf[:n]


class Planned:
    """The pipelines of one put's blocks, per tier and chunk, sized once: the tier's own
    quantizer and code, or with placement what the plan for that tier chose per block."""

    def __init__(self, core: StoreCore, plan: PutPlan) -> None:
        self._core, self._plan = core, plan
        self._pipes: dict[tuple[str, int], list[Pipeline]] = {}
        self._sizes: dict[tuple[str, int], list[int]] = {}
        self._mixed: list[tuple[list[str], list[Pipeline], list[int]]] | None = None

    def mixed(self, chunk: int) -> tuple[list[str], list[Pipeline], list[int]] | None:
        """With placement's ``place_tiers``: per layer of ``chunk`` the tier, pipeline and
        record bytes the plan chose among the usable tiers (one plan covers the put);
        None otherwise."""
        core = self._core
        pl = core.placement
        if pl is None or not pl.cfg.place_tiers:
            return None
        if self._mixed is None:
            spec = self._plan.spec
            tokens = [e - s for s, e in self._plan.bounds]
            # A shared tier holds whole chunks other stores adopt: not a place for parts.
            usable = [t for t in core.decisions.order if core.decisions.usable(t)
                      and not core.tiers[t].shared]
            self._mixed = []
            plans = pl.tiered_plan(spec, tokens, len(tokens), usable,
                                   self._plan.placement) if usable else []
            for c, chunk_plan in enumerate(plans):
                pipes, sizes = _sized([p for _, p in chunk_plan], spec, tokens[c])
                self._mixed.append(([t for t, _ in chunk_plan], pipes, sizes))
        return self._mixed[chunk] if self._mixed else None

    def pipes(self, tier: str, chunk: int) -> list[Pipeline]:
        key = (tier, chunk)
        if key not in self._pipes:
            self._fill(tier, chunk)
        return self._pipes[key]

    def sizes(self, tier: str, chunk: int) -> list[int]:
        self.pipes(tier, chunk)
        return self._sizes[tier, chunk]

    def _fill(self, tier: str, chunk: int) -> None:
        core, spec = self._core, self._plan.spec
        tokens = [e - s for s, e in self._plan.bounds]
        if core.placement is not None:     # one plan per tier covers the whole put
            chunks = list(enumerate(core.placement.put_plan(spec, tokens, len(tokens),
                                                               tier, self._plan.placement)))
        else:                                 # the same for every chunk of n tokens
            one = core.pipeline(tier)
            same = [c for c, n in enumerate(tokens) if n == tokens[chunk]]
            chunks = [(c, [one] * spec.n_layers) for c in same]
        for c, pipes in chunks:
            self._pipes[tier, c], self._sizes[tier, c] = _sized(pipes, spec, tokens[c])


def _sized(pipes: list[Pipeline], spec: ModelSpec, tokens: int
           ) -> tuple[list[Pipeline], list[int]]:
    """Each layer's pipeline as it applies to a block of ``tokens`` tokens, and its record
    bytes; layers share pipelines, so each distinct one is fitted and sized once."""
    shape = spec.block_shape(tokens)
    memo: dict[int, tuple[Pipeline, int]] = {}
    for p in pipes:
        if id(p) not in memo:
            f = p.for_block(shape, spec.dtype)
            memo[id(p)] = (f, f.record_bytes(shape, spec.dtype))
    return [memo[id(p)][0] for p in pipes], [memo[id(p)][1] for p in pipes]


@dataclass
class PutPlan:
    """One put, validated: what :func:`write_chunks` needs."""

    keys: list[bytes]
    bounds: list[tuple[int, int]]
    spec: ModelSpec
    fp: bytes
    arr: np.ndarray
    n_tokens: int
    placement: PlacementConfig | None = None    # the put's own targets


class EncodeBatch:
    """The compute-bound blocks of one put, encoded together on the codec thread pool
    (:func:`rkv.codec.blockcodec.encode_blocks`) the first time a write asks for one of them
    (the flush, or a move of a planned write within the mutation). Each block's planned
    write is a callable that returns its record, so a write the mutation drops is never
    encoded in vain. Blocks added after a first encode are encoded as a batch of their own.

    Records are carved from reused arenas (fresh memory costs a page fault per 4 KiB, about
    as much as an RS encode, and faults serialize threads). A record must stay valid until
    the flush writes it, and the writes of several puts and tiers interleave in one flush,
    so an arena serves one batch per mutation: the engine's arenas come back for reuse when
    the next mutation starts (mutations run one at a time, under the writer lock, and each
    flushes before it ends)."""

    def __init__(self, core: StoreCore, pending: Pending) -> None:
        self.core = core
        self.jobs: list[BlockToEncode] = []
        self.records: list[Any] = []
        core.arenas.begin(pending)

    def add(self, job: BlockToEncode) -> Callable[[], Any]:
        self.jobs.append(job)
        return partial(self._record, len(self.jobs) - 1)

    def _record(self, i: int) -> Any:
        if i >= len(self.records):
            self.records += encode_blocks(self.jobs[len(self.records):],
                                          self.core.arenas.take())
        return self.records[i]


def _needs(tiers: list[str], sizes: list[int]) -> dict[str, int]:
    """Bytes per tier of one chunk's planned blocks."""
    out: dict[str, int] = {}
    for t, n in zip(tiers, sizes, strict=True):
        out[t] = out.get(t, 0) + n
    return out


def write_chunks(core: StoreCore, plan: PutPlan, txn: Any, pending: Pending) -> PutResult:
    """Plan the records of ``plan``'s new chunks and their index entries (one mutation)."""
    ix, decide = core.index, core.decisions
    spec, fp, keys = plan.spec, plan.fp, plan.keys
    ix.put_model(txn, fp, spec.stored_json())
    now_ns = time.time_ns()
    now = now_ns / 1e9
    # Access times, strictly increasing in key order (what a touch after the put would give):
    # a new entry is written with its own, a stored one is touched with it.
    at = decide.stamps(len(keys))
    stamp = stamped(core.clock)      # the records' write time, by the engine's clock
    mine: set[bytes] = set()
    protect = Protected(mine, decide, txn)
    stats: Counter[str] = Counter()
    per_tier: Counter[str] = Counter()
    written = deduped = blocks = nbytes = refused = 0
    scratch = Scratch()
    batch = EncodeBatch(core, pending)
    planned = Planned(core, plan)
    for i, key in enumerate(keys):
        mine.add(key)
        try:
            stored = ix.get_chunk(txn, key)
            if stored is not None:
                deduped += 1
                if decide.seen_stored(key, now):
                    decide.touch_at(key, at + i)
                if i == len(keys) - 1 and not stored.end:    # a sequence ends here now
                    ix.put_chunk(txn, key, stored.with_(end=True), stored)
                continue
        except CorruptStoreError:
            free_chunk(ix, txn, key, None, pending)  # heal a damaged entry
            decide.removed(key, Reason.DELETED)
        start, end = plan.bounds[i]
        header = RecordHeader(key=key, layer=0, fingerprint=fp,
                              shape=spec.block_shape(end - start), dtype=spec.dtype,
                              data_len=0, payload_len=0, written_ns=stamp)

        def chunk_size(tier: str, i: int = i) -> int:
            return sum(planned.sizes(tier, i))

        item = Item(key, size=chunk_size(decide.order[0]), group=fp, depth=i,
                    parent=keys[i - 1] if i else None,
                    miss_cost=(end - start) / RECOMPUTE_TPS)
        decide.missed(key, item, now)
        mixed = planned.mixed(i)
        if mixed is not None and decide.place_parts(
                txn, item, _needs(mixed[0], mixed[2]), protect, pending, stats, now):
            layer_tiers, pipes, layer_sizes = mixed
        else:
            try:
                tier = decide.place(txn, item, chunk_size, protect, pending, stats, now)
            except TierFullError:
                core.share.raise_if_down(chunk_size)   # skipped as down, not full
                raise
            if tier is None:
                refused += 1
                continue
            pipes, layer_sizes = planned.pipes(tier, i), planned.sizes(tier, i)
            layer_tiers = [tier] * spec.n_layers
        for layer in range(spec.n_layers):
            # Encoded at write time (raw blocks into one reused buffer: LMDB copies each
            # record, so no block needs a buffer of its own).
            pipe = pipes[layer]
            data = plan.arr[layer, :, start:end]
            enc: Callable[[], Any]
            if pipe.codec is None and pipe.quant is None:   # raw: what encode_block runs
                enc = partial(encode_array_record, header, data, scratch, layer)
            elif pipe.compute_bound:     # RS, BCH, a quantizer: threads
                enc = batch.add(BlockToEncode(header.with_layer(layer), data, pipe))
            else:
                enc = partial(pipe.encode, header.with_layer(layer), data, scratch)
            pending.write(layer_tiers[layer], block_key(key, layer), enc, layer_sizes[layer])
        meta = ChunkMeta(parent=keys[i - 1] if i else b"", pos=i, n_tokens=end - start,
                         fingerprint=fp, blocks=tuple(zip(layer_tiers, layer_sizes,
                                                          strict=True)),
                         at=at + i, pipes=tuple(pipeline_label(p) for p in pipes),
                         end=i == len(keys) - 1,
                         written=(stamp,) * spec.n_layers)
        ix.put_chunk(txn, key, meta, None)
        for tier in sorted(meta.tiers(), key=decide.order.index):   # a policy per part
            decide.inserted(key, meta, tier, now)
            per_tier[tier] += 1
        written += 1
        blocks += spec.n_layers
        nbytes += sum(layer_sizes)
    return PutResult(plan.n_tokens, len(keys), written, deduped, blocks, nbytes,
                     stats["evicted"], stats["demoted"], dict(per_tier), refused)



def delete_chunks(core: StoreCore, keys: list[bytes], force: bool, txn: Any,
                  pending: Pending) -> int:
    """Free the chunks of a stored sequence that nothing else needs, from its end."""
    ix = core.index
    metas, _ = core.reads.stored(txn, keys)
    if len(metas) != len(keys):
        return 0
    last = metas[-1]
    if last.end:
        ix.put_chunk(txn, keys[-1], last.with_(end=False), last)
    freed = 0
    for key in reversed(keys):
        meta = ix.get_chunk(txn, key)
        if meta is None or meta.end or (meta.pins and not force) or ix.has_kids(txn, key):
            break
        free_chunk(ix, txn, key, meta, pending)
        core.decisions.removed(key, Reason.DELETED)
        freed += 1
    return freed


def clear_chunks(core: StoreCore, fp: bytes | None, txn: Any, pending: Pending) -> int:
    """Remove every chunk (of model ``fp``, or all), records included."""
    ix = core.index
    victims = [(k, m) for k, m in ix.chunks(txn)
               if fp is None or (m is not None and m.fingerprint == fp)]
    for k, m in victims:
        if m is None:   # a damaged entry: its blocks may be in any tier
            for name, tier in core.tiers.items():
                for layer in range(1 << 16):
                    if tier.get(block_key(k, layer)) is None:
                        break
                    pending.drop(name, block_key(k, layer))
        free_chunk(ix, txn, k, m, pending)
        core.decisions.removed(k, Reason.DELETED)
    if fp is None:
        ix.clear(txn)
    else:
        ix.set_usage(txn, ix.recount_usage(txn))
    return len(victims)


def put_targets(core: StoreCore, over: Mapping[str, Any] | None) -> PlacementConfig | None:
    """A put's own placement targets over the store's, validated before anything is written
    (ConfigError: a bad key or value, or a store without a [placement] table)."""
    if over is None:
        return None
    if core.placement is None:
        raise ConfigError("placement targets given to a put, but the store has no "
                          "[placement] table to plan with")
    return core.placement.override(over)
