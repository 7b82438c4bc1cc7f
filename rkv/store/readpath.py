"""The read path: verified blocks out of the tiers into a caller's array.

Reads take no lock: a reader works in LMDB snapshots, checks every record (header vote,
identity, checksum, ECC on a mismatch) and reports a status per block. Only the engine writes
(repairs, access times) after a read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import ExitStack
from typing import Any

import numpy as np

from rkv.codec.blockcodec import BlockToRead, Verified, read_block, read_blocks
from rkv.codec.fastcheck import FastCheck
from rkv.errors import (
    CorruptRecordError,
    CorruptStoreError,
    IntegrityError,
    MediumError,
    MissingRecordError,
    RecordMismatchError,
    StaleRecordError,
)
from rkv.format.keys import block_key
from rkv.format.model import ModelSpec
from rkv.format.record import DecodedRecord, decode_record
from rkv.store.index import ChunkMeta, Index
from rkv.store.results import CORRECTED, DEGRADED, MISSING, OK, UNCORRECTABLE, BlockLog, BlockStatus
from rkv.tiers import Tier, TierReader
from rkv.tiers.base import Erased, fetch


class Readers:
    """One snapshot per tier, opened on first use and closed with ``stack``: every block of
    a read (or of several, for get_many) comes from the same snapshots."""

    def __init__(self, tiers: dict[str, Tier], stack: ExitStack) -> None:
        self.tiers, self.stack = tiers, stack
        self.open: dict[str, TierReader] = {}

    def __call__(self, tier: str) -> TierReader:
        r = self.open.get(tier)
        if r is None:
            r = self.open[tier] = self.stack.enter_context(self.tiers[tier].reader())
        return r


class ReadPath:
    """Reads for one engine (its index and its tiers, shared by reference)."""

    def __init__(self, index: Index, tiers: dict[str, Tier]) -> None:
        self.index = index
        self.tiers = tiers

    def stored(self, txn: Any, keys: list[bytes]
                ) -> tuple[list[ChunkMeta], CorruptStoreError | None]:
        """Index entries of the stored prefix, and the error of a damaged entry ending it."""
        metas: list[ChunkMeta] = []
        for k in keys:
            try:
                m = self.index.get_chunk(txn, k)
            except CorruptStoreError as exc:
                return metas, exc
            if m is None:
                break
            metas.append(m)
        return metas, None

    def read_chunks(self, keys: list[bytes], metas: list[ChunkMeta], fp: bytes,
                    spec: ModelSpec, out: np.ndarray, strict: bool,
                    readers: Readers | None = None) -> tuple[BlockLog, int]:
        """Read the chunks ``metas`` into ``out`` until one has a bad block; returns every
        block's status (compactly) and the tokens verified. ``strict`` raises the first
        error instead. ``readers``: tier snapshots shared with other reads (get_many)."""
        log = BlockLog()
        done = 0
        with ExitStack() as stack:
            reader = readers or Readers(self.tiers, stack)
            for ci, meta in enumerate(metas):
                n = meta.n_tokens
                bad = self.read_layers(reader, keys[ci], ci, meta, fp, spec,
                                       range(spec.n_layers), out[:, :, done:done + n], log,
                                       strict)
                if bad:
                    break
                done += n
        return log, done

    def read_layers(self, reader: Readers, key: bytes, ci: int, meta: ChunkMeta, fp: bytes,
                    spec: ModelSpec, layers: Iterable[int], dest: np.ndarray, log: BlockLog,
                    strict: bool, check: FastCheck | None = None, whole: bool = True) -> bool:
        """Read ``layers`` of one chunk into ``dest[layer]`` (``[layers, 2, n, ...]``),
        logging each block; True when one was uncorrectable or missing.

        A clean record (current format, no codecs, every prelude and the first header copy
        as expected, its checksum right) takes :class:`FastCheck`; anything else goes, with
        the bytes already read, through :meth:`read_block`: same statuses, same errors.
        ``whole``: the chunk's every layer is read (logged as a chunk; else only the blocks
        that were not plainly ok are logged)."""
        tiers = meta.layer_tiers(spec.n_layers)
        if whole:
            log.chunks.append((ci, tiers))
        check = check or FastCheck(key, fp, spec, meta.n_tokens)
        statuses: list[BlockStatus] = []
        deferred: list[tuple[int, str, int, BlockToRead]] = []
        for layer in layers:
            d = dest[layer]
            got: Any = None
            fetched: tuple[Any, Erased] | None = (None, ())
            tier = tiers[layer]
            if tier in self.tiers:
                try:
                    got = reader(tier).get(block_key(key, layer))
                    fetched = (got, ())
                except MediumError as exc:
                    fetched = None if exc.data is None else (exc.data, exc.ranges)
                except IntegrityError:
                    fetched = None      # read_block reads again and reports it
                if got is not None and check.copy(got, layer, meta.blocks[layer][1], d,
                                                  meta.written_at(layer)):
                    continue
            if fetched is None or fetched[0] is None or tier not in self.tiers:
                statuses.append(self.read_block(reader, key, ci, layer, meta, fp, spec, d,
                                                fetched))
                continue
            # Checked here, decoded below with the chunk's other such blocks on the codec
            # pool (ECC corrections and dequantizing are compute-bound).
            try:
                dec = self.decode(fetched[0], key, layer, fp, spec, meta.n_tokens,
                                  meta.blocks[layer][1], meta.written_at(layer))
            except MissingRecordError as exc:
                statuses.append(BlockStatus(ci, layer, tier, MISSING, 0, exc))
            except IntegrityError as exc:
                statuses.append(BlockStatus(ci, layer, tier, UNCORRECTABLE, 0, exc))
            else:
                deferred.append((layer, tier, dec.header_repairs,
                                 BlockToRead(dec, d, fetched[1])))
        if deferred:
            outcomes = read_blocks([b for *_, b in deferred])
            for (layer, tier, repairs, _), v in zip(deferred, outcomes, strict=True):
                statuses.append(_status(ci, layer, tier, repairs, v))
        bad = False
        for st in sorted(statuses, key=lambda st: st.layer):
            log.special[ci, st.layer] = st
            if st.status in (UNCORRECTABLE, MISSING):
                if strict and not bad:
                    assert st.error is not None
                    raise st.error
                bad = True
        return bad

    def check_block(self, key: bytes, layer: int, meta: ChunkMeta, spec: ModelSpec
                    ) -> BlockStatus:
        """One block through the read path, verified but copied nowhere."""
        with ExitStack() as stack:
            return self.read_block(lambda t: stack.enter_context(self.tiers[t].reader()),
                                   key, meta.pos, layer, meta, meta.fingerprint, spec, None)

    def read_block(self, reader: Callable[[str], TierReader], key: bytes, ci: int, layer: int,
                    meta: ChunkMeta, fp: bytes, spec: ModelSpec, dest: np.ndarray | None,
                    fetched: tuple[Any, Erased] | None = None) -> BlockStatus:
        """One block, fully checked (header vote, identity, checksum, ECC); ``fetched``: the
        record and erasures already read from the tier (a read is never repeated: a
        transient fault would not be there the second time)."""
        tier = meta.blocks[layer][0] if layer < len(meta.blocks) else "?"
        bkey = block_key(key, layer)
        try:
            if layer >= len(meta.blocks):
                raise RecordMismatchError(
                    f"index entry has {len(meta.blocks)} layers, the model {spec.n_layers}"
                )
            if tier not in self.tiers:
                raise MissingRecordError(f"tier {tier} is not configured")
            rec, erased = fetched if fetched is not None else fetch(reader(tier), bkey)
            if rec is not None:
                repairs, corrected, degraded = self.verify_into(
                    rec, key, layer, fp, spec, meta.n_tokens, dest, meta.blocks[layer][1],
                    erased, meta.written_at(layer))
            else:
                # A concurrent writer may have demoted the chunk: look again, once.
                with self.index.env.read() as txn:
                    fresh = self.index.get_chunk(txn, key)
                if fresh is None:
                    return BlockStatus(ci, layer, tier, MISSING, 0,
                                       MissingRecordError("chunk was evicted during the read"))
                tier = fresh.blocks[layer][0]
                with self.tiers[tier].reader() as r:
                    rec, erased = fetch(r, bkey)
                    if rec is None:
                        raise MissingRecordError(f"block {bkey.hex()} is missing from tier "
                                                 f"{tier}")
                    repairs, corrected, degraded = self.verify_into(
                        rec, key, layer, fp, spec, meta.n_tokens, dest,
                        fresh.blocks[layer][1], erased, fresh.written_at(layer))
        except MissingRecordError as exc:
            return BlockStatus(ci, layer, tier, MISSING, 0, exc)
        except IntegrityError as exc:
            return BlockStatus(ci, layer, tier, UNCORRECTABLE, 0, exc)
        return _verified(ci, layer, tier, repairs, corrected, degraded)

    @staticmethod
    def decode(rec: Any, key: bytes, layer: int, fp: bytes, spec: ModelSpec, n_tokens: int,
               size: int = -1, written: int = 0) -> DecodedRecord:
        """A record's header voted and checked against what the read expects.

        ``size`` is the record's length as the index knows it: a longer zero-copy view comes
        from a damaged database page and is not touched at all (its bytes may lie past the end
        of the file); a shorter one is decoded and reported as what it is. ``written``: the
        block's write time in the index (0: unknown); a record stamped earlier is an older
        write of the block (:class:`StaleRecordError`), however well it verifies. A later
        stamp is a rewrite this read's index snapshot predates (a refresh, repair or move
        committing meanwhile, or a newer write of the block on a shared tier): accepted."""
        if size >= 0 and memoryview(rec).nbytes > size:
            raise CorruptRecordError(f"record is {memoryview(rec).nbytes} bytes, the index "
                                     f"says {size}")
        dec = decode_record(rec, expect_key=key, expect_layer=layer, expect_fingerprint=fp)
        h = dec.header
        if written and (h.written_ns or 0) < written:
            raise StaleRecordError(
                f"record was written at {h.written_ns or 'an unknown time'} ns, before the "
                f"write of {written} ns the index holds: a stale copy of the block")
        if h.shape != spec.block_shape(n_tokens) or h.dtype != spec.dtype:
            raise RecordMismatchError(
                f"record holds {h.dtype}{list(h.shape)}, expected "
                f"{spec.dtype}{list(spec.block_shape(n_tokens))}"
            )
        return dec

    @staticmethod
    def verify_into(rec: Any, key: bytes, layer: int, fp: bytes, spec: ModelSpec,
                     n_tokens: int, dest: np.ndarray | None, size: int = -1,
                     erased: tuple[tuple[int, int], ...] = (), written: int = 0
                     ) -> tuple[int, int, int]:
        """Check one record and copy its data into ``dest`` (inside the reader's snapshot).

        ``size`` and ``written``: as in :meth:`decode`. ``erased`` are the byte ranges the
        medium reported unreadable (decoded as erasures). Returns (header copies repaired,
        symbols or bits the ECC corrected, values degraded).
        """
        dec = ReadPath.decode(rec, key, layer, fp, spec, n_tokens, size, written)
        v = read_block(dec, dest, erased)
        return dec.header_repairs, v.corrected, v.degraded


def _status(ci: int, layer: int, tier: str, repairs: int,
            v: Verified | IntegrityError) -> BlockStatus:
    """A block's status from its :func:`read_blocks` outcome, as :meth:`ReadPath.read_block`
    reports it."""
    if isinstance(v, MissingRecordError):
        return BlockStatus(ci, layer, tier, MISSING, 0, v)
    if isinstance(v, IntegrityError):
        return BlockStatus(ci, layer, tier, UNCORRECTABLE, 0, v)
    return _verified(ci, layer, tier, repairs, v.corrected, v.degraded)


def _verified(ci: int, layer: int, tier: str, repairs: int, corrected: int,
              degraded: int) -> BlockStatus:
    """A block that verified: degraded, corrected (ECC or header copies) or ok."""
    if degraded:      # not rewritten: that would make its noise look verified
        return BlockStatus(ci, layer, tier, DEGRADED, corrected, None, repairs)
    if repairs or corrected:
        return BlockStatus(ci, layer, tier, CORRECTED, corrected, None, repairs)
    return BlockStatus(ci, layer, tier, OK)
