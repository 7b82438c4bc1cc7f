"""The scrub schedule (rkv.reliability.schedule): the refresh age is the boundary of predict's
P(DUE) (checked against a dense grid of direct predict calls), monotone in the code and the
target; scrub interval, per block-day figures, infeasible and never-needed cases; the
EngineConfig setting and ``rkv info --schedule``."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rkvtest import SMALL, local_config, random_kv

import faultmodels as fm
from rkv import ConfigError, Engine, EngineConfig
from rkv.cli import main
from rkv.reliability import schedule as sch
from rkv.reliability.analytic import predict
from rkv.store.schedule_info import human_hours

TOL = 1e-3


def upsets(ber: float) -> fm.FaultModel:
    """Bits upset at ``ber`` per bit-hour (they stay wrong): P(DUE) grows with the age as
    the code's binomial tail, fast to predict (no clustered classes)."""
    return fm.get_model({"model": "raw-ber", "ber": ber, "per_hour": True})


def direct(model: fm.FaultModel, code: str, n: int, h: float) -> float:
    return predict(code, n, model, h, exact_counts=True).p_due


@pytest.mark.parametrize(("code", "ber", "n"), [
    ("rs(255,239)", 1e-6, 16384),
    ("rs(255,223,interleave=4)", 3e-6, 65536),
    ("bch(m=13,t=8)", 1e-6, 16384),
    ("shardrs(k=8,m=2)", 1e-7, 32768),
    ("none", 1e-13, 4096),
])
def test_refresh_age_is_the_boundary_of_a_dense_grid(code: str, ber: float, n: int) -> None:
    """Differential: 400 direct predict calls on a log grid bracket the first crossing of
    the target, and the search's answer lies in that bracket; predict at the answer meets the
    target and exceeds it ``rel_tol`` later."""
    model, target = upsets(ber), 1e-9
    r = sch.refresh_age(model, code, n, target, rel_tol=TOL)
    assert 0.0 < r < math.inf
    grid = np.geomspace(1e-3, 1e7, 400)
    ps = np.array([direct(model, code, n, float(h)) for h in grid])
    assert np.all(np.diff(ps) >= -1e-12)  # predict is monotone here (up to rounding at 1)
    first = int(np.argmax(ps > target))
    assert ps[first] > target and first > 0
    assert grid[first - 1] <= r * (1 + TOL) and r <= grid[first]
    assert direct(model, code, n, r) <= target
    assert direct(model, code, n, r * (1 + TOL)) > target


@settings(max_examples=12)
@given(ber=st.floats(1e-8, 1e-5), exp=st.floats(-12.0, -4.0))
def test_a_stronger_code_never_gets_a_shorter_refresh_age(ber: float, exp: float) -> None:
    model, target = upsets(ber), 10.0 ** exp
    ages = [sch.refresh_age(model, code, 16384, target, rel_tol=TOL)
            for code in ("rs(255,247)", "rs(255,239)", "rs(255,223)")]
    for weak, strong in itertools.pairwise(ages):
        assert strong >= weak * (1 - 2 * TOL)


@settings(max_examples=12)
@given(ber=st.floats(1e-8, 1e-5), exp=st.floats(-12.0, -4.0), tighter=st.floats(1.0, 1e4))
def test_a_tighter_target_never_gets_a_longer_refresh_age(ber: float, exp: float,
                                                          tighter: float) -> None:
    model, target = upsets(ber), 10.0 ** exp
    loose = sch.refresh_age(model, "rs(255,239)", 16384, target, rel_tol=TOL)
    tight = sch.refresh_age(model, "rs(255,239)", 16384, target / tighter, rel_tol=TOL)
    assert tight <= loose * (1 + 2 * TOL)


def test_never_and_infeasible() -> None:
    # far below the target for a century: no refresh, no scrub needed
    s = sch.schedule(upsets(1e-15), "rs(255,239)", 16384, 1e-9)
    assert s.refresh_hours == math.inf and s.scrub_hours == math.inf and s.feasible
    assert s.to_dict()["refresh_hours"] is None
    json.dumps(s.to_dict())
    # a time-independent BER: above the target at age 0, and no scrub can help
    hot = fm.get_model({"model": "raw-ber", "ber": 1e-6})
    with pytest.raises(sch.InfeasibleTarget):
        sch.refresh_age(hot, "none", 4096, 1e-9)
    with pytest.raises(sch.InfeasibleTarget):
        sch.scrub_interval(hot, "none", 4096, 1e-9)
    s = sch.schedule(hot, "none", 4096, 1e-9)
    assert s.refresh_hours == 0.0 and s.scrub_hours == 0.0 and not s.feasible
    assert "age 0" in s.note
    for bad in (0.0, 1.0, -1e-9, True, "1e-9", math.nan):
        with pytest.raises(ConfigError):
            sch.check_target(bad)


def test_without_latent_faults_the_interval_is_the_refresh_age() -> None:
    """Nothing but age accumulates: the scrub must come by the refresh age, and scrubbing at
    that interval leaves at most the target per interval."""
    model = upsets(1e-6)
    s = sch.schedule(model, "rs(255,239)", 16384, 1e-9, horizon_hours=24 * 30)
    assert s.scrub_hours == s.refresh_hours
    interval = min(s.scrub_hours, s.horizon_hours)
    assert s.p_due_per_block_day_scrubbed == pytest.approx(
        sch.per_day(direct(model, "rs(255,239)", 16384, interval), interval), rel=1e-9)
    # the code's tail grows faster than linearly: scrubbing beats leaving the block alone
    assert s.p_due_per_block_day_scrubbed < s.p_due_per_block_day_unscrubbed
    assert s.p_due_per_block_day_unscrubbed == pytest.approx(
        sch.per_day(direct(model, "rs(255,239)", 16384, 720.0), 720.0), rel=1e-9)


def test_per_day() -> None:
    assert sch.per_day(0.0, 5.0) == 0.0
    assert sch.per_day(1e-12, 48.0) == pytest.approx(0.5e-12, rel=1e-9)
    assert sch.per_day(1e-12, 1.0) == pytest.approx(24e-12, rel=1e-9)
    assert sch.per_day(1.0, 3.0) == 1.0


def test_latent_faults_make_age_zero_infeasible_but_a_scrub_bounds_them() -> None:
    """DRAM with faults hidden 3 h: a fresh block already misses a tight target (the refresh
    age is infeasible); a scrub every I hours halves the window to I / 2 and meets it."""
    modes: dict[str, Any] = {name: {"fit_transient": 0.0, "fit_permanent": 0.0}
                             for name in fm.MODE_NAMES}
    modes["single-row"] = {"fit_transient": 0.2, "fit_permanent": 8.2}
    modes["single-bank"] = {"fit_transient": 0.8, "fit_permanent": 10.0}
    model = fm.accelerate(fm.get_model({"preset": "dram-ddr5", "latent_hours": 3.0,
                                        "modes": modes}), 1e3)
    n = 4096
    target = 0.5 * direct(model, "none", n, 0.0)
    with pytest.raises(sch.InfeasibleTarget):
        sch.refresh_age(model, "none", n, target)
    i = sch.scrub_interval(model, "none", n, target, rel_tol=1e-2)
    assert 0.0 < i < 6.0
    scrubbed = model.with_latent_hours(min(3.0, i / 2))
    assert direct(scrubbed, "none", n, i) <= target
    s = sch.schedule(model, "none", n, target, rel_tol=1e-2, horizon_hours=48.0)
    assert s.refresh_hours == 0.0 and "age 0" in s.note and s.scrub_hours == i
    assert s.latent_hours == 3.0 and s.feasible
    # per day: new faults every interval, the (shorter) latent window once per horizon
    fresh = model.with_latent_hours(0.0)
    want = (sch.per_day(direct(fresh, "none", n, i), i)
            + sch.per_day(direct(scrubbed, "none", n, 0.0), 48.0))
    assert s.p_due_per_block_day_scrubbed == pytest.approx(want, rel=1e-9)
    assert s.p_due_per_block_day_unscrubbed == pytest.approx(
        sch.per_day(direct(model, "none", n, 48.0), 48.0), rel=1e-9)
    assert s.p_due_per_block_day_scrubbed < s.p_due_per_block_day_unscrubbed


def test_engine_config_setting() -> None:
    assert EngineConfig().scrub_target_p_due == 1e-9
    cfg = EngineConfig(scrub_target_p_due=1e-12)
    assert EngineConfig.from_toml(cfg.to_toml()) == cfg
    for bad in (0.0, 1.0, 2.0, -1.0, True, "1e-9"):
        with pytest.raises(ConfigError):
            EngineConfig(scrub_target_p_due=bad)  # type: ignore[arg-type]


def test_human_hours() -> None:
    assert human_hours(math.inf) == human_hours(None) == "never"
    assert human_hours(0.0) == "infeasible"
    assert human_hours(1.0 / 3600) == "1 s"
    assert human_hours(0.5) == "30 min"
    assert human_hours(5.0) == "5 h"
    assert human_hours(24.0 * 30) == "30 d"
    assert human_hours(8766.0 * 3) == "3 y"


def test_info_schedule(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``rkv info --schedule`` per tier; the tiers' raw-ber preset (1e-6 per bit whatever the
    age) misses 1e-9 already for a fresh block: infeasible, said so."""
    t = list(range(40))
    with Engine.open(tmp_path / "s", local_config(16, scrub_target_p_due=1e-3)) as e:
        e.put(t, random_kv(SMALL, 40), model=SMALL)
    assert main(["info", "--schedule", str(tmp_path / "s")]) == 0
    out = capsys.readouterr().out
    assert "scrub schedule (target P(DUE) 0.001 per block" in out
    assert "test/small" in out
    for tier in ("dram", "cxl", "nvme"):
        assert f"  {tier} " in out
    assert main(["info", "--schedule", "--json", str(tmp_path / "s")]) == 0
    d: dict[str, Any] = json.loads(capsys.readouterr().out)["schedule"]
    assert d["target_p_due"] == 1e-3
    row = d["tiers"]["dram"]
    # 2 (K, V) x 16 tokens x 2 heads x 4 dims x 2 bytes
    assert row["data_bytes"] == 512 and row["bits"] == 16 and row["code"] == "none"
    assert row["scrub_hours"] is None or row["scrub_hours"] >= 0.0
    assert main(["info", str(tmp_path / "s")]) == 0
    assert "scrub schedule" not in capsys.readouterr().out


def test_models_by_preset_name_or_a_typed_error() -> None:
    from rkv.reliability.schedule import as_model, refresh_age, scrub_interval

    code = "rs(255,239)"
    assert refresh_age("raw-ber", code, 4096, 1e-3) == refresh_age(
        as_model("raw-ber"), code, 4096, 1e-3)
    assert scrub_interval({"preset": "raw-ber"}, code, 4096, 1e-3) > 0
    for bad in ("nvme-tl", 3, None):
        with pytest.raises(ConfigError, match="fault model"):
            refresh_age(bad, "none", 4096, 1e-3)
