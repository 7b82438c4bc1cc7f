"""Monte Carlo checks of every preset's sampler against its analytic probabilities.

Rates are inflated (fit multipliers, long residencies, high rates) so errors happen in a
few thousand draws. Tolerances: 5 sigma (binomial for frequencies, standard error of the
mean for averages), chi-square with a ~5 sigma bound for distributions. Configurations are
chosen so that no rare-but-huge event class dominates a mean (that would make the sample
standard error meaningless).
"""

from __future__ import annotations

import math
import zlib
from typing import Any

import numpy as np
import pytest
from fm_helpers import (
    binom_within,
    chi2_ok,
    mean_within,
    modes_only,
    run_mc,
    two_sample_within,
)

import faultmodels as fm

SMALL_DRAM = {"single-bit": (14.2, 18.6), "single-word": (1.4, 0.3),
              "single-column": (1.4, 5.6)}

# (spec, nbytes, hours, relative slack on bit_error_prob)
CASES: dict[str, tuple[dict[str, Any], int, float, float]] = {
    "raw-ber": ({"preset": "raw-ber", "ber": 2e-4}, 512, 1.0, 0.0),
    "raw-ber-per-hour": ({"model": "raw-ber", "ber": 1e-5, "per_hour": True}, 512, 30.0, 0.0),
    "dram-ddr4": ({"preset": "dram-ddr4", "fit_multiplier": 1e6}, 16384, 5.0, 0.0),
    "dram-ddr4-none-small": ({"preset": "dram-ddr4", "system_ecc": "none",
                              "fit_multiplier": 3e8, "modes": modes_only(SMALL_DRAM)},
                             16384, 1.0, 0.0),
    "dram-ddr4-x4-row": ({"preset": "dram-ddr4", "system_ecc": "none", "device_width": 4,
                          "fit_multiplier": 3e11,
                          "modes": modes_only({"single-row": (0.2, 8.2)})}, 65536, 1.0, 0.0),
    "dram-ddr4-chipkill": ({"preset": "dram-ddr4", "system_ecc": "chipkill",
                            "fit_multiplier": 1e7}, 16384, 1.0, 0.05),
    "dram-ddr4-secded-pairs": ({"preset": "dram-ddr4", "fit_multiplier": 3e10,
                                "modes": modes_only({"single-bit": (14.2, 18.6),
                                                     "single-column": (1.4, 5.6)})},
                               16384, 1.0, 0.05),
    "dram-ddr5": ({"preset": "dram-ddr5", "system_ecc": "none", "fit_multiplier": 1e6},
                  16384, 5.0, 0.0),
    "cxl": ({"preset": "cxl", "media_multiplier": 3e5, "controller_fit": 2e7,
             "link_ber": 1e-5, "crc_escape": 0.01}, 16384, 10.0, 0.0),
    "nvme-tlc": ({"preset": "nvme-tlc", "lse_rate": 3e3, "silent_rate": 3e3,
                  "ecc_bits_per_kib": 4, "pe_cycles": 4800}, 65536, 24.0, 0.0),
    "nvme-raw": ({"preset": "nvme-tlc", "device_ecc": "none", "lse_rate": 0.0,
                  "silent_rate": 0.0}, 1024, 1.0, 0.0),
    "nvme-raw-overdispersed": ({"preset": "nvme-tlc", "device_ecc": "none",
                                "overdispersion": 0.01, "lse_rate": 0.0, "silent_rate": 0.0,
                                "pe_cycles": 9100}, 2148, 24.0, 0.0),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_sample_matches_p_any_error_and_bit_error_prob(case: str) -> None:
    spec, n, h, rel = CASES[case]
    m = fm.get_model(spec)
    trials = 2500
    r = run_mc(m, n, h, trials, seed=zlib.crc32(case.encode()))
    p = m.p_any_error(n, h)
    assert 0.02 < p < 0.999, p  # the configuration is informative
    assert binom_within(r.nonempty, trials, p), (r.nonempty / trials, p)
    assert mean_within(r.wrong_frac, m.bit_error_prob(h), rel=rel), (
        r.wrong_frac.mean(), m.bit_error_prob(h))


def test_raw_ber_flip_count_is_binomial() -> None:
    m = fm.get_model({"model": "raw-ber", "ber": 3e-3})
    n = 128
    r = run_mc(m, n, 1.0, 3000, seed=5)
    k = np.arange(0, 8 * n + 1)
    logpmf = np.array([math.lgamma(8 * n + 1) - math.lgamma(i + 1) - math.lgamma(8 * n - i + 1)
                       for i in k]) + k * math.log(3e-3) + (8 * n - k) * math.log1p(-3e-3)
    counts = np.bincount(r.n_flips.astype(np.int64), minlength=k.size)
    assert chi2_ok(counts, np.exp(logpmf))


def test_dram_flip_counts_match_event_means() -> None:
    """Isolated single-bit faults: flips = events, Poisson with the class mean."""
    m = fm.get_model({"preset": "dram-ddr4", "system_ecc": "none", "fit_multiplier": 2e9,
                      "modes": modes_only({"single-bit": (14.2, 18.6)})})
    n, h = 8192, 1.0
    mu = math.fsum(e.mean for e in m.events(n, h))
    r = run_mc(m, n, h, 3000, seed=8)
    k = np.arange(40)
    pmf = np.exp(k * math.log(mu) - mu - np.array([math.lgamma(i + 1) for i in k]))
    assert chi2_ok(np.bincount(r.n_flips.astype(np.int64), minlength=40)[:40], pmf)


def test_nand_erasure_and_flip_means() -> None:
    m = fm.get_model(CASES["nvme-tlc"][0])
    n, h = 65536, 24.0
    r = run_mc(m, n, h, 2500, seed=21)
    evs = m.events(n, h)
    exp_erased = sum(e.mean * e.bits_per_event / 4.0 for e in evs if e.detected)
    exp_flips = sum(e.mean * e.bits_per_event for e in evs if not e.detected)
    assert mean_within(r.erased, exp_erased, rel=0.02)
    assert mean_within(r.n_flips, exp_flips, rel=0.02)


def test_cxl_lost_and_transient_frequencies() -> None:
    m = fm.get_model({"preset": "cxl", "media_multiplier": 0.0, "controller_fit": 3e7,
                      "link_ber": 3e-6, "crc_escape": 0.01})
    n, h = 65536, 10.0
    r = run_mc(m, n, h, 3000, seed=13)
    evs = {e.kind: e for e in m.events(n, h)}
    p_lost = -math.expm1(-evs["region"].mean)
    p_link = -math.expm1(-evs["link"].mean)  # binomial over 1024 flits ~ Poisson
    assert binom_within(r.lost, r.trials, p_lost)
    assert binom_within(r.transient, r.trials, p_link * (1 - p_lost), z=5.5)


# -- sample_given_error ----------------------------------------------------------------------


def _rejection(m: fm.FaultModel, n: int, h: float, want: int, seed: int) -> list[fm.ErrorPattern]:
    rng = np.random.default_rng(seed)
    out: list[fm.ErrorPattern] = []
    while len(out) < want:
        p = m.sample(n, h, rng)
        if not p.is_empty:
            out.append(p)
    return out


def test_given_error_raw_ber_is_zero_truncated_binomial() -> None:
    m = fm.get_model({"model": "raw-ber", "ber": 1e-3})
    n = 64
    rng = np.random.default_rng(3)
    x = np.array([m.sample_given_error(n, 1.0, rng).n_flips for _ in range(3000)])
    assert x.min() >= 1
    nb, p = 8 * n, 1e-3
    k = np.arange(1, nb + 1)
    logpmf = np.array([math.lgamma(nb + 1) - math.lgamma(i + 1) - math.lgamma(nb - i + 1)
                       for i in k]) + k * math.log(p) + (nb - k) * math.log1p(-p)
    pmf = np.exp(logpmf) / -math.expm1(nb * math.log1p(-p))
    assert chi2_ok(np.bincount(x, minlength=nb + 1)[1:], pmf)
    rej = [q.n_flips for q in _rejection(m, n, 1.0, 3000, seed=4)]
    assert two_sample_within(x, rej)


def test_given_error_dram_is_zero_truncated_poisson() -> None:
    m = fm.get_model({"preset": "dram-ddr4", "system_ecc": "none", "fit_multiplier": 1e9,
                      "modes": modes_only({"single-bit": (14.2, 18.6)})})
    n, h = 8192, 1.0
    mu = math.fsum(e.mean for e in m.events(n, h))
    rng = np.random.default_rng(6)
    x = np.array([m.sample_given_error(n, h, rng).n_flips for _ in range(3000)])
    k = np.arange(1, 30)
    pmf = np.exp(k * math.log(mu) - mu - np.array([math.lgamma(i + 1) for i in k]))
    pmf /= -math.expm1(-mu)
    assert x.min() >= 1
    assert chi2_ok(np.bincount(x, minlength=30)[1:30], pmf)


GIVEN_CASES: dict[str, tuple[dict[str, Any], int, float]] = {
    "nvme-tlc": ({"preset": "nvme-tlc", "lse_rate": 1e3, "silent_rate": 3e3,
                  "ecc_bits_per_kib": 4, "pe_cycles": 3700}, 65536, 24.0),
    "cxl": ({"preset": "cxl", "media_multiplier": 1e5, "controller_fit": 1e7,
             "link_ber": 3e-6, "crc_escape": 0.01}, 16384, 10.0),
    "dram-ddr4": ({"preset": "dram-ddr4", "fit_multiplier": 5e5}, 16384, 5.0),
    "dram-ddr4-chipkill": ({"preset": "dram-ddr4", "system_ecc": "chipkill",
                            "fit_multiplier": 6e6}, 16384, 1.0),
    "nvme-raw-overdispersed": (CASES["nvme-raw-overdispersed"][0], 2148, 24.0),
}


@pytest.mark.parametrize("case", sorted(GIVEN_CASES))
def test_given_error_matches_rejection(case: str) -> None:
    spec, n, h = GIVEN_CASES[case]
    m = fm.get_model(spec)
    p = m.p_any_error(n, h)
    assert 0.05 < p < 0.8, p
    want = 1500
    rng = np.random.default_rng(17)
    given = [m.sample_given_error(n, h, rng) for _ in range(want)]
    rej = _rejection(m, n, h, want, seed=18)
    assert all(not g.is_empty for g in given)

    def stats(ps: list[fm.ErrorPattern]) -> dict[str, np.ndarray]:
        return {
            "has_flips": np.array([q.n_flips > 0 for q in ps], dtype=float),
            "has_erasure": np.array([bool(q.erasures) for q in ps], dtype=float),
            "lost": np.array([q.lost for q in ps], dtype=float),
            "transient": np.array([q.transient for q in ps], dtype=float),
            "wrong": np.array([q.expected_wrong_bits() for q in ps]) / (8.0 * n),
        }

    a, b = stats(given), stats(rej)
    for key in a:
        if a[key].std() == 0 and b[key].std() == 0:
            assert a[key][0] == b[key][0], key
            continue
        assert two_sample_within(a[key], b[key]), (key, a[key].mean(), b[key].mean())


# -- the rare regime ---------------------------------------------------------------------------


def test_p_any_error_rare_regime_raw_ber() -> None:
    """Against exact decimal arithmetic: 1 - (1 - ber)^(8 n), 60 digits, no logarithms."""
    from decimal import Decimal, localcontext

    n = 1 << 20
    for ber in ("1e-27", "1e-22", "1e-15"):
        m = fm.RawBerModel(ber=float(ber))
        with localcontext() as ctx:
            ctx.prec = 60
            exact = 1 - (1 - Decimal(ber)) ** (8 * n)
        assert m.p_any_error(n, 1.0) == pytest.approx(float(exact), rel=1e-12)
    assert 1.0 - math.exp(-8 * n * 1e-27) == 0.0  # what a naive formula would return


RARE: dict[str, tuple[Any, float]] = {
    "dram-ddr4": ("dram-ddr4", 1e-13),
    "dram-ddr5": ("dram-ddr5", 1e-13),
    "cxl": ({"preset": "cxl", "link_ber": 1e-30}, 1e-13),
    "nvme-tlc": ("nvme-tlc", 1e-11),
    "nvme-raw": ({"preset": "nvme-tlc", "device_ecc": "none", "rber_fresh": 1e-30, "lse_rate": 0.0,
                  "silent_rate": 0.0}, 1.0),
    "dram-ddr4-chipkill": ({"preset": "dram-ddr4", "system_ecc": "chipkill"}, 1e-4),
}


@pytest.mark.parametrize("case", sorted(RARE))
def test_p_any_error_rare_regime_presets(case: str) -> None:
    """P(any error) at 1e-26..1e-15 against an independent estimate: the model's samplers
    with every count tilted up so that about two in three draws hit, each draw weighted by
    its exact likelihood ratio (sample_tilted), not the closed form p_any_error uses."""
    spec, h = RARE[case]
    m = fm.get_model(spec)
    n = 1 << 20
    p = m.p_any_error(n, h)
    assert 1e-26 < p < 1e-15, p
    rng = np.random.default_rng(1)
    draws = 400
    terms = np.zeros(draws)
    for i in range(draws):
        pattern, log_w = m.sample_tilted(n, h, rng, 1.0 / p)
        if not pattern.is_empty:
            terms[i] = math.exp(log_w)
    est, se = terms.mean(), terms.std(ddof=1) / math.sqrt(draws)
    assert se < 0.15 * est, (est, se)
    assert abs(est - p) <= 4 * se, (case, est, se, p)
    for _ in range(20):
        assert not m.sample_given_error(n, h, rng).is_empty
