"""NAND presets' data: the RBER surface fitted to published points, and per-drive
heterogeneity of field uncorrectable errors (docs/faultmodels/nvme.md has the tables).

RBER. ``RBER(PE, t) = r0 * (1 + PE / P0)^alpha * (t_eff / 1 h)^beta``: a power law in wear
(RBER grows as a power of the P/E count: Mielke et al., "Bit error rate in NAND flash
memories", IRPS 2008) times a power law in retention time (the retention exponent of the
3D-NAND form after Luo et al., SIGMETRICS 2018), with ``t_eff`` the retention time
accelerated by Arrhenius (JEDEC JESD218, Ea = 1.1 eV). ``P0`` = 100 P/E cycles is fixed (the
wear below which RBER barely moves; the points do not identify it); ``r0, alpha, beta`` are
the least-squares fit in log space to `RBER_POINTS` (`fit_rber`).

Heterogeneity. Schroeder, Lagisetty & Merchant (FAST 2016, Google fleet) report 2-6 of 1,000
drive-days with an uncorrectable error, yet only 20-63 % of drives see one in 4 years; a
common rate for every drive would put 99.7 % of drives there. A gamma-distributed multiplier
Z (mean 1, shape k) on a drive's rate gives ``P(no UE in T) = (1 + lam T / k)^-k``; k is
fitted so that the mean rate (4 per 1,000 drive-days) leaves 40 % of drives with a UE in 4
years (the middle of 20-63 %): `fit_drive_shape`. Which drive a tier is: the quantile of Z
(`gamma_quantile`), or ``"mean"`` (Z = 1), the default, because fleet-average expectations
(losses per block, what the analytic model predicts) are linear in the rate and so are exact
at the mean multiplier; the median drive (Z = 0.026 at k = 0.134) would understate the
fleet's losses about fortyfold.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = [
    "FIELD_DRIVES_WITH_UE_4Y",
    "FIELD_DRIVE_DAY_UE",
    "RBER_P0",
    "RBER_POINTS",
    "drive_day_fraction",
    "drives_with_ue",
    "fit_drive_shape",
    "fit_rber",
    "gamma_cdf",
    "gamma_quantile",
]

#: (source, P/E cycles, retention hours, temperature C, RBER); (secondary) = not read from
#: the primary source's figures. The three 3,000-cycle points are what the 3D-NAND form
#: after Luo et al. (SIGMETRICS 2018; parameters from simulator configurations) gives; the
#: fresh point is the logarithmic middle of the 1e-8..1e-6 fresh MLC/TLC range that the
#: characterizations of Mielke et al. (IRPS 2008) and Cai et al. (DATE 2012) span.
RBER_POINTS: tuple[tuple[str, float, float, float, float], ...] = (
    ("Luo et al. SIGMETRICS 2018 form (secondary)", 3000.0, 1.0, 30.0, 3.1e-5),
    ("Luo et al. SIGMETRICS 2018 form (secondary)", 3000.0, 24.0, 30.0, 7.4e-5),
    ("Luo et al. SIGMETRICS 2018 form (secondary)", 3000.0, 24.0 * 365.25, 30.0, 3.7e-4),
    ("fresh MLC/TLC, Mielke et al. IRPS 2008 / Cai et al. DATE 2012 range (secondary)",
     0.0, 24.0, 30.0, 1e-7),
)
RBER_P0 = 100.0

#: Schroeder, Lagisetty & Merchant, FAST 2016: drive-days with an uncorrectable error (per
#: drive-day) and drives with at least one in 4 years, ranges across drive models.
FIELD_DRIVE_DAY_UE = (2e-3, 6e-3)
FIELD_DRIVES_WITH_UE_4Y = (0.20, 0.63)


def fit_rber(points: Sequence[tuple[str, float, float, float, float]] = RBER_POINTS,
             p0: float = RBER_P0) -> tuple[float, float, float]:
    """(r0, alpha, beta): least squares of ln RBER = ln r0 + alpha ln(1 + PE/p0) +
    beta ln(t / 1 h) over points at the reference temperature."""
    a = np.array([[1.0, math.log1p(pe / p0), math.log(t)] for _, pe, t, _, _ in points])
    y = np.log(np.array([r for *_, r in points]))
    x = np.linalg.lstsq(a, y, rcond=None)[0]
    return math.exp(float(x[0])), float(x[1]), float(x[2])


def drive_day_fraction(rate_per_day: float, shape: float) -> float:
    """Mean over drives of P(a drive-day has an error) with a Gamma(shape, 1/shape) multiplier."""
    if math.isinf(shape):
        return -math.expm1(-rate_per_day)
    return -math.expm1(-shape * math.log1p(rate_per_day / shape))


def drives_with_ue(rate_per_day: float, shape: float, days: float) -> float:
    """Fraction of drives with at least one error in `days` days."""
    return drive_day_fraction(rate_per_day * days, shape)


def fit_drive_shape(rate_per_day: float, target: float, days: float) -> float:
    """The gamma shape k for which `drives_with_ue` equals `target` (bisection in log k)."""
    lo, hi = 1e-6, 1e6
    if drives_with_ue(rate_per_day, hi, days) < target:
        return math.inf
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        if drives_with_ue(rate_per_day, mid, days) < target:
            lo = mid
        else:
            hi = mid
    return math.sqrt(lo * hi)


def gamma_cdf(x: float, shape: float) -> float:
    """P(Z <= x) for Z ~ Gamma(shape, scale 1/shape) (mean 1): the regularized lower
    incomplete gamma function P(shape, shape x), by its power series below shape + 1 and a
    continued fraction (modified Lentz) above."""
    if x <= 0.0:
        return 0.0
    a, z = shape, shape * x
    log_front = a * math.log(z) - z - math.lgamma(a)
    if z < a + 1.0:
        term = total = 1.0 / a
        ap = a
        for _ in range(10_000):
            ap += 1.0
            term *= z / ap
            total += term
            if abs(term) < abs(total) * 1e-16:
                break
        return min(1.0, math.exp(log_front) * total)
    tiny = 1e-300
    b = z + 1.0 - a
    c = 1.0 / tiny
    d = 1.0 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-16:
            break
    return max(0.0, 1.0 - math.exp(log_front) * h)


def gamma_quantile(q: float, shape: float) -> float:
    """The q-quantile of Gamma(shape, scale 1/shape) (bisection on `gamma_cdf` in log x)."""
    if not 0.0 < q < 1.0:
        raise ValueError("a quantile lies in (0, 1)")
    lo, hi = 1e-300, 1.0
    while gamma_cdf(hi, shape) < q:
        hi *= 2.0
    for _ in range(400):
        mid = math.sqrt(lo * hi)
        if gamma_cdf(mid, shape) < q:
            lo = mid
        else:
            hi = mid
        if hi / lo < 1.0 + 1e-13:
            break
    return math.sqrt(lo * hi)
