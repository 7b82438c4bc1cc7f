"""Presets, registry, round trips, validation, determinism, isolation and speed."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fm_helpers import REPO_ROOT
from hypothesis import given, settings
from hypothesis import strategies as st

import faultmodels as fm
from faultmodels import FaultModelError

PRESETS = ["cxl", "dram-ddr4", "dram-ddr4-high", "dram-ddr4-low", "dram-ddr5", "nvme-tlc",
           "raw-ber"]

# inflated versions of each preset, so that errors happen in a few draws
INFLATED: dict[str, dict[str, Any]] = {
    "raw-ber": {"preset": "raw-ber", "ber": 1e-3},
    "dram-ddr4": {"preset": "dram-ddr4", "fit_multiplier": 1e6},
    "dram-ddr4-low": {"preset": "dram-ddr4-low", "fit_multiplier": 3e6},
    "dram-ddr4-high": {"preset": "dram-ddr4-high", "fit_multiplier": 1e5},
    "dram-ddr5": {"preset": "dram-ddr5", "fit_multiplier": 1e6, "system_ecc": "none"},
    "cxl": {"preset": "cxl", "media_multiplier": 1e6, "controller_fit": 1e7,
            "link_ber": 1e-4, "crc_escape": 0.1},
    "nvme-tlc": {"preset": "nvme-tlc", "lse_rate": 100.0, "silent_rate": 100.0},
}


def test_list_presets_and_models() -> None:
    assert fm.list_presets() == PRESETS
    assert fm.model_names() == ["accelerated", "cxl", "dram", "nand", "raw-ber"]
    kinds = {"cxl": fm.CxlModel, "dram-ddr4": fm.DramModel, "dram-ddr5": fm.DramModel,
             "dram-ddr4-low": fm.DramModel, "dram-ddr4-high": fm.DramModel,
             "nvme-tlc": fm.NandModel, "raw-ber": fm.RawBerModel}
    for name in PRESETS:
        d = fm.load_preset(name)
        assert d["source"], name  # every preset cites its sources
        m = fm.get_model(name)
        assert isinstance(m, kinds[name])
        assert m.params()["model"] == m.name
        assert fm.get_model(m) is m


def test_preset_files_carry_a_comment_block_with_sources() -> None:
    pdir = REPO_ROOT / "faultmodels" / "presets"
    for name in PRESETS:
        text = (pdir / f"{name}.toml").read_text()
        assert text.startswith("# rkv faultmodels preset: " + name)
        assert "Source" in text or "secondary" in text or "synthetic" in text


@pytest.mark.parametrize("name", PRESETS)
def test_dict_and_toml_round_trips(name: str, tmp_path: Path) -> None:
    for spec in (name, INFLATED[name]):
        m = fm.get_model(spec)
        assert fm.get_model(m.params()) == m
        assert type(m).from_params(m.to_dict()) == m
        assert fm.get_model(tomllib.loads(m.to_toml())) == m
        path = tmp_path / f"{name}.toml"
        fm.dump(m, path)
        assert fm.load(path) == m
        assert fm.get_model(str(path)) == m


def test_preset_overrides_merge() -> None:
    m = fm.get_model({"preset": "nvme-tlc", "pe_cycles": 1000})
    assert isinstance(m, fm.NandModel) and m.pe_cycles == 1000.0
    assert m.device_ecc == "bch"
    d = fm.get_model({"preset": "dram-ddr4", "modes": {"single-row": {"fit_permanent": 20}}})
    assert isinstance(d, fm.DramModel)
    assert d.mode("single-row").fit_permanent == 20.0
    assert d.mode("single-row").fit_transient == 0.2
    assert d.mode("single-bank").fit_permanent == 10.0
    c = fm.get_model({"preset": "cxl", "media": {"system_ecc": "chipkill"}})
    assert isinstance(c, fm.CxlModel)
    assert c.media.system_ecc == "chipkill" and c.media.bus_bits == 32
    c2 = fm.get_model({"model": "cxl", "media": "dram-ddr4"})
    assert isinstance(c2, fm.CxlModel) and c2.media == fm.get_model("dram-ddr4")
    c3 = fm.get_model({"model": "cxl", "media": {"on_die_ecc": False}})
    assert isinstance(c3, fm.CxlModel) and c3.media.bus_bits == 32
    assert fm.get_model({"model": "raw-ber", "ber": 1e-6}) == fm.RawBerModel(ber=1e-6)
    assert fm.get_model({"model": "dram"}) == fm.DramModel()
    # a copied preset with a "preset" key
    assert fm.get_model({"preset": "raw-ber"}) == fm.get_model("raw-ber")


def test_cxl_media_must_name_a_dram_model() -> None:
    for media in ("nvme-tlc", {"model": "raw-ber"}, {"model": "nope"}, {"preset": "cxl"}):
        with pytest.raises(FaultModelError, match=r"cxl\.media must describe a dram model"):
            fm.CxlModel.from_params({"model": "cxl", "media": media})


def test_accelerated_from_params_builds_its_base() -> None:
    m = fm.accelerate({"preset": "cxl", "media": "dram-ddr4"}, 10.0)
    assert type(m).from_params(m.to_dict()) == m
    two = fm.AcceleratedModel.from_params({"base": "nvme-tlc", "ber_multiplier": 2})
    assert two == fm.accelerate("nvme-tlc", 2)


def test_load_with_preset_key(tmp_path: Path) -> None:
    p = tmp_path / "mine.toml"
    p.write_text('preset = "nvme-tlc"\ntemperature_c = 55.0\n')
    m = fm.load(p)
    assert isinstance(m, fm.NandModel) and m.temperature_c == 55.0


BAD_SPECS: list[Any] = [
    "no-such-preset",
    {"model": "no-such-model"},
    {"ber": 1e-3},
    {"model": "raw-ber", "ber": 2.0},
    {"model": "raw-ber", "ber": -1e-9},
    {"model": "raw-ber", "ber": "1e-6"},
    {"model": "raw-ber", "ber": math.nan},
    {"model": "raw-ber", "per_hour": 1},
    {"model": "raw-ber", "bogus": 1},
    {"preset": "dram-ddr4", "device_width": 16},
    {"preset": "dram-ddr4", "device_width": True},
    {"preset": "dram-ddr4", "bus_bits": 72},
    {"preset": "dram-ddr4", "system_ecc": "raid"},
    {"preset": "dram-ddr4", "fit_multiplier": -1},
    {"preset": "dram-ddr4", "scrub_hours": math.inf},
    {"preset": "dram-ddr4", "modes": {"single-flip": {"fit_transient": 1}}},
    {"preset": "dram-ddr4", "modes": {"single-row": {"fit_permanent": -3}}},
    {"preset": "dram-ddr4", "modes": {"single-row": {"colour": 1}}},
    {"preset": "dram-ddr4", "modes": {"single-row": {"bits_per_word": 9}}},
    {"preset": "dram-ddr4", "modes": {"single-row": {"span_bytes": 12}}},
    {"preset": "dram-ddr4", "modes": {"single-row": 3}},
    {"preset": "dram-ddr4", "row_bytes": 12},
    {"preset": "dram-ddr4", "banks": 1 << 21},
    {"preset": "cxl", "media": {"model": "raw-ber"}},
    {"preset": "cxl", "media": 3},
    {"preset": "cxl", "link_ber": 0.7},
    {"preset": "cxl", "flit_payload_bytes": 100},
    {"preset": "cxl", "link_burst_bits": 0},
    {"preset": "nvme-tlc", "pe_cycles": -5},
    {"preset": "nvme-tlc", "device_ecc": "reed-solomon"},
    {"preset": "nvme-tlc", "overdispersion": 1.0},
    {"preset": "nvme-tlc", "cluster_p": 1.0},
    {"preset": "nvme-tlc", "ecc_bits_per_kib": 0},
    {"preset": "nvme-tlc", "sector_bytes": 1000},
    {"preset": "nvme-tlc", "silent_run_mean": 0.5},
    {"preset": "nvme-tlc", "temperature_c": -300},
    {"preset": "nvme-tlc", "ecc_codeword_bytes": 1.5},
    {"preset": "nvme-tlc", "model": "dram"},
    [1, 2, 3],
]


@pytest.mark.parametrize("spec", BAD_SPECS, ids=[str(i) for i in range(len(BAD_SPECS))])
def test_bad_params_raise_fault_model_error(spec: Any) -> None:
    with pytest.raises(FaultModelError) as e:
        fm.get_model(spec)
    assert isinstance(e.value, ValueError) and str(e.value)


def test_bad_call_arguments() -> None:
    m = fm.get_model("raw-ber")
    rng = np.random.default_rng(0)
    for bad in (-1, 1.5, True, "8"):
        with pytest.raises(FaultModelError):
            m.p_any_error(bad, 1.0)  # type: ignore[arg-type]
    for bad_h in (-1.0, math.inf, math.nan, "1"):
        with pytest.raises(FaultModelError):
            m.sample(8, bad_h, rng)  # type: ignore[arg-type]
    with pytest.raises(FaultModelError):
        fm.get_model("dram-ddr4").sample_given_error(4096, 0.0, rng)  # nothing can happen
    assert fm.get_model("dram-ddr4").p_any_error(4096, 0.0) == 0.0
    assert m.sample(0, 1.0, rng).is_empty and m.p_any_error(0, 1.0) == 0.0
    with pytest.raises(FaultModelError):
        fm.load("/nonexistent/model.toml")
    with pytest.raises(FaultModelError):
        fm.EventRate("cosmic", 1.0, 1, 1.0)


@pytest.mark.parametrize("name", PRESETS)
def test_same_seed_same_pattern(name: str) -> None:
    m = fm.get_model(INFLATED[name])
    n, h = 16384, 24.0
    for seed in range(5):
        a = m.sample(n, h, np.random.default_rng(seed))
        b = m.sample(n, h, np.random.default_rng(seed))
        assert a == b
        c = m.sample_given_error(n, h, np.random.default_rng(seed))
        d = m.sample_given_error(n, h, np.random.default_rng(seed))
        assert c == d and not c.is_empty
    # a fresh but equal model gives the same draws (no hidden state)
    m2 = fm.get_model(m.params())
    assert m2.sample(n, h, np.random.default_rng(9)) == m.sample(n, h, np.random.default_rng(9))


@pytest.mark.parametrize("name", PRESETS)
def test_events_are_well_formed(name: str) -> None:
    m = fm.get_model(name)
    for n, h in ((1, 1.0), (4096, 24.0), (1 << 20, 8766.0)):
        evs = m.events(n, h)
        assert evs
        for e in evs:
            assert e.kind in fm.EVENT_KINDS
            assert e.mean >= 0.0 and e.bits_per_event >= 0.0 and e.footprint_bytes >= 1
        p = m.p_any_error(n, h)
        assert 0.0 <= p <= 1.0
        total = math.fsum(e.mean for e in evs)
        assert p <= total * (1 + 1e-9) + 1e-300
        assert 0.0 <= m.bit_error_prob(h) <= 0.5


@settings(max_examples=40, deadline=None)
@given(ber=st.floats(0.0, 1.0), per_hour=st.booleans(),
       pe=st.floats(0.0, 1e5), temp=st.floats(-40.0, 120.0), rho=st.floats(0.0, 0.9))
def test_round_trip_property(ber: float, per_hour: bool, pe: float, temp: float,
                             rho: float) -> None:
    r = fm.RawBerModel(ber=ber, per_hour=per_hour)
    assert fm.get_model(tomllib.loads(r.to_toml())) == r
    n = fm.get_model({"preset": "nvme-tlc", "pe_cycles": pe, "temperature_c": temp,
                      "overdispersion": rho})
    assert fm.get_model(tomllib.loads(n.to_toml())) == n


def test_faultmodels_never_imports_rkv() -> None:
    code = (
        "import sys, numpy as np\n"
        "import faultmodels as fm\n"
        "rng = np.random.default_rng(0)\n"
        "for p in fm.list_presets():\n"
        "    m = fm.get_model(p)\n"
        "    m.sample(4096, 24.0, rng); m.sample_given_error(4096, 24.0, rng)\n"
        "    m.to_toml(); m.bit_error_prob(1.0)\n"
        "bad = sorted(k for k in sys.modules if k == 'rkv' or k.startswith('rkv.'))\n"
        "assert not bad, bad\n"
        "std = set(sys.stdlib_module_names)\n"
        "other = sorted({k.split('.')[0] for k in sys.modules} - std\n"
        "               - {'numpy', 'faultmodels', 'tomli_w', '__main__', '_distutils_hack',\n"
        "                  'cython_runtime', '__editable___rkv_0_1_0_finder'})\n"
        "assert not [o for o in other if not o.startswith('_')], other\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    res = subprocess.run([sys.executable, "-c", code], cwd=str(REPO_ROOT), env=env,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("name", PRESETS)
def test_sampling_cost_does_not_scale_with_buffer_size(name: str) -> None:
    """No work proportional to the buffer: drawing for 1 GiB allocates no more than for 1 MiB
    (measured as peak traced memory, deterministic, instead of wall-clock time)."""
    import tracemalloc

    m = fm.get_model(name)
    rng = np.random.default_rng(0)
    peaks = []
    for n in (1 << 20, 1 << 30):
        m.sample(n, 24.0, rng)  # builds and caches the event classes
        tracemalloc.start()
        for i in range(20):
            m.sample(n, 24.0, rng)
            m.sample(n, 1.0 + i, rng)  # a new residency: classes are rebuilt
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    assert peaks[1] < 4 * peaks[0] + (256 << 10), (name, peaks)
