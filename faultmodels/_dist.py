"""Exact samplers and tail probabilities used by the models (internal).

Everything here is vectorized numpy or O(1) scalar code; nothing loops over the bytes of
a buffer. The zero-truncated samplers are exact (inversion or rejection), also when the
probability of any event is 1e-20 or less.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


def zt_poisson(mu: float, rng: np.random.Generator) -> int:
    """A Poisson(mu) count conditioned on being >= 1."""
    if not mu > 0.0:
        raise ValueError("zero-truncated Poisson needs mu > 0")
    if mu > 1.0:  # P(0) = exp(-mu) < 0.37: plain rejection
        while True:
            k = int(rng.poisson(mu))
            if k:
                return k
    # inversion: P(K = k | K >= 1) = mu^k / (k! (e^mu - 1))
    u = rng.random()
    p = mu / math.expm1(mu)
    k, c = 1, p
    while u > c and k < 10_000 and p > 0.0:
        k += 1
        p *= mu / k
        c += p
    return k


def first_nonzero_index(units: int, log_z: float, rng: np.random.Generator) -> int:
    """Index of the first non-empty unit among `units` independent ones, each empty with
    probability exp(log_z), conditioned on at least one being non-empty (truncated geometric).
    """
    if units <= 1 or log_z == -math.inf:
        return 0
    q_all = -math.expm1(units * log_z)
    u = rng.random()
    x = math.log1p(-u * q_all) / log_z
    j = math.ceil(x) - 1
    return min(max(j, 0), units - 1)


def zt_binomial(n: int, p: float, rng: np.random.Generator) -> int:
    """A Binomial(n, p) count conditioned on being >= 1 (exact for any p, n)."""
    if n < 1 or not p > 0.0:
        raise ValueError("zero-truncated binomial needs n >= 1 and p > 0")
    if p >= 1.0:
        return n
    if n * p > 2.0:  # P(0) <= e^-2: plain rejection
        while True:
            k = int(rng.binomial(n, p))
            if k:
                return k
    j = first_nonzero_index(n, math.log1p(-p), rng)
    rest = n - j - 1
    return 1 + (int(rng.binomial(rest, p)) if rest > 0 else 0)


def distinct(n: int, k: int, rng: np.random.Generator) -> IntArray:
    """`k` distinct uniform integers from [0, n), sorted."""
    if k <= 0:
        return np.empty(0, dtype=np.int64)
    if k > n:
        raise ValueError(f"cannot draw {k} distinct values from {n}")
    if k == n:
        return np.arange(n, dtype=np.int64)
    out = rng.choice(n, size=k, replace=False, shuffle=False).astype(np.int64, copy=False)
    out.sort()
    return out


def runs(idx: IntArray) -> tuple[IntArray, IntArray]:
    """Maximal runs of consecutive integers in a sorted unique array: (starts, ends_exclusive)."""
    if idx.size == 0:
        e = np.empty(0, dtype=np.int64)
        return e, e
    breaks = np.flatnonzero(np.diff(idx) != 1)
    starts = idx[np.concatenate(([0], breaks + 1))]
    ends = idx[np.concatenate((breaks, [idx.size - 1]))] + 1
    return starts.astype(np.int64), ends.astype(np.int64)


def _logsumexp(x: FloatArray) -> float:
    if x.size == 0:
        return -math.inf
    m = float(np.max(x))
    if m == -math.inf:
        return -math.inf
    return m + math.log(float(np.sum(np.exp(x - m))))


def binom_tail(n: int, p: float, t: int) -> float:
    """P(X > t) for X ~ Binomial(n, p), summed over the tail (accurate when tiny)."""
    if t >= n or p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    if t < 0:
        return 1.0
    k0 = t + 1
    log0 = (
        math.lgamma(n + 1) - math.lgamma(k0 + 1) - math.lgamma(n - k0 + 1)
        + k0 * math.log(p) + (n - k0) * math.log1p(-p)
    )
    k = np.arange(k0, n, dtype=np.float64)
    steps = np.log(n - k) - np.log(k + 1) + (math.log(p) - math.log1p(-p))
    logs = np.concatenate(([log0], log0 + np.cumsum(steps)))
    return min(1.0, math.exp(_logsumexp(logs)))


def _lbeta(a: float, b: float) -> float:
    return math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)


def beta_params(p: float, rho: float) -> tuple[float, float]:
    """Beta(alpha, beta) with mean p and intra-class correlation rho (0 < rho < 1)."""
    s = (1.0 - rho) / rho
    return p * s, (1.0 - p) * s


def bb_log_p0(m: int, alpha: float, beta: float) -> float:
    """log P(X = 0) for X ~ BetaBinomial(m, alpha, beta), accurate when alpha is tiny."""
    if m <= 0 or alpha <= 0.0:
        return 0.0
    k = np.arange(m, dtype=np.float64)
    return -float(np.sum(np.log1p(alpha / (beta + k))))


def bb_tail(n: int, alpha: float, beta: float, t: int) -> float:
    """P(X > t) for X ~ BetaBinomial(n, alpha, beta), summed over the tail."""
    if t >= n or alpha <= 0.0:
        return 0.0
    if t < 0:
        return 1.0
    k0 = t + 1
    log0 = (
        math.lgamma(n + 1) - math.lgamma(k0 + 1) - math.lgamma(n - k0 + 1)
        + _lbeta(k0 + alpha, n - k0 + beta) - _lbeta(alpha, beta)
    )
    k = np.arange(k0, n, dtype=np.float64)
    steps = np.log(n - k) + np.log(k + alpha) - np.log(k + 1) - np.log(n - k - 1 + beta)
    logs = np.concatenate(([log0], log0 + np.cumsum(steps)))
    return min(1.0, math.exp(_logsumexp(logs)))


def bb_zt_cdf(m: int, alpha: float, beta: float) -> FloatArray:
    """CDF over k = 1..m of BetaBinomial(m, alpha, beta) conditioned on k >= 1."""
    k = np.arange(1, m, dtype=np.float64)
    steps = np.log(m - k) + np.log(k + alpha) - np.log(k + 1) - np.log(m - k - 1 + beta)
    logpmf = np.concatenate(([0.0], np.cumsum(steps)))
    pmf = np.exp(logpmf - np.max(logpmf))
    cdf = np.cumsum(pmf)
    cdf /= cdf[-1]
    return cdf


def sample_from_cdf(cdf: FloatArray, size: int, rng: np.random.Generator) -> IntArray:
    """Draws k = 1..len(cdf) from a CDF array (k = index + 1)."""
    u = rng.random(size)
    k = np.searchsorted(cdf, u, side="right") + 1
    return np.minimum(k, cdf.size).astype(np.int64)
