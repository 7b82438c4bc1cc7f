"""Record format v2: what a tier stores for one block (v1 records are still read).

Layout (integers little-endian; see docs/format.md for the full byte map)::

    offset     size  field
    0          8     prelude copy 0: magic b"RKVB" | version u8 | flags u8 | L u16
    8          8     prelude copy 1
    16         L     header copy 0: body (L - 8 bytes) | xxh3_64(prelude || body) u64
    16 + L     L     header copy 1
    16 + 2L    pad   zero padding up to the next multiple of 64 (ignored when read)
    A          P     payload (A = 16 + 2L rounded up to 64; P = payload_len)
    A + P      L     header copy 2
    A + P + L  8     prelude copy 2

One prelude and one header copy trail the payload, so that losing a whole sector (or a
poisoned line) at either end of the record still leaves a readable header.

The header body is a fixed binary part (key, fingerprint, layer, dtype, shape, lengths, the
checksum) followed by the codec configs as a JSON array (empty when no codec is used)::

    0    32  chunk key            48   2  layer u16          50  1  dtype code u8
    51    1  ndim u8 (= 4)        52  16  shape, 4 x u32     68  8  data_len u64
    76    8  payload_len u64      84   1  checksum alg u8    85 16  checksum
    101   8  written_ns u64       109  2  codec JSON length C  111  C  codec configs
    (32..47: model fingerprint, 16 bytes; codec configs: a UTF-8 JSON array)

``written_ns`` (version 2) is when the record was written, in ns since the Unix epoch (UTC),
0 when unknown: the age that retention errors grow with, restarted by every rewrite. A v1
body lacks it (the codec length follows the checksum at 101) and reads as unknown (None).

The prelude is recovered by a bitwise majority vote over its three copies, so any error that
hits one copy at each bit position is corrected. A header copy is used only when its own
checksum verifies; if none does, the bitwise majority of the three copies is tried and must
verify too. So a corrupted header is corrected or reported, never misread. The payload is
checked against the end-to-end checksum in the header (xxh3_128 of the block's data before any
ECC, i.e. what the caller gets back).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import xxhash

from rkv.errors import (
    CorruptRecordError,
    InputError,
    RecordMismatchError,
    TruncatedRecordError,
    UnknownFormatError,
)
from rkv.format.dtypes import BY_CODE, DTYPES
from rkv.format.keys import KEY_BYTES
from rkv.format.model import FINGERPRINT_BYTES

MAGIC = b"RKVB"
FORMAT_VERSION = 2
#: Version 3: the v2 header body, its framing copies spread over sectors (below).
SPREAD_VERSION = 3
#: Versions this build reads: 1 (no write time), 2, 3; it writes 2, or 3 where the code
#: asks for spread framing (:func:`copy_offsets`).
READ_VERSIONS = (1, 2, 3)
#: Where the second prelude and header copy of a spread record start: a 4 KiB sector away
#: from the first, so that no sector (whatever the record's alignment) holds two copies.
SPREAD_AT = 4096
PRELUDE_BYTES = 8
PRELUDE_COPIES = 3
HEADER_COPIES = 3
HEADER_CHECK_BYTES = 8
LEAD_COPIES = 2                      # prelude and header copies before the payload
FIXED_BYTES = PRELUDE_BYTES * PRELUDE_COPIES
PAYLOAD_ALIGN = 64
CHECKSUM_ALG = "xxh3_128"
_CHECKSUM_CODES = {1: CHECKSUM_ALG}
_BODY_V1 = struct.Struct("<32s16sHBB4IQQB16sH")
_BODY = struct.Struct("<32s16sHBB4IQQB16sQH")
_BODIES = {1: _BODY_V1, 2: _BODY, 3: _BODY}
#: Where the data checksum sits in a v2 header body.
_CHECKSUM_AT = struct.calcsize("<32s16sHBB4IQQB")
_U64 = 1 << 64


def data_checksum(data: Any) -> bytes:
    """End-to-end checksum of a block's data (xxh3_128, 16 bytes)."""
    return xxhash.xxh3_128_digest(data)


@dataclass(frozen=True, slots=True)
class RecordHeader:
    """Everything a record says about itself."""

    key: bytes                    # 32-byte chunk key
    layer: int
    fingerprint: bytes            # 16-byte model fingerprint
    shape: tuple[int, ...]        # [2, tokens, kv_heads, head_dim]
    dtype: str
    data_len: int                 # bytes of the block's data (what the checksum covers)
    payload_len: int              # bytes stored after the header (data after codecs)
    checksum: bytes = bytes(16)   # data_checksum(data)
    codecs: tuple[dict[str, Any], ...] = field(default_factory=tuple)
    #: When the record was written (ns since the Unix epoch, UTC); None: unknown (a v1
    #: record, or a header that was never stamped; stored as 0).
    written_ns: int | None = None
    #: The framing copies are spread over sectors (format v3, :func:`copy_offsets`): set by
    #: the writer where its code asks for it, and read from the prelude's version.
    spread: bool = False

    def __post_init__(self) -> None:
        if self.written_ns is not None and not (
                type(self.written_ns) is int and 0 < self.written_ns < _U64):
            raise InputError(f"record write time {self.written_ns!r} is not a positive u64 "
                             "(ns since the epoch)")
        if (len(self.key) != KEY_BYTES or len(self.fingerprint) != FINGERPRINT_BYTES
                or len(self.checksum) != 16):
            raise InputError("record key, fingerprint and checksum have fixed sizes")
        if not 0 <= self.layer <= 0xFFFF or self.dtype not in DTYPES:
            raise InputError(f"bad layer {self.layer} or dtype {self.dtype!r}")
        if len(self.shape) != 4 or min(self.shape) < 0 or max(self.shape) > 0xFFFFFFFF:
            raise InputError(f"bad block shape {self.shape}")

    def with_layer(self, layer: int) -> RecordHeader:
        """This header for another layer of the same chunk (a put makes one per block:
        only the layer is new, so it is range-checked alone instead of a full replace())."""
        if not 0 <= layer <= 0xFFFF:
            raise InputError(f"bad layer {layer}")
        obj = object.__new__(RecordHeader)
        for name in _FIELDS:
            _set(obj, name, getattr(self, name))
        _set(obj, "layer", layer)
        return obj

    def to_bytes(self) -> bytes:
        codecs = (json.dumps(list(self.codecs), sort_keys=True, separators=(",", ":")).encode()
                  if self.codecs else b"")
        return _BODY.pack(
            self.key, self.fingerprint, self.layer, DTYPES[self.dtype].code, len(self.shape),
            *self.shape, self.data_len, self.payload_len, 1, self.checksum,
            self.written_ns or 0, len(codecs),
        ) + codecs

    @classmethod
    def from_bytes(cls, raw: bytes, version: int = FORMAT_VERSION) -> RecordHeader:
        """Parse and validate a header body of record format ``version`` (its prelude's);
        anything malformed is a CorruptRecordError."""
        body = _BODIES.get(version)
        if body is None:
            raise UnknownFormatError(f"record format version {version} is not supported")
        if len(raw) < body.size:
            raise CorruptRecordError("record header body is too short")
        fields = body.unpack_from(raw)
        if version == 1:
            fields = (*fields[:-1], 0, fields[-1])
        (key, fp, layer, dtype_id, ndim, s0, s1, s2, s3, data_len, payload_len, alg,
         checksum, written, clen) = fields
        known = BY_CODE.get(dtype_id)
        if known is None:
            raise CorruptRecordError(f"unknown dtype code {dtype_id}")
        dtype = known.name
        if alg not in _CHECKSUM_CODES:
            raise UnknownFormatError(f"unknown checksum algorithm code {alg}")
        if ndim != 4 or s0 != 2:
            raise CorruptRecordError(f"bad block shape {[s0, s1, s2, s3][:ndim]}")
        if len(raw) != body.size + clen:
            raise CorruptRecordError("record header length does not match its codec list")
        codecs: tuple[dict[str, Any], ...] = ()
        if clen:
            try:
                parsed = json.loads(raw[body.size:].decode("utf-8"))
            except ValueError as exc:
                raise CorruptRecordError(f"record codec list is not valid JSON: {exc}") from exc
            if type(parsed) is not list or not parsed or not all(
                    type(c) is dict for c in parsed):
                raise CorruptRecordError("bad codec list in record header")
            codecs = tuple(parsed)
        # Every field was range-checked by the struct layout and above: skip __post_init__
        # (this runs once per block read).
        obj = object.__new__(cls)
        for name, value in (("key", key), ("layer", layer), ("fingerprint", fp),
                            ("shape", (s0, s1, s2, s3)), ("dtype", dtype),
                            ("data_len", data_len), ("payload_len", payload_len),
                            ("checksum", checksum), ("codecs", codecs),
                            ("written_ns", written or None),
                            ("spread", version == SPREAD_VERSION)):
            object.__setattr__(obj, name, value)
        return obj


_FIELDS = tuple(RecordHeader.__dataclass_fields__)
_set = object.__setattr__


def _prelude(header_len: int, version: int = FORMAT_VERSION) -> bytes:
    return MAGIC + bytes([version, 0]) + header_len.to_bytes(2, "little")


def _header_copy(prelude: bytes, body: bytes) -> bytes:
    return body + xxhash.xxh3_64_intdigest(prelude + body).to_bytes(8, "little")


def payload_offset(header_len: int, spread: bool = False) -> int:
    """Where the payload starts: after the leading prelude and header copies, aligned to 64
    bytes so that readers copy and hash it with aligned, vectorized loops."""
    end = (SPREAD_AT + PRELUDE_BYTES + header_len if spread
           else LEAD_COPIES * (PRELUDE_BYTES + header_len))
    return (end + PAYLOAD_ALIGN - 1) // PAYLOAD_ALIGN * PAYLOAD_ALIGN


def copy_offsets(header_len: int, total: int, spread: bool
                 ) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(offsets of the three prelude copies, offsets of the three header copies) in a record
    of ``total`` bytes: the one description of where the framing lies (the decoder, the
    fault models and the tests use it).

    v2 (and v1): both leading preludes, then both leading header copies, at the start; the
    third header copy and prelude at the end. v3 (``spread``): prelude and header copy 0 at
    the start, copy 1 at :data:`SPREAD_AT`, copy 2 at the end; two lost sectors anywhere
    then leave one prelude and one header copy (a sector at the start held all the leading
    copies in v2, so it and the last sector lost together lost the block)."""
    last = total - PRELUDE_BYTES
    if spread:
        return ((0, SPREAD_AT, last),
                (PRELUDE_BYTES, SPREAD_AT + PRELUDE_BYTES, last - header_len))
    lead = LEAD_COPIES * PRELUDE_BYTES
    return (0, PRELUDE_BYTES, last), (lead, lead + header_len, last - header_len)


def _framing(header: RecordHeader) -> tuple[bytes, bytes]:
    """(lead, trail): the bytes before the payload (prelude and header copies, padding) and
    after it (the third header copy, then the third prelude copy); :func:`copy_offsets`."""
    body = header.to_bytes()
    length = len(body) + HEADER_CHECK_BYTES
    if length > 0xFFFF or (header.spread and PRELUDE_BYTES + length > SPREAD_AT):
        raise CorruptRecordError("record header too large")
    pre = _prelude(length, SPREAD_VERSION if header.spread else FORMAT_VERSION)
    copy = _header_copy(pre, body)
    if header.spread:
        first = pre + copy
        lead = first + bytes(SPREAD_AT - len(first)) + first
    else:
        lead = pre * LEAD_COPIES + copy * LEAD_COPIES
    return lead + bytes(payload_offset(length, header.spread) - len(lead)), copy + pre


def encode_record(header: RecordHeader, payload: Any) -> bytearray:
    """Serialize a record. ``payload`` is any bytes-like object of ``header.payload_len``."""
    view = memoryview(payload).cast("B")
    if view.nbytes != header.payload_len:
        raise ValueError(f"payload is {view.nbytes} bytes, header says {header.payload_len}")
    lead, trail = _framing(header)
    return bytearray(lead) + view + trail


def encode_split_record(header: RecordHeader, data: np.ndarray, tail: bytes,
                        alloc: Callable[[int], np.ndarray] | None = None) -> np.ndarray:
    """Serialize a record whose payload is ``data`` (uint8) followed by ``tail``: the same
    bytes as ``encode_record(header, data || tail)`` with one copy of the data, a numpy copy
    that runs without the GIL (so threads encode blocks side by side). Returns a uint8
    array, placed in ``alloc(size)`` when given."""
    n = data.nbytes
    if n + len(tail) != header.payload_len:
        raise ValueError(f"payload is {n + len(tail)} bytes, header says {header.payload_len}")
    lead, trail = _framing(header)
    out = (alloc or _new_buffer)(len(lead) + n + len(tail) + len(trail))
    a = len(lead)
    out[:a] = np.frombuffer(lead, dtype=np.uint8)
    out[a:a + n] = data
    out[a + n:a + n + len(tail)] = np.frombuffer(tail, dtype=np.uint8)
    out[a + n + len(tail):] = np.frombuffer(trail, dtype=np.uint8)
    return out


def framing_sizes(header: RecordHeader) -> tuple[int, int]:
    """(payload offset, length of one header copy) of a record with ``header``: the copies
    where :func:`copy_offsets` puts them, the payload at the offset, the third header copy
    right after the payload and the third prelude in the last 8 bytes."""
    lead, trail = _framing(header)
    return len(lead), len(trail) - PRELUDE_BYTES


def array_record_size(header: RecordHeader, nbytes: int) -> int:
    """Size of the record :func:`encode_array_record` makes for ``nbytes`` of data."""
    lead, trail = _framing(replace(header, data_len=nbytes, payload_len=nbytes))
    return len(lead) + nbytes + len(trail)


def encode_array_record(header: RecordHeader, data: np.ndarray,
                        alloc: Callable[[int], np.ndarray] | None = None,
                        layer: int | None = None) -> np.ndarray:
    """Serialize a record whose payload is the raw bytes of ``data`` (no codecs); ``layer``
    overrides the header's (one header serves every layer of a chunk).

    Returns the record as a uint8 array (any bytes-like consumer takes it), placed in
    ``alloc(size)`` when given (a reused buffer) or in a new array. ``data`` (which may be
    strided) is copied once, straight into the record, checksummed there, and ``checksum``,
    ``data_len`` and ``payload_len`` are filled in.
    """
    nbytes = data.nbytes
    # The header body is packed once with a zero checksum that is patched in after the data
    # is hashed (same bytes as replace() + to_bytes(), without two dataclass copies per block).
    codecs = (json.dumps(list(header.codecs), sort_keys=True, separators=(",", ":")).encode()
              if header.codecs else b"")
    body = bytearray(_BODY.pack(
        header.key, header.fingerprint, header.layer if layer is None else layer,
        DTYPES[header.dtype].code,
        len(header.shape), *header.shape, nbytes, nbytes, 1, bytes(16),
        header.written_ns or 0, len(codecs)) + codecs)
    hlen = len(body) + HEADER_CHECK_BYTES
    if hlen > 0xFFFF:
        raise CorruptRecordError("record header too large")
    start = payload_offset(hlen)
    out = (alloc or _new_buffer)(start + nbytes + hlen + PRELUDE_BYTES)
    mv = out.data      # byte slices of a memoryview: no numpy call per piece
    if data.flags.c_contiguous:    # (viewed as bytes: bfloat16 has no buffer format)
        mv[start:start + nbytes] = data.reshape(-1).view(np.uint8).data
    else:
        out[start:start + nbytes].reshape((*data.shape, data.itemsize))[...] = data.view(
            np.uint8).reshape((*data.shape, data.itemsize))
    body[_CHECKSUM_AT:_CHECKSUM_AT + 16] = data_checksum(mv[start:start + nbytes])
    pre = _prelude(hlen)
    copy = _header_copy(pre, bytes(body))
    lead = pre * LEAD_COPIES + copy * LEAD_COPIES
    mv[:start] = lead + bytes(start - len(lead))
    mv[start + nbytes:] = copy + pre
    return out


def _new_buffer(n: int) -> np.ndarray:
    return np.empty(n, dtype=np.uint8)


@dataclass(frozen=True, slots=True)
class DecodedRecord:
    header: RecordHeader
    payload: memoryview           # view into the buffer passed to decode_record
    header_repairs: int           # prelude/header copies that had to be outvoted or skipped
    header_bytes: int             # offset of the payload (prelude, header copies, padding)


def _majority(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    return (a & b) | (a & c) | (b & c)  # type: ignore[no-any-return]


def _unsupported(pre: bytes) -> str | None:
    """Why a prelude with the magic names a format this build does not read (None: it
    reads it)."""
    if pre[4] not in READ_VERSIONS:
        return f"record format version {pre[4]} is not supported"
    return f"record flags {pre[5]:#x} are not supported" if pre[5] else None


def _find_header(view: memoryview, pre: bytes, total: int
                 ) -> tuple[bytes, int, bytes, int] | None:
    """Locate a verified header body for prelude ``pre``: (pre, L, body, repairs) or None."""
    hlen = int.from_bytes(pre[6:8], "little")
    if hlen <= HEADER_CHECK_BYTES:
        return None
    spread = pre[4] == SPREAD_VERSION
    start = payload_offset(hlen, spread)
    if total < start + hlen + PRELUDE_BYTES:
        raise TruncatedRecordError(f"record is {total} bytes, too short for its header")
    # Copies lead and trail the payload (spread: a sector apart): a lost sector at either end
    # of the record leaves at least one copy readable.
    offsets = copy_offsets(hlen, total, spread)[1]
    for i, off in enumerate(offsets):
        candidate = bytes(view[off:off + hlen - HEADER_CHECK_BYTES])
        stored = int.from_bytes(view[off + hlen - HEADER_CHECK_BYTES:off + hlen], "little")
        if xxhash.xxh3_64_intdigest(pre + candidate) == stored:
            return pre, hlen, candidate, i
    merged = _majority(*(np.frombuffer(view[o:o + hlen], dtype=np.uint8)
                         for o in offsets)).tobytes()
    body = merged[:-HEADER_CHECK_BYTES]
    if xxhash.xxh3_64_intdigest(pre + body) != int.from_bytes(merged[-HEADER_CHECK_BYTES:],
                                                              "little"):
        return None
    return pre, hlen, body, HEADER_COPIES


def decode_record(
    buf: Any,
    *,
    expect_key: bytes | None = None,
    expect_layer: int | None = None,
    expect_fingerprint: bytes | None = None,
) -> DecodedRecord:
    """Parse and check a record's framing and header (not its payload checksum).

    Raises :class:`TruncatedRecordError`, :class:`UnknownFormatError`,
    :class:`CorruptRecordError` or :class:`RecordMismatchError`.
    """
    view = memoryview(buf).cast("B")
    total = view.nbytes
    if total < FIXED_BYTES:
        raise TruncatedRecordError(f"record is {total} bytes, shorter than its preludes")
    # v2's second prelude copy follows the first; v3's lies a sector on (copy_offsets).
    p0, p1, ps, p2 = (bytes(view[o:o + PRELUDE_BYTES]) for o in (
        0, PRELUDE_BYTES, SPREAD_AT if total >= SPREAD_AT + 2 * PRELUDE_BYTES else PRELUDE_BYTES,
        total - PRELUDE_BYTES))
    if p0[:4] == MAGIC and p0 == p2 and p0 in (p1, ps):
        candidates = [p0]
    else:
        # Each layout's vote first, kept only when it names its own layout: the other
        # layout's vote mixes in payload or header bytes, and a prelude it happened to get
        # right would make the outcome depend on the data (the fault model could not say
        # it). Then each copy alone, for when two copies were lost together (a lost
        # sector). A header copy verifies its prelude too, so a wrong guess fails.
        arrs = [np.frombuffer(p, dtype=np.uint8) for p in (p0, p1, ps, p2)]
        v2 = _majority(arrs[0], arrs[1], arrs[3]).tobytes()
        v3 = _majority(arrs[0], arrs[2], arrs[3]).tobytes()
        votes = [v for v, own in ((v2, v2[4] != SPREAD_VERSION),
                                  (v3, v3[4] == SPREAD_VERSION)) if own]
        candidates = list(dict.fromkeys([*votes, p0, p1, ps, p2]))
    # Every candidate is tried before giving up: a bit flipped alike in two copies (a DRAM
    # lane hitting copies 0 and 1, 8 bytes apart) outvotes the third in the vote, and only
    # that intact copy still verifies a header. A candidate's unknown version or flags, or a
    # header length that does not fit, rules out that candidate, not the record.
    found = None
    magic_seen = False
    unknown: str | None = None
    short: TruncatedRecordError | None = None
    for pre in candidates:
        if pre[:4] != MAGIC:
            continue
        magic_seen = True
        if _unsupported(pre):
            unknown = unknown or _unsupported(pre)
            continue
        try:
            found = _find_header(view, pre, total)
        except TruncatedRecordError as exc:
            short = short or exc
            continue
        if found is not None:
            break
    if found is None:
        if short is not None:
            raise short
        if unknown is not None:
            raise UnknownFormatError(unknown)
        if not magic_seen:
            raise CorruptRecordError("not an rkv record (bad magic)")
        raise CorruptRecordError("record header is corrupt in all copies")
    pre, hlen, body, repairs = found
    spread = pre[4] == SPREAD_VERSION
    repairs += sum(view[o:o + PRELUDE_BYTES] != pre
                   for o in copy_offsets(hlen, total, spread)[0])
    start = payload_offset(hlen, spread)
    header = RecordHeader.from_bytes(body, pre[4])
    if total != start + header.payload_len + hlen + PRELUDE_BYTES:
        raise TruncatedRecordError(
            f"record is {total} bytes, header says "
            f"{start + header.payload_len + hlen + PRELUDE_BYTES}"
        )
    if expect_key is not None and header.key != expect_key:
        raise RecordMismatchError("record was written under another chunk key")
    if expect_layer is not None and header.layer != expect_layer:
        raise RecordMismatchError(
            f"record holds layer {header.layer}, expected layer {expect_layer}"
        )
    if expect_fingerprint is not None and header.fingerprint != expect_fingerprint:
        raise RecordMismatchError("record was written for another model fingerprint")
    return DecodedRecord(header, view[start:start + header.payload_len], repairs, start)



def peek_header(prefix: Any) -> tuple[RecordHeader, int]:
    """The header of a record from its first bytes (the two leading preludes and a leading
    header copy that verifies against one) and the record's whole length. For probing a
    remote record's identity without reading it; a read decodes and verifies it all."""
    view = memoryview(prefix).cast("B")
    if view.nbytes < 2 * PRELUDE_BYTES:
        raise TruncatedRecordError("record is shorter than its preludes")
    p0, p1 = bytes(view[:PRELUDE_BYTES]), bytes(view[PRELUDE_BYTES:2 * PRELUDE_BYTES])
    ps = bytes(view[SPREAD_AT:SPREAD_AT + PRELUDE_BYTES])     # v3's second copy, if read
    unknown = None
    for pre in dict.fromkeys((p0, p1, ps)):
        if pre[:4] != MAGIC:
            continue
        if _unsupported(pre):               # this copy only: try the others
            unknown = unknown or _unsupported(pre)
            continue
        hlen = int.from_bytes(pre[6:8], "little")
        if hlen <= HEADER_CHECK_BYTES:
            continue
        spread = pre[4] == SPREAD_VERSION
        for start in copy_offsets(hlen, 1 << 62, spread)[1][:2]:    # the leading copies
            copy = bytes(view[start:start + hlen])
            if len(copy) == hlen and _header_copy(pre, copy[:-HEADER_CHECK_BYTES]) == copy:
                header = RecordHeader.from_bytes(copy[:-HEADER_CHECK_BYTES], pre[4])
                return header, (payload_offset(hlen, spread) + header.payload_len + hlen
                                + PRELUDE_BYTES)
    if unknown is not None:
        raise UnknownFormatError(unknown)
    raise CorruptRecordError("no verified record header in the record's first bytes")
