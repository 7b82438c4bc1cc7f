"""ECC beyond its capability (Hsiao SEC-DED, BCH miscorrection) and the NAND field presets,
each against an independent estimate: a brute-force encoder/decoder, the sampler, a
Monte Carlo fleet of drives, or the published numbers."""

from __future__ import annotations

import math

import numpy as np
import pytest
from fm_helpers import binom_within, mean_within, modes_only, run_mc

import faultmodels as fm
from faultmodels import nand_field, wordecc

# -- Hsiao SEC-DED: the enumerated fractions against a brute-force code ------------------------


def _h_matrix(k: int, r: int) -> np.ndarray:
    """The full 0/1 parity-check matrix [data columns | identity], r x (k + r)."""
    cols = wordecc.hsiao_columns(k, r)
    data = np.array([[(c >> i) & 1 for c in cols] for i in range(r)], dtype=np.int64)
    return np.concatenate([data, np.eye(r, dtype=np.int64)], axis=1)


@pytest.mark.parametrize(("k", "r"), [(64, 8), (32, 8)])
def test_hsiao_code_properties(k: int, r: int) -> None:
    h = _h_matrix(k, r)
    cols = [tuple(h[:, j]) for j in range(k + r)]
    assert len(set(cols)) == k + r and all(sum(c) % 2 == 1 for c in cols)
    assert len(set(h.sum(axis=1).tolist())) == 1  # equal row weights (Hsiao's criterion)


@pytest.mark.parametrize(("bus", "width", "weight"),
                         [(64, 8, 3), (64, 8, 4), (64, 8, 5), (64, 4, 3), (32, 8, 3), (64, 8, 2)])
def test_lane_fractions_against_a_brute_force_decoder(bus: int, width: int, weight: int) -> None:
    """Encode random words with the generator, flip `weight` random bits of one device lane,
    decode with a plain syndrome decoder (matrix products mod 2, search over all columns),
    count silent outcomes per byte lane; compare with the exact enumeration two-sided."""
    r = wordecc.CHECK_BITS[bus]
    h = _h_matrix(bus, r)
    rng = np.random.default_rng(bus * 100 + width * 10 + weight)
    trials = 6000
    data = rng.integers(0, 2, size=(trials, bus))
    code = np.concatenate([data, (data @ h[:, :bus].T) % 2], axis=1)  # systematic encoder
    lane = rng.integers(0, bus // 8, size=trials)
    nib = rng.integers(0, 2, size=trials) if width == 4 else np.zeros(trials, np.int64)
    keys = rng.random((trials, width)).argsort(axis=1)[:, :weight]
    pos = 8 * lane[:, None] + 4 * nib[:, None] + keys
    recv = code.copy()
    np.put_along_axis(recv, pos, 1 - np.take_along_axis(recv, pos, axis=1), axis=1)
    syn = (recv @ h.T) % 2
    match = np.all(syn[:, :, None] == h[None, :, :], axis=1)  # (trials, n): syndrome == col
    fixed = recv.copy()
    hit = match.any(axis=1)
    fixed[hit, match[hit].argmax(axis=1)] ^= 1
    detected = syn.any(axis=1) & ~hit
    silent = ~detected & np.any(fixed[:, :bus] != data, axis=1)
    lo = wordecc.lane_outcomes(bus, width, weight)
    f = lo.silent_fraction()
    for L in range(bus // 8):
        sel = lane == L
        assert binom_within(int(silent[sel].sum()), int(sel.sum()), float(f[L]), z=4.5), (
            L, silent[sel].mean(), f[L])
    if weight == 2:
        assert not silent.any() and detected.all()  # SEC-DED: every double error detected
    assert not (silent & detected).any()


def test_bch_miscorrection_near_one_over_t_factorial_for_a_full_length_code() -> None:
    """Primitive BCH, n = 2^m - 1, parity m t: V(n, t) / 2^(m t) -> 1/t! as n grows."""
    for t in (2, 3, 5):
        m = 16
        n = (1 << m) - 1
        assert wordecc.bch_miscorrection(n, t, m * t) == pytest.approx(
            1.0 / math.factorial(t), rel=0.01)


# -- DRAM: the detected / silent split, sampler against the analytic classes ---------------------


def _outcomes(ps: list[fm.ErrorPattern]) -> tuple[int, int]:
    silent = sum(1 for p in ps if p.n_flips and not p.erasures)
    det = sum(1 for p in ps if p.erasures and not p.n_flips)
    return silent, det


def test_secded_split_sampler_matches_classes() -> None:
    """Row faults with 3 wrong bits per word (odd: miscorrectable) on x8 SEC-DED: the share of
    faulty buffers that read back silently wrong vs poisoned, two-sided against the classes."""
    m = fm.get_model({"preset": "dram-ddr4", "fit_multiplier": 3e10,
                      "modes": {**modes_only({"single-row": (0.0, 8.2)}),
                                "single-row": {"fit_permanent": 8.2, "fit_transient": 0.0,
                                               "bits_per_word": 3}}})
    n, h = 16384, 1.0
    evs = m.events(n, h)
    mu_s = math.fsum(e.mean for e in evs if not e.detected)
    mu_d = math.fsum(e.mean for e in evs if e.detected)
    assert mu_s > 0 and mu_d > 0
    trials = 3000
    r = run_mc(m, n, h, trials, seed=31, keep=True)
    sil, det = _outcomes(r.patterns)
    assert binom_within(sil, trials, math.exp(-mu_d) * -math.expm1(-mu_s))
    assert binom_within(det, trials, math.exp(-mu_s) * -math.expm1(-mu_d))
    flips = [p.n_flips for p in r.patterns if p.n_flips and not p.erasures]
    (ev_s,) = [e for e in evs if not e.detected]
    assert mean_within(flips, ev_s.bits_per_event, rel=0.05)  # ~1 event when it fires
    for p in r.patterns:
        if p.n_flips:  # every silent word holds 3 or 4 wrong bits (the decoder's flip)
            per_word = np.bincount(p.flips // 64)
            assert set(per_word[per_word > 0].tolist()) <= {3, 4}
    assert mean_within(r.wrong_frac, m.bit_error_prob(h), rel=0.05)


def test_secded_default_x8_footprints_are_all_detected() -> None:
    """4 wrong bits in one byte lane never have a zero syndrome in this code (enumeration), so
    the default DDR4 preset stays all-detected (checked against the sampler)."""
    assert sum(wordecc.lane_outcomes(64, 8, 4).silent) == 0
    m = fm.get_model({"preset": "dram-ddr4", "fit_multiplier": 1e6})
    assert all(e.detected for e in m.events(10_000, 5.0))


# -- NAND: miscorrection ---------------------------------------------------------------------------


def test_nand_miscorrection_split_matches_classes() -> None:
    m = fm.get_model({"preset": "nvme-tlc", "ecc_bits_per_kib": 4, "pe_cycles": 3000,
                      "lse_rate": 0.0, "silent_rate": 0.0, "ecc_miscorrection": 0.3})
    assert isinstance(m, fm.NandModel)
    n, h = 16384, 24.0 * 30
    evs = m.events(n, h)
    mu_s = -sum(c.log_p0 for c in m.event_classes(n, h) if not c.rate.detected)
    p_d = -math.expm1(sum(c.log_p0 for c in m.event_classes(n, h) if c.rate.detected))
    assert 0.05 < p_d < 0.95 and mu_s > 0.05
    trials = 2500
    r = run_mc(m, n, h, trials, seed=41, keep=True)
    has_flips = sum(1 for p in r.patterns if p.n_flips)
    has_er = sum(1 for p in r.patterns if p.erasures)
    assert binom_within(has_flips, trials, -math.expm1(-mu_s))
    assert binom_within(has_er, trials, p_d)
    (ev,) = [e for e in evs if "miscorrection" in e.label]
    assert not ev.detected and ev.bits_per_event == 9  # 2t + 1 with t = 4
    for p in r.patterns:
        if p.n_flips:
            cw = np.bincount(p.flips // 8192)
            assert set(cw[cw > 0].tolist()) == {9}


def test_nand_miscorrection_default_is_the_sphere_ratio_and_overridable() -> None:
    m = fm.NandModel()
    assert m.miscorrection_prob < 1e-50  # t = 40: negligible
    t4 = fm.NandModel(ecc_bits_per_kib=4)
    assert 1e-4 < t4.miscorrection_prob < 1.0 / 24
    assert fm.NandModel(device_ecc="ldpc").miscorrection_prob == nand_field_ldpc()
    assert fm.NandModel(ecc_miscorrection=0.5).miscorrection_prob == 0.5


def nand_field_ldpc() -> float:
    from faultmodels.nand import LDPC_UNDETECTED

    return LDPC_UNDETECTED


# -- NAND presets: RBER fit and drive heterogeneity ------------------------------------------------


def test_rber_preset_reproduces_its_data_points() -> None:
    """Within 5 % of every fitted point (the residuals in docs/faultmodels/nvme.md are < 1 %),
    and the preset's parameters are the fit of the table rounded."""
    for _, pe, t, temp, rber in nand_field.RBER_POINTS:
        m = fm.get_model({"preset": "nvme-tlc", "pe_cycles": pe, "temperature_c": temp})
        assert m.rber(t) == pytest.approx(rber, rel=0.05), (pe, t)  # type: ignore[attr-defined]
    r0, alpha, beta = nand_field.fit_rber()
    d = fm.load_preset("nvme-tlc")
    assert d["rber_fresh"] == pytest.approx(r0, rel=0.01)
    assert d["rber_pe_exp"] == pytest.approx(alpha, abs=0.01)
    assert d["rber_time_exp"] == pytest.approx(beta, abs=0.001)


def test_wear_raises_rber_by_the_published_factor() -> None:
    """Fresh 1e-8..1e-6, rated endurance 1e-4..1e-3 (MLC/TLC characterizations): a factor in
    [1e2, 1e5]; and fresh short-retention RBER near the field medians (5.4e-9..3.2e-8,
    Schroeder et al. FAST 2016) within a factor of 3."""
    fresh = fm.get_model({"preset": "nvme-tlc", "pe_cycles": 0})
    rated = fm.get_model({"preset": "nvme-tlc", "pe_cycles": 3000})
    f24 = fresh.rber(24.0)  # type: ignore[attr-defined]
    r24 = rated.rber(24.0)  # type: ignore[attr-defined]
    assert 1e-8 <= f24 <= 1e-6 and 1e-4 * 0.5 <= r24 <= 1e-3
    assert 1e2 <= r24 / f24 <= 1e5
    assert 5.4e-9 / 3 <= fresh.rber(1.0) <= 3.2e-8 * 3  # type: ignore[attr-defined]


def test_drive_heterogeneity_matches_field_numbers_by_monte_carlo() -> None:
    """A simulated fleet: per-drive gamma multipliers (numpy's sampler), Poisson error days;
    the fraction of drives with an error in 4 years and of drive-days with one, against the
    helpers and the field ranges (Schroeder et al., FAST 2016)."""
    m = fm.get_model("nvme-tlc")
    assert isinstance(m, fm.NandModel)
    rng = np.random.default_rng(7)
    drives, days = 200_000, 4 * 365.25
    z = rng.gamma(m.drive_shape, 1.0 / m.drive_shape, size=drives)
    lam = 24.0 * m.lse_rate * z
    p_day = -np.expm1(-lam)
    ever = rng.random(drives) < -np.expm1(-lam * days)
    frac = float(ever.mean())
    assert binom_within(int(ever.sum()), drives, m.drives_with_ue(4.0))
    assert 0.20 <= frac <= 0.63
    assert mean_within(p_day, m.ue_drive_day_fraction())
    assert 2e-3 <= float(p_day.mean()) <= 6e-3
    homogeneous = fm.get_model({"preset": "nvme-tlc", "drive_shape": math.inf})
    assert homogeneous.drives_with_ue(4.0) > 0.99  # type: ignore[attr-defined]


def test_drive_quantile_against_sampled_gamma() -> None:
    rng = np.random.default_rng(3)
    k = 0.134
    z = rng.gamma(k, 1.0 / k, size=400_000)
    for q in (0.5, 0.9, 0.99):
        m = fm.get_model({"preset": "nvme-tlc", "drive": q})
        got = m.drive_multiplier  # type: ignore[attr-defined]
        emp = np.quantile(z, q)
        assert got == pytest.approx(emp, rel=0.03)
    base = fm.get_model("nvme-tlc")
    worst = fm.get_model({"preset": "nvme-tlc", "drive": 0.99})
    assert worst.p_any_error(1 << 20, 24.0) > base.p_any_error(1 << 20, 24.0)
