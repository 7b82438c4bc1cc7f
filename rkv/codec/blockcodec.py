"""How a block's data becomes a record payload and back: the per-block codec stage.

A block without codecs stores its raw bytes (``codecs`` empty in the header). A block with an
error-correcting code stores ``codec.encode(data)`` and lists the codec's config in its header,
so any reader can decode it whatever the tier's current configuration says.

Reading checks the end-to-end checksum first, on the data read straight out of the payload
(systematic codes need no decoding for that), and runs the decoder only when it fails; the
decoded data must then match the checksum too, so a miscorrection beyond the code's capability
is reported as an error, never returned.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import numpy as np

from rkv.buffers import as_u8
from rkv.codec.stages import block_codec, header_stages
from rkv.errors import (
    ChecksumError,
    CorruptRecordError,
    IntegrityError,
    UncorrectableError,
    UnknownFormatError,
)
from rkv.format.record import (
    DecodedRecord,
    RecordHeader,
    data_checksum,
    encode_array_record,
    encode_record,
    encode_split_record,
)
from rkv.parallel import pmap, pmap_strict

if TYPE_CHECKING:
    from rkv.ecc.base import Codec
    from rkv.quant import Quantizer

def _configs(quant: Quantizer | None, codec: Codec | None) -> tuple[dict[str, Any], ...]:
    return tuple(s.get_config() for s in (quant, codec) if s is not None)


def encode_block(header: RecordHeader, data: np.ndarray, codec: Codec | None,
                 alloc: Callable[[int], np.ndarray] | None = None,
                 quant: Quantizer | None = None) -> Any:
    """The record of one block: values quantized (``quant``) or as they are, then protected
    by ``codec`` or stored raw. The checksum covers the bytes before the ECC."""
    if codec is None and quant is None:
        return encode_array_record(header, data, alloc)
    if codec is not None and codec.by_value:
        # An unbound layout (byte planes) fits the block first, as Pipeline.for_block does.
        codec = block_codec(codec, quant, tuple(header.shape), header.dtype)
    if quant is not None:
        raw = np.frombuffer(quant.encode(np.ascontiguousarray(data)), dtype=np.uint8)
    else:
        raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
    tail = b"" if codec is None else codec.encode_tail(as_u8(raw))
    if tail is None:          # not a data || tail layout (byte planes)
        return _encode_data(header, raw, quant, codec)
    # The data is copied once, by numpy into the record (without the GIL).
    final = replace(header, data_len=raw.nbytes, payload_len=raw.nbytes + len(tail),
                    checksum=data_checksum(raw), codecs=_configs(quant, codec),
                    spread=codec is not None and codec.spread_framing(raw.nbytes))
    return encode_split_record(final, raw, tail, alloc)


def _encode_data(header: RecordHeader, raw: np.ndarray, quant: Quantizer | None,
                 codec: Codec | None) -> Any:
    payload: Any = codec.encode(raw) if codec is not None else raw
    final = replace(header, data_len=raw.nbytes, payload_len=memoryview(payload).nbytes,
                    checksum=data_checksum(raw), codecs=_configs(quant, codec),
                    spread=codec is not None and codec.spread_framing(raw.nbytes))
    return encode_record(final, payload)


def payload_erasures(dec: DecodedRecord, erased: Sequence[tuple[int, int]]) -> np.ndarray:
    """Byte offsets into the payload of the record ranges ``erased`` (the medium's report)."""
    start, end = dec.header_bytes, dec.header_bytes + dec.header.payload_len
    parts = [np.arange(max(s, start), min(s + n, end), dtype=np.int64) - start
             for s, n in erased if s < end and s + n > start]
    return np.unique(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)


class Verified(NamedTuple):
    """A block's data after the read checks."""

    data: Any
    corrected: int             # symbols (RS) or bits (BCH) the ECC corrected
    degraded: int = 0          # values returned with an unverified tolerant low part


def _fast_data(dec: DecodedRecord, codec: Codec, eras: np.ndarray | None) -> Verified | None:
    """The data straight out of the payload when it matches the checksum (no decoding),
    else None. Erasures that spare the data (parity, padding) do not stop it; they count as
    repaired bytes so that the record is rewritten."""
    h = dec.header
    lost = 0 if eras is None else int(eras.size)
    if lost and eras[0] < h.data_len:  # type: ignore[index]
        return None
    # Some layouts (shardrs) pad, so data_size(len) is an upper bound: compare the data's
    # actual length with the header's.
    fast = codec.systematic_data(dec.payload)
    if fast is not None and fast.size == h.data_len and data_checksum(fast) == h.checksum:
        return Verified(fast, lost)
    return None


def _verified_data(dec: DecodedRecord, codec: Codec | None,
                   erased: Sequence[tuple[int, int]] = ()) -> Verified:
    """The block's data bytes (before any ECC), verified, and the symbols corrected.

    ``erased``: record byte ranges the medium reported unreadable. Their payload bytes go to
    the decoder as erasures (an RS codeword rebuilds twice as many erased as unknown bytes);
    a block with erasures always reads back as corrected, so it gets rewritten. A layout with
    a tolerant part (byte planes) whose strict decoding fails may come back ``degraded``:
    the strictly verified part exact, the tolerant part as read.
    """
    h = dec.header
    eras = payload_erasures(dec, erased) if erased else None
    if codec is None:
        if h.data_len != h.payload_len:
            raise CorruptRecordError("record lengths are inconsistent")
        if data_checksum(dec.payload) != h.checksum:
            if eras is not None and eras.size:
                raise UncorrectableError(f"the medium lost {eras.size} byte(s) of a block "
                                         "stored without ECC")
            raise ChecksumError("block data does not match its end-to-end checksum")
        return Verified(dec.payload, 0)
    lost = 0 if eras is None else int(eras.size)
    fast = _fast_data(dec, codec, eras)
    if fast is not None:
        return fast
    res = codec.decode(dec.payload, eras)
    if not res.ok:
        deg = codec.decode_degraded(dec.payload, eras)
        if deg is not None and len(deg.data) == h.data_len:
            return Verified(deg.data, deg.n_corrected, max(1, deg.values))
        raise UncorrectableError(f"{codec.spec}: {res.detail or 'uncorrectable'}")
    if len(res.data) != h.data_len or data_checksum(res.data) != h.checksum:
        raise ChecksumError(
            f"{codec.spec} decoded to data that fails the end-to-end checksum "
            "(errors beyond the code's capability)"
        )
    return Verified(res.data, max(res.n_corrected, 1 if lost else 0))


def read_block(dec: DecodedRecord, dest: np.ndarray | None,
               erased: Sequence[tuple[int, int]] = ()) -> Verified:
    """Verify a decoded record's data and write the block's values into ``dest`` (when
    given): verified before anything is copied, dequantized if it was quantized.
    ``erased``: record byte ranges the medium reported unreadable (decoded as erasures).

    Returns the check's outcome (symbols or bits corrected; values degraded). Raises
    :class:`ChecksumError`, :class:`UncorrectableError` or another IntegrityError.
    """
    quant, codec = header_stages(dec.header)
    v = _verified_data(dec, codec, erased)
    _copy_out(dec, quant, v, dest)
    return v


def _copy_out(dec: DecodedRecord, quant: Quantizer | None, v: Verified,
              dest: np.ndarray | None) -> None:
    if dest is not None:
        if quant is None:
            dest[...] = np.frombuffer(v.data, dtype=dest.dtype).reshape(dest.shape)
        else:
            dest[...] = quant.decode(v.data, dec.header.shape, dec.header.dtype)


def reencode(record: Any, dec: DecodedRecord, codec: Codec | None,
             erased: Sequence[tuple[int, int]] = (), written_ns: int | None = None) -> Any:
    """The block re-encoded with ``codec`` (its quantization kept), from verified, corrected
    data: used to move a block to a tier with another ECC and to repair it in place.
    ``erased``: record ranges the medium reported unreadable (the record is always
    rewritten then). A degraded block is returned as it is: re-encoding would make its
    unverified part look verified. ``written_ns``: the time of this rewrite, stamped in
    the header (a block written anew starts aging anew; its payload is kept byte for byte
    when nothing else changes). None keeps the record's own time. Raises IntegrityError
    when the block cannot be verified."""
    quant, old = header_stages(dec.header)
    if codec is not None:
        # A layout by value fits the block first (a quantized block moving to a tier laid
        # out in byte planes gets their codes over its metadata and its packed codes), so
        # that a record already coded that way compares equal and is kept.
        codec = block_codec(codec, quant, tuple(dec.header.shape), dec.header.dtype)
    data, corrected, degraded = _verified_data(dec, old, erased)
    stamp = dec.header.written_ns if written_ns is None else written_ns
    if degraded or (old == codec and not corrected and not dec.header_repairs and not erased):
        return record if stamp == dec.header.written_ns else restamp(dec, stamp)
    raw = np.frombuffer(bytes(data), dtype=np.uint8)
    return _encode_data(replace(dec.header, checksum=bytes(16), written_ns=stamp), raw, quant,
                        codec)


# -- many blocks on the codec pool ------------------------------------------------------------
class Stages(Protocol):
    """What a block is encoded with: a quantizer then a code, either absent (``None``);
    :class:`rkv.codec.pipeline.Pipeline` is the one implementation."""

    @property
    def quant(self) -> Quantizer | None: ...

    @property
    def codec(self) -> Codec | None: ...


class BlockToEncode(NamedTuple):
    """One block for :func:`encode_blocks`: its header, values and pipeline."""

    header: RecordHeader
    data: np.ndarray
    pipe: Stages


class RecordArena:
    """A reusable buffer that one batch's records are carved from (thread-safe bump
    allocation), for :func:`encode_blocks`.

    Fresh memory costs a page fault per 4 KiB on first touch (about 85 us for a 192 KiB
    record here, most of an RS encode) and page faults serialize threads on the kernel's
    memory map lock; reused memory costs neither. Every :meth:`start` reuses the buffer, so
    a batch's records are valid until the next batch starts: write them (LMDB copies them)
    first. A batch that outgrows the buffer gets more memory, and the next one a buffer
    that fits it whole.
    """

    def __init__(self) -> None:
        self._buf = np.empty(0, dtype=np.uint8)
        self._off = 0
        self._spill = 0
        self._lock = threading.Lock()

    def start(self) -> None:
        """A new batch: everything carved so far may be overwritten."""
        with self._lock:
            if self._spill:
                self._buf = np.empty(self._off + self._spill, dtype=np.uint8)
            self._off = self._spill = 0

    def __call__(self, n: int) -> np.ndarray:
        with self._lock:
            off = self._off
            if off + n <= self._buf.size:
                self._off = off + n
                return self._buf[off:off + n]
            self._spill += n
        return np.empty(n, dtype=np.uint8)


def compute_bound(codec: Codec | None, quant: Quantizer | None = None) -> bool:
    """Whether a block's codec work is compute-bound, so that threads pay on any machine:
    a quantizer or a table-driven code (RS, BCH). Raw and checksummed blocks (a hash and a
    copy) and SIMD parity run at memory speed: measured here, two threads did them slower
    than one (benchmarks/bench_threads.py)."""
    return quant is not None or (codec is not None and codec.compute_bound)


def encode_blocks(blocks: Sequence[BlockToEncode], arena: RecordArena | None = None, *,
                  threads: bool | None = None) -> list[Any]:
    """The records of ``blocks``, encoded on the codec thread pool (:mod:`rkv.parallel`):
    byte for byte what :func:`encode_block` gives one at a time. With ``arena`` the records
    are carved from it (valid until its next batch: write them first), else each gets new
    memory. ``threads``: None (default) uses the pool when some block is
    :func:`compute_bound`; True always; False never. A batch too small to pay for threads
    is encoded inline. Raises what the first failing block would raise."""
    if threads is None:
        threads = any(compute_bound(b.pipe.codec, b.pipe.quant) for b in blocks)
    if arena is not None:
        arena.start()
    one = partial(_encode_one, arena)
    if not threads:
        return [one(b) for b in blocks]
    return pmap_strict(one, blocks, nbytes=sum(b.data.nbytes for b in blocks))


def _encode_one(arena: RecordArena | None, b: BlockToEncode) -> Any:
    return encode_block(b.header, b.data, b.pipe.codec, arena, b.pipe.quant)


class BlockToRead(NamedTuple):
    """One block for :func:`read_blocks`: the arguments of :func:`read_block`."""

    dec: DecodedRecord
    dest: np.ndarray | None
    erased: Sequence[tuple[int, int]] = ()


def read_blocks(blocks: Sequence[BlockToRead], *, threads: bool | None = None
                ) -> list[Verified | IntegrityError]:
    """:func:`read_block` of every block on the codec thread pool, in order: per block its
    :class:`Verified` outcome or the IntegrityError the serial call raises (checksum,
    uncorrectable, ...); the same statuses and counts as one at a time. Every block is
    tried; any other exception (a bug, not damage) is raised.

    Two passes: first, on the calling thread, every block that needs no computing (raw,
    or its data matching the checksum as stored: a hash and a copy, at memory speed, where
    threads only queue for the GIL and the memory); then the rest (decoding, dequantizing)
    on the pool. ``threads``: None (default) uses the pool when some of those has a
    :func:`compute_bound` code or quantizer; True always; False never."""
    out: list[Any] = [None] * len(blocks)
    rest: list[int] = []
    for i, b in enumerate(blocks):
        v: Verified | IntegrityError | None
        try:
            v = _read_fast(b)
        except IntegrityError as exc:
            v = exc
        if v is None:
            rest.append(i)
        else:
            out[i] = v
    todo = [blocks[i] for i in rest]
    if threads is None:
        threads = any(_stages_compute_bound(b.dec.header) for b in todo)
    nbytes = sum(b.dec.header.payload_len for b in todo)
    for i, r in zip(rest, pmap(_read_one, todo, nbytes=nbytes, capture=True,
                               inline=not threads), strict=True):
        if isinstance(r, BaseException) and not isinstance(r, IntegrityError):
            raise r
        out[i] = r
    return out


def _read_fast(b: BlockToRead) -> Verified | None:
    """:func:`read_block` when the block needs no decoding and no dequantizing, else None."""
    quant, codec = header_stages(b.dec.header)
    if codec is None:
        return read_block(b.dec, b.dest, b.erased) if quant is None else None
    v = _fast_data(b.dec, codec, payload_erasures(b.dec, b.erased) if b.erased else None)
    if v is None or quant is not None:
        return None
    _copy_out(b.dec, quant, v, b.dest)
    return v


def _stages_compute_bound(header: RecordHeader) -> bool:
    try:
        quant, codec = header_stages(header)
    except UnknownFormatError:
        return False            # read_block reports it
    return compute_bound(codec, quant)


def _read_one(b: BlockToRead) -> Verified:
    return read_block(b.dec, b.dest, b.erased)


def restamp(dec: DecodedRecord, written_ns: int | None) -> Any:
    """The record with its header saying ``written_ns`` and its payload exactly as it was
    (checksum and codecs unchanged, so a damaged payload stays detectably damaged)."""
    return encode_record(replace(dec.header, written_ns=written_ns), dec.payload)
