"""Model-specific checks: DRAM geometry and ECC, NAND RBER and ECC, CXL link and controller."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from fm_helpers import modes_only, run_mc

import faultmodels as fm
from faultmodels import _dram_geom as dram_mod

# -- DRAM: counting formulas against brute force -----------------------------------------------


def _positions(o: int, count: int, stride: int) -> set[int]:
    return {o + k * stride for k in range(count)}


@pytest.mark.parametrize(("n", "count", "stride"),
                         [(10, 1, 1), (10, 4, 1), (10, 30, 1), (10, 3, 4), (10, 3, 12),
                          (7, 5, 7), (3, 6, 2)])
def test_hits_formula(n: int, count: int, stride: int) -> None:
    lo = -(count - 1) * stride - n - 2
    brute = sum(1 for o in range(lo, n + 2)
                if any(0 <= p < n for p in _positions(o, count, stride)))
    assert dram_mod._hits(n, count, stride) == brute


PAIR_CASES = [
    (12, 1, 1, 1, 1), (12, 5, 1, 3, 1), (12, 20, 1, 4, 1), (12, 3, 1, 4, 5), (12, 6, 1, 3, 20),
    (12, 4, 5, 3, 5), (12, 3, 20, 2, 20), (9, 7, 1, 5, 2), (5, 30, 1, 4, 3),
]


@pytest.mark.parametrize(("n", "ai", "si", "aj", "sj"), PAIR_CASES)
def test_pairs_formula_is_exact(n: int, ai: int, si: int, aj: int, sj: int) -> None:
    span = (max(ai, aj) + 2) * max(si, sj) + n + 2
    brute = 0
    for oi, oj in itertools.product(range(-span, n + 1), repeat=2):
        common = _positions(oi, ai, si) & _positions(oj, aj, sj)
        brute += any(0 <= w < n for w in common)
    assert dram_mod._pairs(n, ai, si, aj, sj) == pytest.approx(brute)


def test_pairs_union_bound_for_two_lattices() -> None:
    n, ai, si, aj, sj = 12, 4, 3, 3, 5
    span = 40
    brute = 0
    for oi, oj in itertools.product(range(-span, n + 1), repeat=2):
        common = _positions(oi, ai, si) & _positions(oj, aj, sj)
        brute += any(0 <= w < n for w in common)
    assert brute <= dram_mod._pairs(n, ai, si, aj, sj) <= 2 * brute


@pytest.mark.parametrize(("h", "tau"), [(1.0, 3.0), (3.0, 3.0), (10.0, 3.0), (5.0, math.inf)])
def test_persistence_integral(h: float, tau: float) -> None:
    g = 400
    t = (np.arange(g) + 0.5) * h / g
    ta, tb = np.meshgrid(t, t, indexing="ij")
    dt = tb - ta
    surv = np.where(dt > 0, np.clip(1 - dt / tau, 0, 1) if math.isfinite(tau) else 1.0, 0.0)
    num = float(surv.sum()) * (h / g) ** 2
    assert dram_mod._persist_integral(h, tau) == pytest.approx(num, rel=0.01)


# -- DRAM: geometry and ECC ---------------------------------------------------------------------


def test_ddr4_and_ddr5_resolved_geometry() -> None:
    d4 = fm.get_model("dram-ddr4")
    assert isinstance(d4, fm.DramModel)
    g = d4.resolved_modes()
    assert d4.rank_bytes == 8 << 30 and d4.bank_bytes == 512 << 20
    assert g["single-row"]["span_bytes"] == 8192 and g["single-row"]["bits_per_word"] == 4
    assert g["single-column"]["stride_bytes"] == 8192 and g["single-column"]["count"] == 65536
    assert g["multi-rank"]["span_bytes"] == 16 << 30
    d5 = fm.get_model("dram-ddr5")
    assert isinstance(d5, fm.DramModel)
    assert d5.rank_bytes == 8 << 30 and d5.resolved_modes()["single-row"]["span_bytes"] == 4096


def test_row_event_mean_follows_the_stated_formula() -> None:
    m = fm.get_model({"preset": "dram-ddr4", "system_ecc": "none",
                      "modes": modes_only({"single-row": (0.0, 8.2)})})
    n, h = 100_000, 1000.0
    (ev,) = m.events(n, h)
    assert ev.kind == "row" and not ev.detected
    assert ev.mean == pytest.approx(8.2e-9 * h * (n + 8192 - 8) / (1 << 30), rel=1e-12)


def _one_event(spec: dict[str, object], n: int, seed: int = 0) -> fm.ErrorPattern:
    m = fm.get_model(spec)
    return m.sample_given_error(n, 1.0, np.random.default_rng(seed))  # ~1 event: rates tiny


@pytest.mark.parametrize("width", [8, 4])
def test_row_fault_corrupts_one_device_lane(width: int) -> None:
    spec = {"preset": "dram-ddr4", "system_ecc": "none", "device_width": width,
            "modes": modes_only({"single-row": (0.0, 8.2)})}
    for seed in range(5):
        p = _one_event(spec, 1 << 16, seed)
        byte, bit = p.flips >> 3, p.flips & 7
        ub = np.unique(byte)
        assert np.all(np.diff(ub) == 8)  # one lane byte per 64-bit word
        assert len(set((ub % 8).tolist())) == 1
        assert ub.size <= 8192 // 8
        per_byte = np.bincount(np.searchsorted(ub, byte))
        assert np.all(per_byte == width // 2)
        bits = {tuple(sorted(bit[byte == b].tolist())) for b in ub}
        assert len(bits) == 1  # the same DQs in every word
        if width == 4:
            (b0,) = bits
            assert len({x // 4 for x in b0}) == 1  # inside one nibble


def test_column_fault_is_strided_by_rows() -> None:
    spec = {"preset": "dram-ddr4", "system_ecc": "none",
            "modes": modes_only({"single-column": (0.0, 5.6)})}
    p = _one_event(spec, 1 << 16, 3)
    ub = np.unique(p.flips >> 3)
    assert ub.size >= 7 and np.all(np.diff(ub) == 8192)


def test_secded_turns_multibit_faults_into_poisoned_lines() -> None:
    m = fm.get_model({"preset": "dram-ddr4", "fit_multiplier": 1e6})
    r = run_mc(m, 10_000, 5.0, 300, seed=2, keep=True)
    assert r.nonempty > 30
    for p in r.patterns:
        assert p.n_flips == 0
        for s, ln, kind in p.erasures:
            assert kind == "poison" and s % 64 == 0 and (ln % 64 == 0 or s + ln == 10_000)
    assert all(e.detected for e in m.events(10_000, 5.0))


def test_which_modes_escape_each_ecc() -> None:
    def kinds(spec: dict[str, object]) -> list[tuple[str, bool]]:
        return sorted({(e.kind, e.detected) for e in fm.get_model(spec).events(4096, 1.0)})

    assert kinds({"preset": "dram-ddr4", "system_ecc": "none"}) == [
        ("bank", False), ("bit", False), ("column", False), ("row", False), ("word", False)]
    assert kinds({"preset": "dram-ddr4"}) == [  # SEC-DED; bit + column only via coincidences
        ("bank", True), ("poison", True), ("row", True), ("word", True)]
    assert kinds({"preset": "dram-ddr4", "system_ecc": "chipkill"}) == [("poison", True)]
    # DDR5 on-die ECC removes single-bit and single-column faults before the host sees them
    assert kinds({"preset": "dram-ddr5", "system_ecc": "none"}) == [
        ("bank", False), ("row", False), ("word", False)]
    labels = [e.label for e in fm.get_model("dram-ddr5").events(4096, 1.0)]
    assert not any("coincident" in x for x in labels)


def test_scrubbing_reduces_coincidences() -> None:
    base = {"preset": "dram-ddr4", "modes": modes_only({"single-bit": (14.2, 0.0)})}
    h = 100.0
    scrub = fm.get_model({**base, "scrub_hours": 3.0}).p_any_error(1 << 20, h)
    never = fm.get_model({**base, "scrub_hours": 0.0}).p_any_error(1 << 20, h)
    assert 0.0 < scrub < never / 10


def test_fit_multiplier_scales_linearly_and_quadratically() -> None:
    n, h = 1 << 20, 10.0
    a = fm.get_model({"preset": "dram-ddr4", "system_ecc": "none"})
    b = fm.get_model({"preset": "dram-ddr4", "system_ecc": "none", "fit_multiplier": 3.0})
    assert sum(e.mean for e in b.events(n, h)) == pytest.approx(
        3 * sum(e.mean for e in a.events(n, h)), rel=1e-12)
    c = fm.get_model({"preset": "dram-ddr4", "system_ecc": "chipkill"})
    d = fm.get_model({"preset": "dram-ddr4", "system_ecc": "chipkill", "fit_multiplier": 3.0})
    assert d.events(n, h)[0].mean == pytest.approx(9 * c.events(n, h)[0].mean, rel=1e-12)


# -- NAND ----------------------------------------------------------------------------------------


def test_rber_temperature_and_wear_ordering() -> None:
    """Arrhenius at 40 C vs 30 C with Ea = 1.1 eV: exp(1.1 / k_B (1/303.15 - 1/313.15)) = 3.84
    (JESD218 practice); hotter and more worn flash has more raw errors."""
    m = fm.get_model("nvme-tlc")
    assert isinstance(m, fm.NandModel)
    assert m.rber(0.0) == 0.0
    hot = fm.NandModel(temperature_c=40.0)
    assert hot.acceleration == pytest.approx(3.84, rel=0.01)
    assert hot.rber(24.0) > m.rber(24.0)
    assert fm.NandModel(pe_cycles=100).rber(24.0) < m.rber(24.0)


def test_bch_capability_and_uber() -> None:
    m = fm.NandModel()
    assert m.ecc_correctable_bits == 40 and m.ecc_codeword_bits == 8192 + 14 * 40
    # UBER = P(codeword fails) / data bits; crosses 1e-16 near RBER 1.2e-3 (binomial errors)
    from faultmodels._dist import binom_tail

    def uber(r: float) -> float:
        return binom_tail(m.ecc_codeword_bits, r, 40) / 8192

    assert uber(1.0e-3) < 1e-16 < uber(1.5e-3)
    # below the correction limit an overdispersed channel fails far more often
    od = fm.NandModel(overdispersion=0.001)
    assert od.p_codeword_fail(8766.0) > 1e6 * m.p_codeword_fail(8766.0) > 0.0


def test_ecc_failures_are_whole_detected_sectors() -> None:
    m = fm.get_model({"preset": "nvme-tlc", "ecc_bits_per_kib": 4, "pe_cycles": 4800,
                      "lse_rate": 0.0, "silent_rate": 0.0, "ecc_miscorrection": 0.0})
    r = run_mc(m, 10_000, 24.0, 200, seed=4, keep=True)
    assert r.nonempty > 20
    for p in r.patterns:
        assert p.n_flips == 0
        for s, ln, kind in p.erasures:
            assert kind == "sector" and s % 4096 == 0 and (ln % 4096 == 0 or s + ln == 10_000)


def test_latent_sector_errors_cluster() -> None:
    m = fm.get_model({"preset": "nvme-tlc", "lse_rate": 1e4, "silent_rate": 0.0,
                      "cluster_bytes": 8 * 4096, "drive_bytes": 10**12})
    n = 64 * 4096
    rng = np.random.default_rng(9)
    sizes = []
    for _ in range(400):
        p = m.sample_given_error(n, 1.0, rng)
        sizes.append(p.n_erased_bytes // 4096)
    # about half of the episodes bring at least one neighbour within 8 sectors
    frac_multi = np.mean(np.array(sizes) >= 2)
    assert 0.3 < frac_multi < 0.7


def test_silent_corruption_is_undetected_garbage() -> None:
    m = fm.get_model({"preset": "nvme-tlc", "lse_rate": 0.0, "silent_rate": 1e4})
    rng = np.random.default_rng(2)
    for _ in range(20):
        p = m.sample_given_error(1 << 16, 1.0, rng)
        assert not p.erasures and p.n_flips > 1000
        blocks = np.unique(p.flips >> 15)  # 4096-byte blocks
        assert np.all(np.diff(blocks) == 1)  # runs of adjacent blocks
    assert all(not e.detected for e in m.events(1 << 16, 1.0) if e.kind == "silent")


def test_overdispersion_widens_the_flip_count() -> None:
    spec = {"preset": "nvme-tlc", "device_ecc": "none", "lse_rate": 0.0, "silent_rate": 0.0,
            "pe_cycles": 9100}
    n, h = 8 * 1024, 24.0
    plain = run_mc(fm.get_model(spec), n, h, 800, seed=1)
    od = run_mc(fm.get_model({**spec, "overdispersion": 0.01}), n, h, 800, seed=1)
    p = fm.get_model(spec).rber(h)  # type: ignore[attr-defined]
    assert plain.n_flips.mean() == pytest.approx(8 * n * p, rel=0.1)
    assert od.n_flips.mean() == pytest.approx(8 * n * p, rel=0.3)
    assert od.n_flips.var() > 3 * plain.n_flips.var()


# -- CXL -----------------------------------------------------------------------------------------


def test_link_escape_probability() -> None:
    m = fm.get_model("cxl")
    assert isinstance(m, fm.CxlModel)
    assert m.p_flit_escape() == pytest.approx(528e-12 * 2.0**-16, rel=1e-6)
    (link,) = [e for e in m.events(1 << 20, 1.0) if e.kind == "link"]
    assert link.transient and not link.detected
    assert link.mean == pytest.approx((1 << 14) * m.p_flit_escape(), rel=1e-9)
    assert m.events(1 << 20, 1.0)[-1].mean == m.events(1 << 20, 1000.0)[-1].mean  # per read


def test_link_errors_are_transient_bursts_inside_one_flit() -> None:
    m = fm.get_model({"preset": "cxl", "media_multiplier": 0.0, "controller_fit": 0.0,
                      "link_ber": 1e-4, "crc_escape": 1.0})
    rng = np.random.default_rng(0)
    for _ in range(50):
        p = m.sample(4096, 1.0, rng)
        if p.is_empty:
            continue
        assert p.transient and not p.erasures and not p.lost
        flits = p.flips // 512
        for f in np.unique(flits):
            b = p.flips[flits == f]
            assert b.size >= 2 or (b.size == 1 and m.link_burst_bits == 1)
            assert b[-1] - b[0] == 31  # burst of 32 bits: first and last bits wrong


def test_media_multiplier_and_poison() -> None:
    n, h = 1 << 20, 100.0
    a = fm.get_model({"preset": "cxl", "controller_fit": 0.0, "link_ber": 0.0})
    b = fm.get_model({"preset": "cxl", "controller_fit": 0.0, "link_ber": 0.0,
                      "media_multiplier": 4.0})
    ma = sum(e.mean for e in a.events(n, h) if e.kind not in ("region", "link"))
    mb = sum(e.mean for e in b.events(n, h) if e.kind not in ("region", "link"))
    assert mb == pytest.approx(4 * ma, rel=1e-12)
    p = b.sample_given_error(n, h, np.random.default_rng(1))
    assert p.erasures and all(k == "poison" and s % 64 == 0 for s, _, k in p.erasures)
    lost = fm.get_model({"preset": "cxl", "controller_fit": 1e9, "media_multiplier": 0.0,
                         "link_ber": 0.0})
    q = lost.sample_given_error(4096, 1.0, np.random.default_rng(0))
    assert q.lost and q.expected_wrong_bits() == 4 * 4096
