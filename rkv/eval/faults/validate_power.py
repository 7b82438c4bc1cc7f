"""Exact two-sided binomial tests, their power and the sample size they need.

The statistics behind ``rkv validate`` (:mod:`rkv.eval.faults.validate`): a cell counts ``k`` lost
blocks among ``n`` faulty ones and tests them against the model's share ``p``. The test is
exact (no normal approximation): the two-sided p-value of ``k`` is the probability, under
``Binomial(n, p)``, of every count no more likely than ``k`` (the "minlike" rule, as
``scipy.stats.binomtest`` computes it). Where the model's ``p`` is itself an estimate (judged
from sampled fault patterns, standard error ``se``), the null hypothesis is the band
``p +- z se``: a count inside it is no evidence against the model, one outside is tested
against the nearer end of the band. Power is summed exactly over the rejection region, so
sizing a cell does not rely on an approximation either.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
import numpy.typing as npt

from rkv.errors import ConfigError

FloatArray = npt.NDArray[np.float64]

#: Relative slack when comparing probabilities of two counts (ties of the "minlike" rule):
#: the same value scipy uses, so that symmetric cases (p = 0.5) pair up exactly.
_TIE = 1.0 + 1e-7
#: The largest number of faulty blocks a cell may ask for (sizing stops there).
MAX_N = 2_000_000


def log_pmf(n: int, p: float) -> FloatArray:
    """``log P(K = k)`` for ``K ~ Binomial(n, p)``, every ``k`` in ``0..n`` (``-inf`` where the
    probability is 0)."""
    if n < 0 or not 0.0 <= p <= 1.0:
        raise ConfigError(f"binomial: need n >= 0 and 0 <= p <= 1, got n={n}, p={p}")
    k = np.arange(n + 1, dtype=np.float64)
    # log C(n, k) by a running sum of log((n - j + 1) / j): exact enough for any n here and
    # vectorized (numpy has no lgamma).
    steps = np.log(n - k[1:] + 1.0) - np.log(k[1:])
    log_c = np.concatenate([[0.0], np.cumsum(steps)])
    with np.errstate(divide="ignore", invalid="ignore"):
        a = k * math.log(p) if p > 0 else np.where(k == 0, 0.0, -np.inf)
        b = (n - k) * math.log1p(-p) if p < 1 else np.where(k == n, 0.0, -np.inf)
    out: FloatArray = log_c + a + b
    return out


def binom_pvalues(n: int, p: float) -> FloatArray:
    """The exact two-sided p-value of every count ``k`` in ``0..n`` against ``p``: the sum of
    the probabilities of all counts no more likely than ``k``."""
    pmf = np.exp(log_pmf(n, p))
    order = np.sort(pmf)
    # Summing the smallest terms first keeps the digits of tiny p-values.
    cum = np.cumsum(order)
    idx = np.searchsorted(order, pmf * _TIE, side="right")
    out: FloatArray = np.minimum(1.0, cum[idx - 1])
    return out


def binom_test(k: int, n: int, p: float) -> float:
    """The exact two-sided binomial p-value of ``k`` successes in ``n`` trials against ``p``."""
    if not 0 <= k <= n:
        raise ConfigError(f"binomial test: need 0 <= k <= n, got k={k}, n={n}")
    return float(binom_pvalues(n, p)[k])


def band_pvalues(n: int, lo: float, hi: float) -> FloatArray:
    """Two-sided p-values of every count against the composite null ``lo <= p <= hi``: 1 for
    a share ``k / n`` inside the band, else the exact p-value at the nearer end."""
    if lo > hi:
        raise ConfigError(f"band: lo {lo} > hi {hi}")
    share = np.arange(n + 1, dtype=np.float64) / max(n, 1)
    if lo == hi:
        return binom_pvalues(n, lo)
    out = np.ones(n + 1)
    below, above = share < lo, share > hi
    out[below] = binom_pvalues(n, lo)[below]
    out[above] = binom_pvalues(n, hi)[above]
    return out


@dataclass(frozen=True)
class BinomialTest:
    """How one cell is tested: the model's share ``p`` (lost among faulty blocks), the band
    half-width from its standard error, and the level of the binomial part."""

    p: float
    se: float
    level: float        # the cell's whole false-alarm budget

    @property
    def binom_level(self) -> float:
        """The binomial test's level: all of it, or half when the band takes the other half."""
        return self.level / 2 if self.se > 0 else self.level

    @property
    def band(self) -> tuple[float, float]:
        """The null band ``p +- z se``, ``z`` the two-sided quantile of half the level (so a
        model estimate off by more than that is itself one of the false alarms counted)."""
        if self.se <= 0:
            return self.p, self.p
        z = NormalDist().inv_cdf(1.0 - self.level / 4)
        return max(0.0, self.p - z * self.se), min(1.0, self.p + z * self.se)

    def pvalues(self, n: int) -> FloatArray:
        lo, hi = self.band
        return band_pvalues(n, lo, hi)

    def pvalue(self, k: int, n: int) -> float:
        if not 0 <= k <= n:
            raise ConfigError(f"binomial test: need 0 <= k <= n, got k={k}, n={n}")
        return float(self.pvalues(n)[k])

    def rejects(self, k: int, n: int) -> bool:
        return self.pvalue(k, n) <= self.binom_level

    def power(self, n: int, p_true: float) -> float:
        """P(the test rejects) when the true share is ``p_true``, summed exactly."""
        reject = self.pvalues(n) <= self.binom_level
        return float(np.exp(log_pmf(n, p_true))[reject].sum())

    def powers(self, n: int, ratio: float = 2.0) -> tuple[float, float]:
        """Power against the two errors of :func:`alternatives` (the rarer outcome ``ratio``
        times as frequent as the model says, and ``1 / ratio`` times)."""
        more, less = alternatives(self.p, ratio)
        return self.power(n, more), self.power(n, less)

    def detectable(self, n: int, power: float) -> float:
        """The smallest error ratio (> 1, either way on the rarer outcome) that ``n`` faulty
        blocks detect with ``power``; ``inf`` if not even a 10x error is."""
        if not 0.0 < self.p < 1.0 or min(self.powers(n, 10.0)) < power:
            return math.inf
        lo, hi = 1.0, 10.0
        while hi - lo > 0.005:
            mid = (lo + hi) / 2
            if min(self.powers(n, mid)) >= power:
                hi = mid
            else:
                lo = mid
        return hi


def alternatives(p: float, ratio: float = 2.0) -> tuple[float, float]:
    """The shares of lost blocks if the model were wrong by ``ratio`` either way on the
    *rarer* outcome (lost when ``p <= 1/2``, recovered otherwise): a 2x error on a share of
    0.9 lost means 0.8 or 0.95, not 1.8."""
    if p <= 0.5:
        return min(1.0, ratio * p), p / ratio
    q = 1.0 - p
    return 1.0 - min(1.0, ratio * q), 1.0 - q / ratio


def spread(n: int, p: float) -> float:
    """``n p (1 - p)``: under 5 the count can only confirm near-certain outcomes."""
    return n * p * (1.0 - p)


def required_n(test: BinomialTest, target: float) -> int:
    """The smallest number of faulty blocks at which ``test`` has at least ``target`` power
    against both 2x errors (found by doubling, then bisection; the power of a discrete test
    zig-zags by a little with ``n``, so callers check the ``n`` they run). ``MAX_N`` when
    even that is not enough."""
    if not 0.0 < test.p < 1.0:
        return MAX_N

    def enough(n: int) -> bool:
        return min(test.powers(n)) >= target

    hi = 16
    while not enough(hi):
        if hi >= MAX_N:
            return MAX_N
        hi = min(MAX_N, 2 * hi)
    lo = hi // 2
    while hi - lo > max(1, lo // 100):
        mid = (lo + hi) // 2
        if enough(mid):
            hi = mid
        else:
            lo = mid
    return hi


def bonferroni(family_level: float, cells: int) -> float:
    """The level of each of ``cells`` tests so that the family falsely alarms with at most
    ``family_level`` (Bonferroni: no assumption about dependence)."""
    if not 0.0 < family_level < 1.0 or cells < 1:
        raise ConfigError(f"level: need 0 < level < 1 and cells >= 1, got {family_level}, "
                          f"{cells}")
    return family_level / cells
