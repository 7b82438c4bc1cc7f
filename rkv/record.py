"""Record format v1: what a tier stores for one block.

Layout (integers little-endian; see docs/format.md for the full byte map)::

    offset     size  field
    0          8     prelude copy 0: magic b"RKVB" | version u8 | flags u8 | L u16
    8          8     prelude copy 1
    16         8     prelude copy 2
    24         L     header copy 0: JSON body (L - 8 bytes) | xxh3_64(prelude || body) u64
    24 + L     L     header copy 1
    24 + 2L    L     header copy 2
    24 + 3L    P     payload (P = header["payload_len"])

The prelude is recovered by a bitwise majority vote over its three copies, so any error that
hits one copy at each bit position is corrected. A header copy is used only when its own
checksum verifies; if none does, the bytewise majority of the three copies is tried and must
verify too. So a corrupted header is corrected or reported, never misread. The payload is
checked against the end-to-end checksum in the header (xxh3_128 of the block's data before any
ECC, i.e. what the caller gets back).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xxhash

from rkv.errors import (
    CorruptRecordError,
    RecordMismatchError,
    TruncatedRecordError,
    UnknownFormatError,
)
from rkv.keys import KEY_BYTES
from rkv.model import FINGERPRINT_BYTES, KV_DTYPES

MAGIC = b"RKVB"
FORMAT_VERSION = 1
PRELUDE_BYTES = 8
PRELUDE_COPIES = 3
HEADER_COPIES = 3
HEADER_CHECK_BYTES = 8
FIXED_BYTES = PRELUDE_BYTES * PRELUDE_COPIES
CHECKSUM_ALG = "xxh3_128"
_CHECKSUM_HEX = 32
_HEX = re.compile(r"[0-9a-f]*")
_HEADER_KEYS = {
    "key", "layer", "fp", "shape", "dtype", "codecs", "data_len", "payload_len", "checksum",
}


def data_checksum(data: Any) -> bytes:
    """End-to-end checksum of a block's data (xxh3_128, 16 bytes)."""
    return xxhash.xxh3_128_digest(data)


@dataclass(frozen=True)
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

    def to_json(self) -> bytes:
        body = {
            "key": self.key.hex(),
            "layer": self.layer,
            "fp": self.fingerprint.hex(),
            "shape": list(self.shape),
            "dtype": self.dtype,
            "codecs": list(self.codecs),
            "data_len": self.data_len,
            "payload_len": self.payload_len,
            "checksum": f"{CHECKSUM_ALG}:{self.checksum.hex()}",
        }
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> RecordHeader:
        try:
            body = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CorruptRecordError(f"record header is not valid JSON: {exc}") from exc
        if not isinstance(body, dict) or set(body) != _HEADER_KEYS:
            raise CorruptRecordError("record header has missing or unknown fields")
        try:
            key = _hex_field(body["key"], KEY_BYTES, "key")
            fp = _hex_field(body["fp"], FINGERPRINT_BYTES, "fp")
            alg, _, digest = str(body["checksum"]).partition(":")
            if alg != CHECKSUM_ALG:
                raise UnknownFormatError(f"unknown checksum algorithm {alg!r}")
            checksum = _hex_field(digest, 16, "checksum")
            shape = body["shape"]
            if (not isinstance(shape, list) or len(shape) != 4 or shape[0] != 2
                    or not all(_is_count(s) for s in shape)):
                raise CorruptRecordError(f"bad block shape {shape!r}")
            if body["dtype"] not in KV_DTYPES:
                raise CorruptRecordError(f"bad dtype {body['dtype']!r}")
            for name in ("layer", "data_len", "payload_len"):
                if not _is_count(body[name]):
                    raise CorruptRecordError(f"bad {name} {body[name]!r}")
            codecs = body["codecs"]
            if not isinstance(codecs, list) or not all(isinstance(c, dict) for c in codecs):
                raise CorruptRecordError("bad codec list")
        except (TypeError, ValueError) as exc:  # pragma: no cover - defensive
            raise CorruptRecordError(f"bad record header: {exc}") from exc
        return cls(
            key=key, layer=body["layer"], fingerprint=fp, shape=tuple(shape),
            dtype=body["dtype"], data_len=body["data_len"], payload_len=body["payload_len"],
            checksum=checksum, codecs=tuple(codecs),
        )


def _is_count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 48


def _hex_field(v: Any, nbytes: int, name: str) -> bytes:
    if not isinstance(v, str) or len(v) != 2 * nbytes or not _HEX.fullmatch(v):
        raise CorruptRecordError(f"bad {name} field in record header")
    return bytes.fromhex(v)


def _prelude(header_len: int) -> bytes:
    return MAGIC + bytes([FORMAT_VERSION, 0]) + header_len.to_bytes(2, "little")


def _header_copy(prelude: bytes, body: bytes) -> bytes:
    return body + xxhash.xxh3_64_digest(prelude + body)[::-1]  # stored little-endian


def _header_bytes(header: RecordHeader) -> bytes:
    body = header.to_json()
    length = len(body) + HEADER_CHECK_BYTES
    if length > 0xFFFF:
        raise CorruptRecordError("record header too large")
    pre = _prelude(length)
    return pre * PRELUDE_COPIES + _header_copy(pre, body) * HEADER_COPIES


def encode_record(header: RecordHeader, payload: Any) -> bytearray:
    """Serialize a record. ``payload`` is any bytes-like object of ``header.payload_len``."""
    view = memoryview(payload).cast("B")
    if view.nbytes != header.payload_len:
        raise ValueError(f"payload is {view.nbytes} bytes, header says {header.payload_len}")
    head = _header_bytes(header)
    out = bytearray(len(head) + view.nbytes)
    out[: len(head)] = head
    out[len(head):] = view
    return out


def encode_array_record(header: RecordHeader, data: np.ndarray) -> bytearray:
    """Serialize a record whose payload is the raw bytes of ``data`` (no codecs).

    Copies ``data`` (which may be strided) once, straight into the record, checksums it there
    and fills in ``checksum``, ``data_len`` and ``payload_len``.
    """
    nbytes = data.nbytes
    placeholder = RecordHeader(
        key=header.key, layer=header.layer, fingerprint=header.fingerprint,
        shape=header.shape, dtype=header.dtype, data_len=nbytes, payload_len=nbytes,
        codecs=header.codecs,
    )
    head_len = len(_header_bytes(placeholder))  # checksum is fixed-width hex
    out = bytearray(head_len + nbytes)
    dest = np.frombuffer(out, dtype=np.uint8, offset=head_len)
    dest.reshape(data.shape + (data.itemsize,))[...] = data.view(np.uint8).reshape(
        data.shape + (data.itemsize,)
    )
    final = RecordHeader(
        key=header.key, layer=header.layer, fingerprint=header.fingerprint,
        shape=header.shape, dtype=header.dtype, data_len=nbytes, payload_len=nbytes,
        checksum=data_checksum(dest), codecs=header.codecs,
    )
    head = _header_bytes(final)
    assert len(head) == head_len
    out[:head_len] = head
    return out


@dataclass(frozen=True)
class DecodedRecord:
    header: RecordHeader
    payload: memoryview           # view into the buffer passed to decode_record
    header_repairs: int           # prelude/header copies that had to be outvoted or skipped
    header_bytes: int             # offset of the payload


def _majority(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    return (a & b) | (a & c) | (b & c)  # type: ignore[no-any-return]


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
        raise TruncatedRecordError(f"record is {total} bytes, shorter than its prelude")
    arr = np.frombuffer(view, dtype=np.uint8)
    copies = arr[:FIXED_BYTES].reshape(PRELUDE_COPIES, PRELUDE_BYTES)
    voted = _majority(copies[0], copies[1], copies[2])
    repairs = int(np.count_nonzero((copies != voted).any(axis=1)))
    pre = voted.tobytes()
    if pre[:4] != MAGIC:
        raise CorruptRecordError("not an rkv record (bad magic)")
    if pre[4] != FORMAT_VERSION:
        raise UnknownFormatError(f"record format version {pre[4]} is not supported")
    if pre[5] != 0:
        raise UnknownFormatError(f"record flags {pre[5]:#x} are not supported")
    hlen = int.from_bytes(pre[6:8], "little")
    if hlen <= HEADER_CHECK_BYTES:
        raise CorruptRecordError(f"bad header length {hlen}")
    head_end = FIXED_BYTES + HEADER_COPIES * hlen
    if total < head_end:
        raise TruncatedRecordError(f"record is {total} bytes, its header ends at {head_end}")
    hcopies = arr[FIXED_BYTES:head_end].reshape(HEADER_COPIES, hlen)
    body = None
    for i in range(HEADER_COPIES):
        if _header_ok(pre, hcopies[i]):
            body = hcopies[i, :-HEADER_CHECK_BYTES].tobytes()
            repairs += i
            break
    if body is None:
        merged = _majority(hcopies[0], hcopies[1], hcopies[2])
        if not _header_ok(pre, merged):
            raise CorruptRecordError("record header is corrupt in all copies")
        body = merged[:-HEADER_CHECK_BYTES].tobytes()
        repairs += HEADER_COPIES
    header = RecordHeader.from_json(body)
    if total != head_end + header.payload_len:
        raise TruncatedRecordError(
            f"record is {total} bytes, header says {head_end + header.payload_len}"
        )
    if expect_key is not None and header.key != expect_key:
        raise RecordMismatchError("record was written under another chunk key")
    if expect_layer is not None and header.layer != expect_layer:
        raise RecordMismatchError(
            f"record holds layer {header.layer}, expected layer {expect_layer}"
        )
    if expect_fingerprint is not None and header.fingerprint != expect_fingerprint:
        raise RecordMismatchError("record was written for another model fingerprint")
    return DecodedRecord(header, view[head_end:], repairs, head_end)


def _header_ok(pre: bytes, copy: np.ndarray) -> bool:
    body = copy[:-HEADER_CHECK_BYTES].tobytes()
    return bool(_header_copy(pre, body)[-HEADER_CHECK_BYTES:] == copy[-HEADER_CHECK_BYTES:].tobytes())
