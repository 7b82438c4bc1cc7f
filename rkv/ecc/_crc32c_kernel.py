"""A numba slicing-by-8 CRC-32C (Castagnoli, reflected polynomial 0x82F63B78).

The fallback for :mod:`rkv.ecc.crc32c` when ``google_crc32c`` (hardware CRC32 instructions) is
not installed. Same value as ``google_crc32c.value``: initial ``~0``, final ``~crc``.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np
import numpy.typing as npt

from rkv.ecc._jit import jit

Arr = npt.NDArray[Any]

POLY = 0x82F63B78


@cache
def crc32c_tables() -> npt.NDArray[np.uint32]:
    """``(8, 256)`` uint32: ``t[0]`` is the byte-wise table, ``t[j]`` shifts j more bytes."""
    t = np.zeros((8, 256), dtype=np.uint32)
    for v in range(256):
        c = v
        for _ in range(8):
            c = (c >> 1) ^ (POLY if c & 1 else 0)
        t[0, v] = c
    for j in range(1, 8):
        prev = t[j - 1]
        t[j] = (prev >> 8) ^ t[0][prev & 0xFF]
    t.flags.writeable = False
    return t


@jit
def _crc32c_update(crc: int, data: Arr, t: Arr) -> int:
    c = np.uint32(crc)
    n = data.shape[0]
    m8 = np.uint32(0xFF)
    i = np.uint64(0)
    un = np.uint64(n)
    while i + np.uint64(8) <= un:
        lo = (
            np.uint32(data[i])
            | (np.uint32(data[i + np.uint64(1)]) << np.uint32(8))
            | (np.uint32(data[i + np.uint64(2)]) << np.uint32(16))
            | (np.uint32(data[i + np.uint64(3)]) << np.uint32(24))
        ) ^ c
        hi = (
            np.uint32(data[i + np.uint64(4)])
            | (np.uint32(data[i + np.uint64(5)]) << np.uint32(8))
            | (np.uint32(data[i + np.uint64(6)]) << np.uint32(16))
            | (np.uint32(data[i + np.uint64(7)]) << np.uint32(24))
        )
        c = (
            t[7, lo & m8]
            ^ t[6, (lo >> np.uint32(8)) & m8]
            ^ t[5, (lo >> np.uint32(16)) & m8]
            ^ t[4, lo >> np.uint32(24)]
            ^ t[3, hi & m8]
            ^ t[2, (hi >> np.uint32(8)) & m8]
            ^ t[1, (hi >> np.uint32(16)) & m8]
            ^ t[0, hi >> np.uint32(24)]
        )
        i += np.uint64(8)
    while i < un:
        c = t[0, (c ^ np.uint32(data[i])) & m8] ^ (c >> np.uint32(8))
        i += np.uint64(1)
    return int(c)


def crc32c_numba(data: Arr, crc: int = 0) -> int:
    """CRC-32C of a read-only uint8 array (optionally continuing from ``crc``)."""
    return _crc32c_update(crc ^ 0xFFFFFFFF, data, crc32c_tables()) ^ 0xFFFFFFFF
