"""Byte sizes for people: ``1536`` -> ``"1.5 KiB"``, and back: ``"1.5KiB"`` -> ``1536``."""

from __future__ import annotations

import math
import re
from fractions import Fraction

# rich.progress's DownloadColumn picks binary units with this function; rich.filesize.decimal
# would print SI units (kB, MB), while rkv's capacities and blocks are powers of two (a
# 192 KiB block, a 2 GiB tier), so binary units read exactly.
from rich.filesize import pick_unit_and_suffix

_SUFFIXES = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"]

#: The size suffixes rkv reads (lower case; binary and decimal), for sizes people write:
#: ``rkv replay --capacity 2GiB``, ``RKV_TIER_DRAM_CAPACITY_BYTES=4GiB``.
UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
         "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
#: The largest size :func:`scale` returns: a signed 64-bit count (8 EiB - 1). Configs set
#: tighter limits of their own (a tier's capacity, say); nothing parsed is ever larger.
MAX_SIZE = (1 << 63) - 1
#: Free capacities at or above this (2**62) mean "no limit": the planner's sentinel for a
#: tier whose room the decision site makes; :func:`human_capacity` prints it "unbounded".
UNBOUNDED = 1 << 62

# The size grammar: digits, an optional fraction, an optional unit. Digit counts are
# bounded: Fraction and int() of a megabyte of digits would take seconds.
_SIZE = re.compile(r"^\s*(\d{1,30}(?:\.\d{1,30})?)\s*([A-Za-z]*)\s*$")


def human_bytes(n: float) -> str:
    """``512`` -> ``"512 B"``, ``1536`` -> ``"1.5 KiB"``, ``2 << 30`` -> ``"2.0 GiB"``."""
    if not math.isfinite(n):
        return str(n)
    unit, suffix = pick_unit_and_suffix(int(abs(n)), _SUFFIXES, 1024)
    if unit == 1:
        return f"{n:.0f} B"
    return f"{n / unit:.1f} {suffix}"


def human_capacity(n: float) -> str:
    """:func:`human_bytes`, or ``"unbounded"`` at :data:`UNBOUNDED` and above."""
    return "unbounded" if n >= UNBOUNDED else human_bytes(n)


def parse_size(value: str, name: str) -> int:
    """A size people write (``"64MiB"``, ``"8 GiB"``, ``"1.5GB"``, ``"4096"``) as whole
    bytes, exactly: the one size grammar of rkv's configs (TOML values and ``RKV_*``
    variables). A :class:`~rkv.errors.ConfigError` naming ``name`` for anything else: a
    sign, an unknown or misspelt unit (``"64 MiBs"``), a fraction of a byte, a size over
    :data:`MAX_SIZE`, NaN."""
    from rkv.errors import ConfigError

    m = _SIZE.match(value)
    if m is None or m.group(2).lower() not in UNITS:
        shown = repr(value) if len(value) <= 60 else repr(value[:57]) + "..."
        raise ConfigError(f"{name}={shown}: expected a size in bytes, a whole number that "
                          "may end in KiB, MiB, GiB, TiB, KB, MB, GB, TB or B")
    size = scale(m.group(1), m.group(2), name)
    if size.denominator != 1:
        raise ConfigError(f"{name}={value!r}: not a whole number of bytes")
    return int(size)


def scale(number: str, unit: str, name: str) -> Fraction:
    """``number`` (as a size grammar's regex matched it: decimal digits, a point, an
    exponent; the grammar bounds their lengths) times ``unit``'s bytes, exactly, as a
    Fraction (float rounding would turn ``12345678901234567891`` into another integer). A
    :class:`~rkv.errors.ConfigError` naming ``name`` when the unit is unknown or the size
    exceeds :data:`MAX_SIZE`."""
    from rkv.errors import ConfigError

    factor = UNITS.get(unit.lower())
    if factor is None:
        raise ConfigError(f"{name}: unknown size unit {unit!r} (units: KiB, MiB, GiB, TiB, "
                          "KB, MB, GB, TB, B)")
    value = Fraction(number) * factor
    if value > MAX_SIZE:
        raise ConfigError(f"{name}: {number}{unit} is too large (at most {MAX_SIZE} bytes)")
    return value
