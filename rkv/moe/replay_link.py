"""The link of the expert replay (:mod:`rkv.moe.replay`): the tier a missed or prefetched
expert loads from, the size of a copy's uncancellable chunk, and the timing of a copy that is
dropped part way (the module docstring of :mod:`rkv.moe.replay` gives the model).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rkv.errors import ConfigError


@dataclass(frozen=True)
class Source:
    """The tier a missed expert loads from."""

    name: str = "dram"
    bandwidth: float = 20e9      # bytes per second
    latency: float = 1e-7        # seconds per expert load

    def __post_init__(self) -> None:
        if not (math.isfinite(self.bandwidth) and self.bandwidth > 0):
            raise ConfigError(f"source {self.name}: bandwidth must be a finite number > 0")
        if not (math.isfinite(self.latency) and self.latency >= 0):
            raise ConfigError(f"source {self.name}: latency must be a finite number >= 0")

    def load(self, nbytes: int, n: int = 1) -> float:
        return nbytes / self.bandwidth + n * self.latency


def source_tier(text: str) -> Source:
    """``dram``, ``cxl`` or ``nvme`` (rkv's default tiers' read bandwidth and latency) or
    ``NAME@GBPS/US``."""
    from rkv.store.config import default_tiers

    name, _, figures = str(text).partition("@")
    if figures:
        gbps, _, us = figures.partition("/")
        try:
            return Source(name, float(gbps) * 1e9, float(us or 0) * 1e-6)
        except ValueError:
            raise ConfigError(f"bad source tier {text!r} (expected NAME@GBPS/US)") from None
    for t in default_tiers():
        if t.name == name:
            return Source(name, t.read_gbps * 1e9, t.latency_us * 1e-6)
    raise ConfigError(f"unknown source tier {text!r} (dram, cxl, nvme or NAME@GBPS/US)")


def overlap(lo: float, hi: float, compute: float) -> float:
    """Seconds of ``[lo, hi]`` within the compute ``[0, compute]``."""
    return max(0.0, min(hi, compute) - max(lo, 0.0))


def cancel_bytes(text: str | int | None, expert_bytes: int | None = None) -> int | None:
    """``--cancel-chunk``: bytes (``1MiB``, ``4096``; ``0``: instant cancel) or ``expert``
    / None (the whole expert, the default); capped at ``expert_bytes`` when given."""
    if text is None or text == "expert":
        return expert_bytes
    if isinstance(text, bool):
        raise ConfigError(f"cancel chunk must be bytes >= 0 or 'expert', got {text!r}")
    if isinstance(text, int):
        n = text
    else:
        from rkv.ui.sizes import parse_size

        n = parse_size(str(text).strip(), "cancel chunk")
    if n < 0:
        raise ConfigError(f"cancel chunk must be bytes >= 0 or 'expert', got {text!r}")
    return n if expert_bytes is None else min(n, expert_bytes)


def cut(start: float, at: float, size: int, chunk: int, source: Source) -> tuple[float, int]:
    """A prefetch of ``size`` bytes begun at ``start`` and dropped at ``at`` (before its end):
    when the link is free again and the bytes it moved (module docstring). ``chunk`` 0
    cancels at ``at``; otherwise the chunk in progress (the first one while the latency runs)
    is finished."""
    moved = max(0.0, at - start - source.latency) * source.bandwidth
    if chunk == 0:
        return at, min(size, int(moved))
    nbytes = min(size, max(1, math.ceil(moved / chunk)) * chunk)
    return start + source.load(nbytes), nbytes
