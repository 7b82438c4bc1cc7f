"""Detection-only codec ``crc32c``: the data followed by its CRC-32C (4 bytes, little-endian).

Uses ``google_crc32c`` (hardware CRC32 instructions) when importable, otherwise a numba
slicing-by-8 implementation (:mod:`rkv.ecc._crc32c_kernel`); both give the same value.
"""

from __future__ import annotations

from collections.abc import Callable

from rkv.ecc._checksum import DigestCodec
from rkv.ecc._crc32c_kernel import crc32c_numba
from rkv.ecc.base import U8

try:  # pragma: no cover - depends on the environment
    import google_crc32c as _gcrc

    def _crc_google(data: U8) -> int:
        return int(_gcrc.value(data))

    _crc: Callable[[U8], int] = _crc_google
    IMPLEMENTATION = f"google_crc32c ({_gcrc.implementation})"
except ImportError:  # pragma: no cover
    _crc = crc32c_numba
    IMPLEMENTATION = "numba slicing-by-8"


def crc32c(data: U8) -> int:
    """CRC-32C of a read-only uint8 array (see :func:`rkv.ecc.base.as_u8`)."""
    return _crc(data)


class Crc32cCodec(DigestCodec):
    """Appends ``crc32c(data)``. Detects all bursts up to 32 bits and most other corruption
    (a random corruption escapes with probability ``2^-32``)."""

    codec_id = "crc32c"
    digest_size = 4

    @staticmethod
    def digest(data: U8) -> int:
        return _crc(data)
