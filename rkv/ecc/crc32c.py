"""Detection-only codec ``crc32c``: the data followed by its CRC-32C (4 bytes, little-endian).

The CRC comes from ``google_crc32c`` (a runtime dependency; SSE4.2 / ARMv8 CRC32 instructions).
rkv used to carry a numba slicing-by-8 kernel as a fallback; it was 7-13x slower on every
buffer of 4 KiB or more (``benchmarks/bench_crc32c.py``, ``docs/ecc.md``) and is gone. Where
``google_crc32c`` could not build its C extension it falls back to pure Python and warns once;
values are the same, only slower (:data:`IMPLEMENTATION` says which one runs).
"""

from __future__ import annotations

import google_crc32c

from rkv.ecc._checksum import DigestCodec
from rkv.ecc.base import U8, BytesLike, as_u8

#: ``"c"`` (hardware or table-driven C) or ``"python"`` (google_crc32c's slow fallback).
IMPLEMENTATION: str = google_crc32c.implementation

_value = google_crc32c.value


def crc32c(data: BytesLike) -> int:
    """CRC-32C (Castagnoli; initial value ``~0``, final ``~crc``, as iSCSI and ext4) of
    ``data``'s bytes. ``bytes`` and C-contiguous arrays go straight to the library; anything
    else :func:`rkv.ecc.base.as_u8` accepts is viewed or copied first (its ``InputError`` for
    what is not bytes-like)."""
    try:
        return int(_value(data))
    except (TypeError, ValueError):  # bytearray, memoryview, strided arrays: y# refuses them
        return int(_value(as_u8(data)))


class Crc32cCodec(DigestCodec):
    """Appends ``crc32c(data)``. Detects all bursts up to 32 bits and most other corruption
    (a random corruption escapes with probability ``2^-32``)."""

    codec_id = "crc32c"
    digest_size = 4

    @staticmethod
    def digest(data: U8) -> int:
        return int(_value(data))
