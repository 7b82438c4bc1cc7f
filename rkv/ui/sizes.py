"""Byte sizes for people: ``1536`` -> ``"1.5 KiB"``."""

from __future__ import annotations

import math

# rich.progress's DownloadColumn picks binary units with this function; rich.filesize.decimal
# would print SI units (kB, MB), while rkv's capacities and blocks are powers of two (a
# 192 KiB block, a 2 GiB tier), so binary units read exactly.
from rich.filesize import pick_unit_and_suffix

_SUFFIXES = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"]

#: The size suffixes rkv reads (lower case; binary and decimal), for sizes people write:
#: ``rkv replay --capacity 2GiB``, ``RKV_TIER_DRAM_CAPACITY_BYTES=4GiB``.
UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
         "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def human_bytes(n: float) -> str:
    """``512`` -> ``"512 B"``, ``1536`` -> ``"1.5 KiB"``, ``2 << 30`` -> ``"2.0 GiB"``."""
    if not math.isfinite(n):
        return str(n)
    unit, suffix = pick_unit_and_suffix(int(abs(n)), _SUFFIXES, 1024)
    if unit == 1:
        return f"{n:.0f} B"
    return f"{n / unit:.1f} {suffix}"
