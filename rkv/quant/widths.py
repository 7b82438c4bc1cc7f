"""Bit-widths of a KV block as one value: ``(key bits, value bits)``.

A block stores K and V of one layer in one record. With KIVI they may take different widths
(``kivi(bits=4, vbits=2)``); 16 means unquantized and applies to both or neither. A width is
written ``"4"`` when both are equal and ``"4+2"`` (keys first) when they differ: the form the
index labels, the stored mix, plans and reports use.
"""

from __future__ import annotations

import re

from rkv.errors import ConfigError

#: (key bits, value bits).
Width = tuple[int, int]
QUANT_BITS = (8, 4, 2)
_TEXT = re.compile(r"(1[0-6]|[1-9])(?:\+(1[0-6]|[1-9]))?")


def uniform(bits: int) -> Width:
    """The width of a block whose K and V both have ``bits`` bits."""
    return (int(bits), int(bits))


def as_width(bits: int | Width) -> Width:
    """A width from a bit count for both halves, or the width itself."""
    return uniform(bits) if isinstance(bits, int) else bits


def check_width(w: Width, what: str = "width") -> Width:
    """``w`` if it is a width a record can hold: (16, 16), or both in {8, 4, 2}."""
    ok = (isinstance(w, tuple) and len(w) == 2 and all(type(b) is int for b in w)
          and (w == (16, 16) or (w[0] in QUANT_BITS and w[1] in QUANT_BITS)))
    if not ok:
        raise ConfigError(f"{what}: K and V bits must both be 16 or both one of 8, 4, 2, "
                          f"got {w!r}")
    return w


def width_text(w: Width) -> str:
    """``"4"`` for (4, 4), ``"4+2"`` for 4-bit keys with 2-bit values."""
    return str(w[0]) if w[0] == w[1] else f"{w[0]}+{w[1]}"


def parse_width(text: str) -> Width:
    """The width :func:`width_text` wrote (ConfigError for anything else)."""
    m = _TEXT.fullmatch(text) if isinstance(text, str) else None
    if m is None:
        raise ConfigError(f"width: expected '<bits>' or '<key bits>+<value bits>', "
                          f"got {text!r}")
    k = int(m.group(1))
    return (k, int(m.group(2)) if m.group(2) else k)


def quant_spec(w: Width | int) -> str:
    """The quantizer spec that stores a block at width ``w`` (an int: both halves)."""
    k, v = as_width(w)
    if k >= 16 and v >= 16:
        return "none"
    return f"kivi(bits={k})" if k == v else f"kivi(bits={k},vbits={v})"


def fewer_bits(a: Width, b: Width) -> bool:
    """True when ``a`` has no more bits than ``b`` in either half and fewer in one."""
    return a != b and a[0] <= b[0] and a[1] <= b[1]
