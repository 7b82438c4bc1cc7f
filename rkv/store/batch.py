"""Puts and gets of several sequences at once: what :meth:`Engine.put` and :meth:`Engine.get`
run, with one sequence.

A batch pays the fixed costs once: one index read snapshot to find what is stored, one
mutation (writer lock, one index write transaction, one write batch per tier) for all the new
chunks of a put, one snapshot per tier for all the blocks of a get, one repair mutation and
one access-time update. Per sequence the results are those of calling put or get for each in
order: chunks stored by an earlier item are deduplicated by a later one inside the same
transaction, and a get reports each sequence's verified prefix and block statuses.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from rkv.errors import ReadOnlyStoreError, ShapeError
from rkv.format.dtypes import numpy_dtype
from rkv.format.keys import chunk_bounds
from rkv.format.model import ModelSpec, as_model_spec
from rkv.format.tensors import as_kv_array, to_output
from rkv.store.index import ChunkMeta
from rkv.store.readpath import Readers
from rkv.store.remote_share import announce
from rkv.store.results import (
    CORRECTED,
    OK,
    UNCORRECTABLE,
    BlockLog,
    BlockStatus,
    GetResult,
    PutResult,
)
from rkv.store.tally import model_label
from rkv.store.txn import Pending
from rkv.store.upkeep import repair_blocks
from rkv.store.writepath import PutPlan, put_targets, write_chunks

if TYPE_CHECKING:
    from rkv.store.core import StoreCore

_PUT_COUNTERS = ("chunks_written", "chunks_deduped", "blocks_written", "bytes_written",
                 "evicted_chunks", "demoted_chunks", "chunks_refused")


def put_many(core: StoreCore, items: Sequence[tuple[Any, Any]], model: ModelSpec | dict[str, Any],
             placement: dict[str, Any] | None = None) -> list[PutResult]:
    """Store each ``(tokens, kv)`` as :meth:`Engine.put` would, in one mutation.

    Everything is validated before anything is written. A failure while writing (a full
    tier with ``on_full="error"``, a damaged tier) aborts the whole batch: none of it is
    stored (one transaction), where separate puts would have kept the earlier ones.
    """
    spec = as_model_spec(model)
    prepared = []
    for tokens, kv in items:
        _, fp, toks, keys = core.prepare(tokens, spec)
        prepared.append((fp, toks, keys, as_kv_array(kv, spec, len(toks))))
    over = put_targets(core, placement)
    core.share.probe([(keys, len(toks)) for _, toks, keys, _ in prepared], spec, put=True)
    for fp, toks, keys, _ in prepared:
        if core.access_log is not None:
            core.access_log.record("put", fp, keys, len(toks))
    results: list[PutResult | None] = [None] * len(prepared)
    if any(keys for _, _, keys, _ in prepared) and core.readonly:
        raise ReadOnlyStoreError(f"{core.root} is open read-only")
    reads = core.reads
    with core.index.env.read() as txn:
        full = [bool(keys) and _stored_whole(reads.stored(txn, keys)[0], len(keys))
                for _, _, keys, _ in prepared]
    plans: list[tuple[int, PutPlan]] = []
    touched: list[bytes] = []
    for i, (fp, toks, keys, arr) in enumerate(prepared):
        if not keys:
            results[i] = PutResult(0, 0, 0, 0, 0, 0)
        elif full[i]:      # all stored already: no mutation, only a use of the chunks
            touched += core.decisions.used(keys, time.time())
            results[i] = PutResult(len(toks), len(keys), 0, len(keys), 0, 0)
        else:
            bounds = chunk_bounds(len(toks), core.config.chunk_tokens)[: len(keys)]
            plans.append((i, PutPlan(keys, bounds, spec, fp, arr, len(toks), over)))
    if touched:     # stamped before the plans' entries: the order the policies see them
        core.touch(touched)
    if plans:
        def write_all(txn: Any, pending: Pending) -> list[PutResult]:
            out = [write_chunks(core, plan, txn, pending) for _, plan in plans]
            core.share.write_through(pending, [plan.keys for _, plan in plans])
            return out

        for (i, _), res in zip(plans, core.mutate(write_all), strict=True):
            results[i] = res     # (their entries are written with access times: no touch)
    done = [r for r in results if r is not None]
    label = model_label(spec.fingerprint())
    core.tally.add(Counter({("chunks_written", tier, label): n
                            for r in done for tier, n in r.tiers.items()}))
    with core.lock:
        c = core.counters
        c["puts"] += len(done)
        for r in done:
            for name in _PUT_COUNTERS:
                c[name] += getattr(r, name)
    return done


def _stored_whole(metas: list[ChunkMeta], n: int) -> bool:
    return len(metas) == n and metas[-1].end


@dataclass
class _Get:
    keys: list[bytes]
    n_tokens: int
    metas: list[ChunkMeta]
    damaged: Any
    stored: int
    out: np.ndarray
    log: BlockLog = field(default_factory=BlockLog)
    done: int = 0


def check_out(out: Any, spec: ModelSpec, n_tokens: int, stored: int) -> np.ndarray:
    """``out`` as a get may fill it: ``[layers, 2, >= stored, kv_heads, head_dim]``, the
    model's dtype, writeable; else a :class:`ShapeError` before anything is read."""
    dtype = numpy_dtype(spec.dtype)
    want = (spec.n_layers, 2, n_tokens, spec.n_kv_heads, spec.head_dim)
    if (not isinstance(out, np.ndarray) or out.dtype != dtype or out.ndim != 5
            or out.shape[:2] != want[:2] or out.shape[3:] != want[3:]
            or out.shape[2] < stored or not out.flags.writeable):
        raise ShapeError(f"out must be a writeable {dtype} numpy array shaped {want} (or "
                         "longer along tokens)")
    return out


def plan_gets(core: StoreCore, requests: Sequence[Any], spec: ModelSpec,
              outs: Sequence[np.ndarray | None] | None) -> list[_Get]:
    """Index entries of every request's stored prefix (one snapshot), and its buffer."""
    if outs is not None and len(outs) != len(requests):
        raise ShapeError(f"{len(outs)} out buffers for {len(requests)} requests")
    prepared = [core.prepare(t, spec) for t in requests]
    for _, fp, toks, keys in prepared:
        if core.access_log is not None:
            core.access_log.record("get", fp, keys, len(toks))
        core.decisions.release(keys)      # the request ran: its prefetch hold is over
    core.share.probe([(keys, len(toks)) for _, _, toks, keys in prepared], spec)
    gets: list[_Get] = []
    while len(gets) < len(prepared):
        with core.index.env.read() as txn:
            for i, (_, _, toks, keys) in enumerate(prepared[len(gets):], len(gets)):
                metas, damaged = core.reads.stored(txn, keys)
                stored = sum(m.n_tokens for m in metas)
                out = None if outs is None else outs[i]
                if out is None:
                    out = np.empty((spec.n_layers, 2, stored, spec.n_kv_heads,
                                    spec.head_dim), numpy_dtype(spec.dtype))
                gets.append(_Get(keys, len(toks), metas, damaged, stored,
                                 check_out(out, spec, len(toks), stored)))
                if damaged is not None:
                    break    # a lookup that failed in LMDB leaves the snapshot unusable
    return gets


def get_many(core: StoreCore, requests: Sequence[Any], model: ModelSpec | dict[str, Any],
             outs: Sequence[np.ndarray | None] | None = None, as_torch: bool = False,
             strict: bool = False) -> list[GetResult]:
    """:meth:`Engine.get` of each request, the blocks of all read in one snapshot per tier."""
    spec = as_model_spec(model)
    gets = plan_gets(core, requests, spec, outs)
    fp = spec.fingerprint()
    reading = [k for g in gets for k in g.keys[: len(g.metas)]]
    core.decisions.reading(reading, +1)
    try:
        with ExitStack() as stack:
            readers = Readers(core.tiers, stack)
            announce(core, readers, [(g.keys, g.metas) for g in gets])
            for g in gets:
                g.log, g.done = core.reads.read_chunks(g.keys, g.metas, fp, spec, g.out,
                                                          strict, readers)
    finally:
        core.decisions.reading(reading, -1)
    for g in gets:
        if g.damaged is not None and g.done == g.stored:
            if strict:
                raise g.damaged
            g.log.extra.append(BlockStatus(len(g.metas), 0, "index", UNCORRECTABLE, 0,
                                           g.damaged))
            s, e = chunk_bounds(g.n_tokens, core.config.chunk_tokens)[len(g.metas)]
            g.stored += e - s
    finish_reads(core, [(g.keys, g.metas, g.done, g.log) for g in gets], fp)
    results = []
    for g in gets:
        kv = g.out if g.out.shape[2] == g.done else g.out[:, :, :g.done]
        results.append(GetResult(g.done, to_output(kv, spec.dtype, as_torch), g.log, g.stored))
    return results


def finish_reads(core: StoreCore, reads: list[tuple[list[bytes], list[ChunkMeta], int,
                                                     BlockLog]], fingerprint: bytes) -> None:
    """After reads (keys, index entries, tokens verified, block log each) of the model of
    ``fingerprint``: rewrite corrected blocks (one mutation), record access times, tell the
    promotions, count (per tier and model too: :mod:`rkv.store.tally`)."""
    core.share.forget_failed(reads)
    if core.config.repair and not core.readonly:
        fixes = [(keys[st.chunk], st.layer, st.tier) for keys, _, _, log in reads
                 for st in (*log.special.values(), *log.extra) if st.status == CORRECTED]
        if fixes:
            repair_blocks(core, fixes)
    core.touch([k for keys, metas, _, _ in reads for k in keys[: len(metas)]])
    if not core.readonly:
        for keys, metas, done, _ in reads:
            core.moves.after_read(keys, metas, done)
    by: Counter[tuple[str, str, str]] = Counter()
    model = model_label(fingerprint)
    for _, metas, done, log in reads:
        by["gets", "", model] += 1
        by["hits" if done > 0 else "misses", "", model] += 1
        for ci, tiers in log.chunks:
            blocks = metas[ci].blocks if ci < len(metas) else ()
            for layer, tier in enumerate(tiers):
                by["blocks_read", tier, model] += 1
                if layer < len(blocks):
                    by["bytes_read", tier, model] += blocks[layer][1]
        for st in log.extra:          # (a layer stream's blocks are all here)
            if st.tier in core.tiers:
                by["blocks_read", st.tier, model] += 1
        for st in (*log.special.values(), *log.extra):
            if st.status != OK:
                by[f"blocks_{st.status}", st.tier, model] += 1
                by["symbols_corrected", st.tier, model] += st.corrected
    core.tally.add(by)
    core.observe_tiers()
    with core.lock:
        c = core.counters
        for _, _, done, log in reads:
            c["gets"] += 1
            c["hits"] += int(done > 0)
            c["blocks_read"] += len(log)
            for status, n in log.counts().items():
                if n:
                    c[f"blocks_{status}"] += n

