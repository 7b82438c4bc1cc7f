"""Means over text windows with their Student-t confidence intervals, and the Wilson score
interval of a proportion (no scipy).

Below :mod:`rkv.eval.quality` (which re-exports them), the fault campaigns (Wilson intervals of
counts, importance-sampling intervals on effective counts) and the sweep's report, which pools
seeds with :func:`t_quantile`. Their coverage on simulated data is tested in
``tests/test_interval_coverage.py`` (docs/rare-events.md gives the figures).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rkv.errors import InputError


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile (p > 0.5) of Student's t with ``df`` degrees of freedom: bisection
    on the closed-form CDF for integer ``df`` (no scipy needed)."""
    if not (0.5 < p < 1.0) or df < 1:
        raise InputError(f"t_quantile needs 0.5 < p < 1 and df >= 1, got {p!r}, {df!r}")

    def central(t: float) -> float:          # P(|T| < t)
        th = math.atan(t / math.sqrt(df))
        c2 = math.cos(th) ** 2
        term = acc = 1.0
        if df % 2:
            for k in range(1, (df - 3) // 2 + 1):
                term *= c2 * (2 * k) / (2 * k + 1)
                acc += term
            return 2 / math.pi * (th + (math.sin(th) * math.cos(th) * acc if df > 1 else 0.0))
        for k in range(1, (df - 2) // 2 + 1):
            term *= c2 * (2 * k - 1) / (2 * k)
            acc += term
        return math.sin(th) * acc

    lo, hi = 0.0, 1e4
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if central(mid) < 2 * p - 1 else (lo, mid)
    return (lo + hi) / 2


def wilson(k: float, n: float, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval (95 % with the default ``z``) for ``k`` successes in ``n``
    trials. ``k`` and ``n`` may be effective (non-integer) counts: an importance-sampling
    estimate is read as ``k`` of ``n`` with the same mean and variance."""
    # Kept as this closed form on purpose: the libraries that provide it (statsmodels'
    # proportion_confint, scipy's binomtest) pull in scipy (tens of MB) for five lines,
    # and tests check it against exact binomial tails.
    if n <= 0:
        return 0.0, 1.0
    p = min(max(k / n, 0.0), 1.0)
    den = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True)
class MeanCI:
    """A mean over windows and its two-sided t-interval (nan bounds with one window or a
    non-finite value)."""

    mean: float
    low: float
    high: float
    n: int

    @property
    def half(self) -> float:
        return (self.high - self.low) / 2

    def to_dict(self) -> dict[str, float]:
        return {"mean": self.mean, "low": self.low, "high": self.high, "n": self.n}


def mean_ci(values: Sequence[float], level: float = 0.95) -> MeanCI:
    """Mean of ``values`` with its ``level`` Student-t confidence interval (windows are
    independent draws of text; pass paired differences for comparisons)."""
    x = np.asarray(values, dtype=np.float64)
    n = int(x.size)
    if n == 0:
        raise InputError("mean_ci needs at least one value")
    m = float(x.mean())
    if n < 2 or not np.all(np.isfinite(x)):
        return MeanCI(m, math.nan, math.nan, n)
    h = t_quantile(0.5 + level / 2, n - 1) * float(x.std(ddof=1)) / math.sqrt(n)
    return MeanCI(m, m - h, m + h, n)
