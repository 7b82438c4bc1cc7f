"""Latent permanent faults present before the write (``latent_hours``): off by default (every
number as before: a golden file of values computed before the parameter existed), and when
set, a permanent class's exposure is residency + latent window, consistently in
`p_any_error`, `events`, `bit_error_prob`, `sample` and `sample_given_error`."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import fm_helpers  # noqa: F401  (puts the repository root first on sys.path)
import numpy as np
import pytest
from fm_helpers import mean_within

import faultmodels as fm

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
MINUTE = 1.0 / 60.0


def _close(a: Any, b: Any, where: str = "") -> None:
    if isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _close(x, y, f"{where}[{i}]")
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for k in a:
            _close(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, float):
        assert a == pytest.approx(b, rel=1e-12, abs=0.0), (where, a, b)
    else:
        assert a == b, (where, a, b)


def test_default_and_zero_latent_keep_the_golden_numbers() -> None:
    """Values computed before `latent_hours` existed: the default (0) reproduces them, and so
    does an explicit 0 (`with_latent_hours(0)`), for every preset, predict included."""
    sys.path.insert(0, str(GOLDEN))
    try:
        import make_latent_golden as g
    finally:
        sys.path.remove(str(GOLDEN))
    want = json.loads((GOLDEN / "faultmodels_latent0.json").read_text(encoding="utf-8"))
    _close(g.compute(), want)
    for key in g.MODELS:
        m = g.model(key)
        assert m.latent_hours == 0.0
        z = m.with_latent_hours(0.0)
        for h in g.HOURS:
            for n in g.SIZES:
                assert z.p_any_error(n, h) == m.p_any_error(n, h)
            assert z.bit_error_prob(h) == m.bit_error_prob(h)


def test_presets_params_are_unchanged() -> None:
    for name in ("dram-ddr4", "dram-ddr5", "cxl"):
        m = fm.get_model(name)
        assert "latent_hours" not in json.dumps(m.params())
        lat = m.with_latent_hours(1.5)
        assert lat.latent_hours == 1.5
        assert fm.get_model(lat.params()) == lat
    assert fm.get_model({"preset": "dram-ddr5", "latent_hours": 2.0}).latent_hours == 2.0
    assert fm.get_model({"preset": "cxl", "media": {"latent_hours": 2.0}}).latent_hours == 2.0


def test_models_without_latent_faults_ignore_it() -> None:
    for name in ("nvme-tlc", "raw-ber"):
        m = fm.get_model(name)
        assert m.with_latent_hours(3.0) is m and m.latent_hours == 0.0
    with pytest.raises(fm.FaultModelError):
        fm.get_model("nvme-tlc").with_latent_hours(-1.0)
    with pytest.raises(fm.FaultModelError):
        fm.get_model({"preset": "dram-ddr5", "latent_hours": -1.0})
    with pytest.raises(fm.FaultModelError):
        fm.get_model("dram-ddr5").with_latent_hours(math.inf)


@pytest.mark.parametrize("preset", ["dram-ddr4", "dram-ddr5", "cxl"])
def test_permanent_classes_see_residency_plus_latent(preset: str) -> None:
    """Class by class: a permanent class's mean grows by (h + L) / h, a transient one (and
    the CXL controller and link) stays; p_any_error follows the class means."""
    lat, n = 3.0, 196608
    m = fm.get_model(preset)
    ml = m.with_latent_hours(lat)
    for h in (MINUTE, 1.0, 24.0):
        old, new = m.events(n, h), ml.events(n, h)
        assert [e.label for e in old] == [e.label for e in new]
        grown = 0
        for a, b in zip(old, new, strict=True):
            if "permanent" in a.label:
                assert b.mean == pytest.approx(a.mean * (h + lat) / h, rel=1e-12)
                grown += 1
            elif "coincident" in a.label:
                assert b.mean > a.mean
            else:
                assert b.mean == a.mean, a.label
        assert grown >= 3
        total = math.fsum(e.mean for e in new)
        assert ml.p_any_error(n, h) == pytest.approx(-math.expm1(-total), rel=1e-12)


def test_one_minute_block_about_180x() -> None:
    """The issue's figure: faults hidden about three hours make a one-minute block's error
    probability about (1 min + 3 h) / 1 min = 181x as large, for permanent faults."""
    perm_only = {name: {"fit_transient": 0.0} for name in fm.MODE_NAMES}
    m = fm.get_model({"preset": "dram-ddr4", "modes": perm_only})
    ratio = m.with_latent_hours(3.0).p_any_error(196608, MINUTE) / m.p_any_error(196608,
                                                                                    MINUTE)
    assert ratio == pytest.approx(181.0, rel=1e-3)
    # with the presets' transient share the growth is smaller but of that order
    d5 = fm.get_model("dram-ddr5")
    r5 = d5.with_latent_hours(3.0).p_any_error(196608, MINUTE) / d5.p_any_error(196608, MINUTE)
    assert 100.0 < r5 < 181.0


def test_pairs_of_permanent_correctable_faults() -> None:
    """Coincidences: the first fault of a pair may predate the write. With permanent faults
    only, the pair integral is (h + L)^2 / 2 instead of h^2 / 2."""
    modes = {name: {"fit_transient": 0.0, "fit_permanent": 0.0} for name in fm.MODE_NAMES}
    modes["single-bit"] = {"fit_transient": 0.0, "fit_permanent": 18.6}
    m = fm.get_model({"preset": "dram-ddr4", "modes": modes})
    lat, h = 2.0, 0.5
    a = m.events(16384, h)[-1].mean
    b = m.with_latent_hours(lat).events(16384, h)[-1].mean
    assert b / a == pytest.approx((h + lat) ** 2 / h ** 2, rel=1e-12)


def test_accelerate_keeps_the_latent_window() -> None:
    base = fm.get_model("dram-ddr5").with_latent_hours(3.0)
    acc = fm.accelerate(base, 10.0)
    assert acc.latent_hours == 3.0
    n, h = 196608, MINUTE
    assert (math.fsum(e.mean for e in acc.events(n, h))
            == pytest.approx(10.0 * math.fsum(e.mean for e in base.events(n, h)), rel=1e-12))
    again = fm.accelerate("dram-ddr5", 10.0).with_latent_hours(3.0)
    assert again == acc and again.p_any_error(n, h) == acc.p_any_error(n, h)
    assert fm.get_model(acc.params()) == acc


def _wilson(k: int, n: int, z: float) -> tuple[float, float]:
    p = k / n
    den = 1.0 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return mid - half, mid + half


# accelerated configurations where the latent window dominates the residency
MC_CASES: dict[str, tuple[dict[str, Any], int, float, float]] = {
    "dram-ddr4": ({"preset": "dram-ddr4", "fit_multiplier": 2e6}, 16384, 0.25, 3.0),
    "dram-ddr4-none": ({"preset": "dram-ddr4", "system_ecc": "none", "fit_multiplier": 2e6},
                       16384, 0.25, 3.0),
    # corrected single-bit and column faults: only their coincidences reach the reader
    "dram-pairs": ({"preset": "dram-ddr4", "fit_multiplier": 3e10,
                    "modes": {name: {"fit_transient": fit[0], "fit_permanent": fit[1]}
                              for name, fit in (
                                  (nm, fm.SC12_FIT[nm] if nm in ("single-bit", "single-column")
                                   else (0.0, 0.0)) for nm in fm.MODE_NAMES)}},
                   16384, 0.05, 0.1),
    "cxl": ({"preset": "cxl", "media_multiplier": 1e6}, 16384, 0.25, 3.0),
}


@pytest.mark.parametrize("case", sorted(MC_CASES))
def test_sample_frequency_matches_p_any_error_with_latent_faults(case: str) -> None:
    """Two-sided: the fraction of non-empty `sample` draws lies in the Wilson interval
    (z = 4.5) around p_any_error of the model with latent faults, not around the one
    without; the mean wrong-bit fraction matches bit_error_prob."""
    spec, n, h, lat = MC_CASES[case]
    m = fm.get_model(spec).with_latent_hours(lat)
    p, p0 = m.p_any_error(n, h), fm.get_model(spec).p_any_error(n, h)
    assert 0.05 < p < 0.9 and p > 1.5 * p0, (p, p0)
    trials = 4000
    rng = np.random.default_rng(20261201)
    pats = [m.sample(n, h, rng) for _ in range(trials)]
    k = sum(not q.is_empty for q in pats)
    lo, hi = _wilson(k, trials, 4.5)
    assert lo <= p <= hi, (k / trials, p)
    assert not lo <= p0 <= hi, (k / trials, p0)
    wrong = np.array([q.expected_wrong_bits() for q in pats]) / (8.0 * n)
    assert mean_within(wrong, m.bit_error_prob(h), rel=0.05), (wrong.mean(),
                                                               m.bit_error_prob(h))


def test_sample_given_error_with_latent_faults_is_never_empty_and_mixes_classes() -> None:
    spec, n, h, lat = MC_CASES["dram-ddr4"]
    m = fm.get_model(spec).with_latent_hours(lat)
    rng = np.random.default_rng(3)
    pats = [m.sample_given_error(n, h, rng) for _ in range(300)]
    assert all(not q.is_empty for q in pats)
    # the exact conditional: P(at least one erasure | error) matches the unconditional draws
    un = [q for q in (m.sample(n, h, np.random.default_rng(4 + i)) for i in range(1500))
          if not q.is_empty]
    a = np.array([bool(q.erasures) for q in pats], dtype=float)
    b = np.array([bool(q.erasures) for q in un], dtype=float)
    assert abs(a.mean() - b.mean()) <= 5 * math.sqrt(
        a.var() / a.size + b.var() / b.size) + 0.02
