"""The read path's fast check of a clean raw record: a few byte compares instead of a parse.

Most reads meet records exactly as written: current format, no codecs, the three prelude copies
equal, the first header copy intact. For such a record :func:`rkv.format.record.decode_record` would
take that first copy (zero repairs) and the block codec would only compare the checksum. This
module checks exactly that with byte compares against what the header of that block must say
(key, fingerprint, layer, dtype, shape, lengths: all known before the read), the header copy's
own xxh3-64 seal and the end-to-end xxh3-128 of the payload, then copies the payload out.
Anything else (an outvoted copy, a codec, an old format, a bad checksum) returns False and the
caller runs the full decode on the same bytes, so statuses, errors and repairs are the same.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np
import xxhash

from rkv.format.dtypes import numpy_dtype
from rkv.format.model import ModelSpec
from rkv.format.record import (
    FORMAT_VERSION,
    HEADER_CHECK_BYTES,
    MAGIC,
    PRELUDE_BYTES,
    RecordHeader,
    payload_offset,
)

_P2 = 2 * PRELUDE_BYTES
_PROBE = RecordHeader(key=bytes(32), layer=0, fingerprint=bytes(16), shape=(2, 1, 1, 1),
                      dtype="float16", data_len=2, payload_len=2, checksum=b"\xa5" * 16,
                      written_ns=0x0102030405060708).to_bytes()
#: Offsets in a header body (checked against the record module's own layout at import).
_LAYER, _CK = 48, _PROBE.index(b"\xa5" * 16)
_WRITTEN = _CK + 16
_CLEN = _WRITTEN + 8
assert _PROBE[_WRITTEN:_CLEN] == (0x0102030405060708).to_bytes(8, "little")
assert len(_PROBE) == _CLEN + 2 and _PROBE[_LAYER:_LAYER + 2] == b"\0\0"
_HLEN = len(_PROBE) + HEADER_CHECK_BYTES
_OFF = payload_offset(_HLEN)
_PRE = MAGIC + bytes([FORMAT_VERSION, 0]) + _HLEN.to_bytes(2, "little")
_LEAD = _P2 + _HLEN                      # both leading preludes and the first header copy
_xxh64 = xxhash.xxh3_64_intdigest


@lru_cache(maxsize=256)
def _layout(shape: tuple[int, int, int, int], dtype: str
            ) -> tuple[tuple[int, int, int, int], np.dtype[Any], int, int, bytes, int]:
    """What a block of ``shape`` says past its key and fingerprint (dtype, shape, lengths,
    checksum algorithm), and its sizes: the same for every chunk of that many tokens."""
    dt = numpy_dtype(dtype)
    nbytes = int(np.prod(shape)) * dt.itemsize
    body = RecordHeader(key=bytes(32), layer=0, fingerprint=bytes(16), shape=shape,
                        dtype=dtype, data_len=nbytes, payload_len=nbytes).to_bytes()
    return (shape, dt, nbytes, nbytes // dt.itemsize, body[_LAYER + 2:_CK],
            _OFF + nbytes + _HLEN + PRELUDE_BYTES)
_xxh128 = xxhash.xxh3_128_digest


class FastCheck:
    """What every record of one chunk (any layer) must look like, precomputed once."""

    __slots__ = ("count", "dtype", "fixed", "nbytes", "shape", "tail", "total")

    def __init__(self, key: bytes, fp: bytes, spec: ModelSpec, n_tokens: int) -> None:
        shape = spec.block_shape(n_tokens)
        self.shape, self.dtype, self.nbytes, self.count, self.tail, self.total = _layout(
            shape, spec.dtype)
        self.fixed = _PRE * 2 + key + fp                    # preludes, key, fingerprint

    def copy(self, rec: Any, layer: int, size: int, dest: np.ndarray, written: int = 0
             ) -> bool:
        """Verify ``rec`` as block ``layer`` (``size``: its length in the index, ``written``
        its write time there, 0 unknown) and copy its data into ``dest``; False (``dest``
        untouched) when the full decode must judge it."""
        mv = rec if type(rec) is memoryview else memoryview(rec)
        if mv.nbytes != self.total or size != self.total:
            return False
        head = bytes(mv[:_LEAD])
        if written and head[_P2 + _WRITTEN:_P2 + _CLEN] != written.to_bytes(8, "little"):
            return False
        # Both leading preludes, the first header copy up to its checksum, its codec-list
        # length, the last prelude, then the copy's seal: xxh3-64 of a prelude and the body,
        # which the record holds contiguously from its second prelude on.
        if (head[:_P2 + _CK] != self.fixed + layer.to_bytes(2, "little") + self.tail
                or head[_P2 + _CLEN:_P2 + _CLEN + 2] != b"\0\0"
                or bytes(mv[self.total - PRELUDE_BYTES:]) != _PRE
                or _xxh64(mv[PRELUDE_BYTES:_LEAD - HEADER_CHECK_BYTES])
                != int.from_bytes(head[_LEAD - HEADER_CHECK_BYTES:], "little")):
            return False
        payload = mv[_OFF:_OFF + self.nbytes]
        if _xxh128(payload) != head[_P2 + _CK:_P2 + _CK + 16]:
            return False
        dest[...] = np.frombuffer(payload, self.dtype, self.count).reshape(self.shape)
        return True
