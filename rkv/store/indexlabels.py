"""Per-layer fields of an index entry: pipeline labels and write times, kept as a palette of
distinct values plus one index per layer (a 30-layer entry stores one label, not 30)."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from rkv.errors import CorruptStoreError
from rkv.quant.widths import Width, as_width, parse_width, width_text

#: A block's pipeline as the index records it: ``"<bits>/<code spec>"``, e.g.
#: ``"4/rs(n=255,k=239,interleave=1)"`` or ``"16/none"``, and ``"4+2/..."`` for 4-bit keys
#: with 2-bit values (a summary for accounting; the record header is the authority on what
#: a record holds).
_LABEL = re.compile(r"(?:[1-9]|1[0-6])(?:\+(?:[1-9]|1[0-6]))?/"
                    r"[a-z][a-z0-9_]*(?:\([A-Za-z0-9_=,.()+ -]*\))?")
_LABEL_MAX = 160


def pipe_label(bits: int | Width, code: str) -> str:
    """The index label of a block stored at ``bits`` (both halves, or (key bits, value
    bits)) with code ``code``."""
    return f"{width_text(as_width(bits))}/{code}"


def label_parts(label: str) -> tuple[Width, str]:
    """((key bits, value bits), code) of a label :func:`pipe_label` made."""
    bits, code = label.split("/", 1)
    return parse_width(bits), code


def _labels(raw: Any, n_blocks: int) -> tuple[str, ...]:
    """The per-layer labels of an entry's ``q`` field (``{"p": palette, "l": indices}``,
    -1 for a layer whose pipeline is unknown); CorruptStoreError for anything malformed."""
    if raw is None:
        return ()
    if not isinstance(raw, dict) or set(raw) != {"p", "l"}:
        raise CorruptStoreError("corrupt index entry: pipeline labels are malformed")
    pal, idx = raw["p"], raw["l"]
    if not (isinstance(pal, list) and isinstance(idx, list) and len(idx) == n_blocks
            and len(pal) <= n_blocks):
        raise CorruptStoreError("corrupt index entry: pipeline labels do not match its blocks")
    for lab in pal:
        if type(lab) is not str or not _label_ok(lab):
            raise CorruptStoreError("corrupt index entry: bad pipeline label")
    if idx and (set(map(type, idx)) != {int} or min(idx) < -1 or max(idx) >= len(pal)):
        raise CorruptStoreError("corrupt index entry: pipeline label index out of range")
    labels = [*pal, ""]        # index -1: unknown
    return tuple([labels[i] for i in idx])


def _times(raw: Any, n_blocks: int) -> tuple[int, ...]:
    """The per-layer write times of an entry's ``w`` field (``{"t": distinct ns, "l":
    indices}``, -1 for a layer whose time is unknown, 0 in the result); CorruptStoreError
    for anything malformed."""
    if raw is None:
        return ()
    if not isinstance(raw, dict) or set(raw) != {"t", "l"}:
        raise CorruptStoreError("corrupt index entry: write times are malformed")
    times, idx = raw["t"], raw["l"]
    if not (isinstance(times, list) and isinstance(idx, list) and len(idx) == n_blocks
            and len(times) <= n_blocks):
        raise CorruptStoreError("corrupt index entry: write times do not match its blocks")
    if times and (set(map(type, times)) != {int} or min(times) < 1 or max(times) >= 1 << 64):
        raise CorruptStoreError("corrupt index entry: bad write time")
    if idx and (set(map(type, idx)) != {int} or min(idx) < -1 or max(idx) >= len(times)):
        raise CorruptStoreError("corrupt index entry: write time index out of range")
    return tuple([[*times, 0][i] for i in idx])


def _palette(values: tuple[Any, ...], n: int, unknown: Any) -> tuple[list[Any], list[int]]:
    """(distinct known values, sorted; per layer of ``n`` its index, -1 when unknown)."""
    pal = sorted({v for v in values if v != unknown})
    at = {v: i for i, v in enumerate(pal)}
    return pal, [at.get(values[i], -1) if i < len(values) else -1 for i in range(n)]


@lru_cache(maxsize=256)
def _label_ok(label: str) -> bool:
    return len(label) <= _LABEL_MAX and _LABEL.fullmatch(label) is not None
