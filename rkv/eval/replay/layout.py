"""Tier layouts and prefetch budgets as written on the command line (``rkv replay --tiers``,
``--prefetch-budget``): what :mod:`rkv.eval.replay.tiers` simulates and
:mod:`rkv.eval.replay.report` describes, kept below both."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from rkv.errors import ConfigError
from rkv.eval.replay.simulate import Capacity, parse_capacity

__all__ = ["Layout", "TierSpec", "budget_bytes", "parse_budget", "parse_layout"]


@dataclass(frozen=True)
class TierSpec:
    """A tier of a layout before the trace is known (its capacity may be a fraction)."""

    name: str
    capacity: Capacity
    bandwidth: float            # bytes per second
    latency: float              # seconds per block


@dataclass(frozen=True)
class Layout:
    """Tiers top to bottom, as written on the command line."""

    text: str
    tiers: tuple[TierSpec, ...]


_TIER = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*([^@]*?)\s*"
                   r"(?:@\s*([^/]*?)\s*/\s*(.*?)\s*)?$")


def parse_layout(text: str) -> Layout:
    """``dram=2%,cxl=5%,nvme=20%``: tiers top to bottom, each ``NAME=CAPACITY`` (the capacity
    syntax of :func:`parse_capacity`) with the read bandwidth and latency of rkv's default tier
    of that name, or ``NAME=CAPACITY@GBPS/US`` for any name (GB/s and microseconds per block),
    which also overrides a default tier's figures."""
    from rkv.store.config import default_tiers

    known = {t.name: (t.read_gbps, t.latency_us) for t in default_tiers()}
    tiers: list[TierSpec] = []
    for part in str(text).split(","):
        m = _TIER.match(part)
        if m is None or not m.group(2):
            raise ConfigError(f"bad tier {part.strip()!r} in {text!r} (expected NAME=CAPACITY "
                              "or NAME=CAPACITY@GBPS/US, e.g. dram=2%,cxl=5%,nvme=20%)")
        name, cap, gbps, us = m.groups()
        if any(t.name == name for t in tiers):
            raise ConfigError(f"tier {name!r} appears twice in {text!r}")
        if gbps is None:
            if name not in known:
                raise ConfigError(f"tier {name!r} is not a default tier ({', '.join(known)}): "
                                  f"give its figures as {name}={cap}@GBPS/US")
            bw, lat = known[name]
        else:
            bw, lat = _number(gbps, f"{name}: GB/s"), _number(us, f"{name}: microseconds")
            if bw <= 0:
                raise ConfigError(f"tier {name!r}: bandwidth must be > 0 GB/s, got {gbps!r}")
        tiers.append(TierSpec(name, parse_capacity(cap), bw * 1e9, lat * 1e-6))
    return Layout(str(text), tuple(tiers))


def _number(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise ConfigError(f"tier {what} must be a finite number >= 0, got {text!r}")
    return value


def parse_budget(text: str) -> Capacity:
    """A prefetch budget per request: bytes (``2GiB``), a fraction of the top tier (``0.25``,
    ``25%``) or ``0`` (no prefetch; a look-ahead then only protects queued blocks)."""
    if str(text).strip() in ("0", "0B", "0b", "0%"):
        return Capacity(str(text), nbytes=0)
    try:
        return parse_capacity(text)
    except ConfigError as exc:
        raise ConfigError(f"bad prefetch budget {text!r} (bytes like 2GiB, a fraction of the "
                          "top tier like 0.25 or 25%, or 0)") from exc


def budget_bytes(budget: Capacity | None, top_capacity: int) -> int | None:
    """``budget`` in bytes for a top tier of ``top_capacity`` bytes (None: the default)."""
    if budget is None:
        return None
    if budget.nbytes is not None:
        return budget.nbytes
    assert budget.fraction is not None
    return int(budget.fraction * top_capacity)
