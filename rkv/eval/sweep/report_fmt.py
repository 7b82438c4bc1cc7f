"""What the report's three outputs share (the terminal summary, ``report.md`` and the
figures): the tier order, a setting's objective values, its label, and numbers as text.

Below :mod:`rkv.eval.sweep.report`, :mod:`rkv.eval.sweep.report_md` and
:mod:`rkv.eval.sweep.report_plot`, which all import it; it imports only the pooled rows
(:mod:`rkv.eval.sweep.report_rows`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from typing import Any

from rkv.eval.sweep.report_rows import Interval, Rate, Setting

OBJECTIVES = ("overhead", "kl", "sdc", "due")
TIER_ORDER = ("dram", "cxl", "nvme")
MODEL_NOTE = "SmolLM2-135M, whose weights are 4-bit (Q4_1)"
CHECKSUM_ONLY = ("none", "xxh3", "crc32c")


def objectives(s: Setting, rate: str = "hi") -> dict[str, float | None]:
    """The setting's objective values (``None``: not measured)."""
    return {"overhead": s.overhead, "kl": s.kl.mean if s.kl else None,
            "sdc": s.sdc.bound(rate) if s.sdc else None,
            "due": s.due.bound(rate) if s.due else None}


def tiers(sets: Iterable[Setting]) -> list[str]:
    """Panel names (tiers, or ``tier/preset``), the default tiers first in their stacking
    order, each followed by its other presets; other names after them, sorted."""
    def key(name: str) -> tuple[int, str]:
        tier = name.split("/", 1)[0]
        return (TIER_ORDER.index(tier) if tier in TIER_ORDER else len(TIER_ORDER), name)

    return sorted({s.tier for s in sets}, key=key)


def used_objectives(sets: Sequence[Setting], rate: str = "hi") -> tuple[str, ...]:
    """The objectives every one of ``sets`` has."""
    objs = [objectives(s, rate) for s in sets]
    return tuple(o for o in OBJECTIVES if all(v[o] is not None for v in objs))


# -- labels ---------------------------------------------------------------------------------------
def short_code(code: str) -> str:
    """``rs(255,223)`` -> ``rs223``, ``bch(m=13,t=40)`` -> ``bch40``, ``none`` -> ``chk``."""
    c = code.replace(" ", "")
    if c in CHECKSUM_ONLY:
        return "chk" if c == "none" else c
    m = re.fullmatch(r"rs\((\d+),(\d+)\)", c)
    if m:
        return f"rs{m.group(2)}" if m.group(1) == "255" else f"rs{m.group(1)}/{m.group(2)}"
    m = re.fullmatch(r"bch\((?:m=)?\d+,(?:t=)?(\d+)\)", c)
    if m:
        return f"bch{m.group(1)}"
    m = re.fullmatch(r"shardrs\((?:k=)?(\d+),(?:m=)?(\d+)\)", c)
    if m:
        return f"shard{m.group(1)}+{m.group(2)}"
    return c if len(c) <= 14 else c[:13] + "…"


_FIXED = ("tier", "bits", "code", "metrics", "settings")


def varying(sets: Sequence[Setting], tier: str) -> tuple[str, ...]:
    """Config keys besides bits and code whose value differs between settings of ``tier``."""
    group = [s for s in sets if s.tier == tier]
    keys = sorted({k for s in group for k in s.config} - set(_FIXED))
    return tuple(k for k in keys if len({repr(s.config.get(k)) for s in group}) > 1)


def _compact(v: Any) -> str:
    if isinstance(v, dict):
        return ",".join(f"{k}={_compact(x)}" for k, x in sorted(v.items()))
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def label(s: Setting, extra: Sequence[str] = ()) -> str:
    """``4b rs223`` plus the varying axes, e.g. ``4b rs223 ber_multiplier=100``."""
    text = "planned" if s.bits is None else f"{s.bits}b {short_code(s.code)}"
    for k in extra:
        text += f" {k}={_compact(s.config.get(k))}"[:32]
    return text


# -- numbers as text ------------------------------------------------------------------------------
def fmt_num(x: float | None, digits: int = 3) -> str:
    if x is None:
        return "–"
    if math.isinf(x):
        return "undefined"
    return "0" if x == 0 else f"{x:.{digits}g}"


def fmt_interval(iv: Interval | None, digits: int = 3) -> str:
    if iv is None:
        return "–"
    if math.isinf(iv.mean):
        return "undefined"
    return f"{fmt_num(iv.mean, digits)} [{fmt_num(iv.lo, 2)}, {fmt_num(iv.hi, 2)}]"


def fmt_rate(r: Rate | None) -> str:
    """``0/6400 (<= 5.7e-04)`` when none seen, else ``rate [lo, hi]``."""
    if r is None:
        return "–"
    if r.n == 0:
        return f"0/{r.total} (≤ {r.hi:.2g})"
    return f"{r.rate:.2g} [{r.lo:.2g}, {r.hi:.2g}] ({r.n}/{r.total})"
