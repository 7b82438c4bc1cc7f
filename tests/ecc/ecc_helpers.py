"""Shared helpers for the rkv.ecc tests (imported by the test modules)."""

from __future__ import annotations

import numpy as np

#: one representative of every codec family (and the interesting variants)
ALL_SPECS = [
    "none",
    "xxh3",
    "crc32c",
    "rs(255,223)",
    "rs(255,239)",
    "rs(20,12)",
    "rs(255,251)",
    "rs(40,32,interleave=3)",
    "rs(255,223,interleave=8)",
    "bch(m=13,t=40)",
    "bch(m=8,t=3)",
    "bch(m=5,t=2)",
    "shardrs(k=16,m=2)",
    "shardrs(k=4,m=3,checksum=crc32c)",
    "shardrs(k=1,m=1)",
]


def rand_bytes(rng: np.random.Generator, n: int) -> bytes:
    return rng.integers(0, 256, n, dtype=np.uint8).tobytes()


def flip(buf: bytes, offsets: list[int], values: list[int]) -> bytes:
    """``buf`` with ``buf[o] ^= v`` for each offset/value pair."""
    b = bytearray(buf)
    for o, v in zip(offsets, values, strict=True):
        b[o] ^= v
    return bytes(b)
