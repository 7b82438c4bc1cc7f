"""Faults in time (rkv.reliability.timeline) and campaigns over time (rkv.eval.faults.overtime)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import faultmodels
from rkv.errors import ConfigError
from rkv.eval.faults.campaign import wilson
from rkv.eval.faults.overtime import OverTimeConfig, run_over_time
from rkv.reliability.timeline import TimelineError, draw_timeline

NBYTES = 196608


@pytest.mark.parametrize("spec, horizon", [
    ({"preset": "cxl"}, 720.0),
    ({"preset": "dram-ddr5", "latent_hours": 3.0}, 720.0),
    ({"preset": "nvme-tlc", "pe_cycles": 10000}, 24 * 120.0),
])
def test_timeline_marginals_match_the_model_at_every_age(spec: dict, horizon: float) -> None:
    """Two-sided: at each age, the fraction of timelines with an event by then is inside the
    99.9 % Wilson interval around p_any_error(age) (three ages per model, 3000 draws)."""
    model = faultmodels.accelerate(faultmodels.get_model(spec), 30.0)
    rng = np.random.default_rng(7)
    tls = [draw_timeline(model, NBYTES, horizon, rng) for _ in range(3000)]
    for age in (horizon / 50, horizon / 5, horizon * 0.9):
        k = sum(any(e.hours <= age for e in tl) for tl in tls)
        p = model.p_any_error(NBYTES, age)
        lo, hi = wilson(k, len(tls), z=3.29)
        assert lo <= p <= hi, (spec, age, k, p)


def test_latent_faults_are_present_at_the_write() -> None:
    base = faultmodels.accelerate(faultmodels.get_model("dram-ddr5"), 1000.0)
    latent = base.with_latent_hours(100.0) if hasattr(base, "with_latent_hours") else None
    if latent is None or latent.latent_hours == 0:
        pytest.skip("this model has no latent faults")
    rng = np.random.default_rng(1)
    at_zero = sum(any(e.hours == 0.0 for e in draw_timeline(latent, NBYTES, 1.0, rng))
                  for _ in range(4000))
    none = sum(any(e.hours == 0.0 for e in draw_timeline(base, NBYTES, 1.0, rng))
               for _ in range(4000))
    assert at_zero > 0 and none == 0


def test_a_class_without_a_time_law_is_refused() -> None:
    raw = faultmodels.get_model({"preset": "nvme-tlc", "device_ecc": "none",
                                 "overdispersion": 0.5})
    with pytest.raises(TimelineError, match="no count law"):
        draw_timeline(raw, 4096, 100.0, np.random.default_rng(0))


# -- over time ---------------------------------------------------------------------------------
# 512-byte blocks under rs(255,239) (8 symbols per codeword) and bit flips that accumulate:
# about 30 per codeword after the 100 h mean residency (uncorrectable), 0.3 per scrub hour.
SMALL = {"tier": "dram", "protection": "rs(255,239)", "chunk_tokens": 16, "kv_heads": 1,
         "head_dim": 8, "fault_model": {"model": "raw-ber", "ber": 1.5e-4, "per_hour": True}}


def over(**kw: object) -> OverTimeConfig:
    return OverTimeConfig(campaign=SMALL, days=10.0, blocks=6, trials=1,
                          residency_hours=100.0, refresh_hours=math.inf, **kw)  # type: ignore[arg-type]


def test_without_scrubbing_accumulated_flips_are_lost_at_the_read() -> None:
    r = run_over_time(over())
    reads = sum(r.reads.values())
    assert reads >= 3 and r.reads["due"] >= reads // 2 and r.sdc == 0
    assert r.scrub_passes == 0 and r.block_days == pytest.approx(6 * 10.0)


def test_scrubbing_corrects_before_the_code_is_exhausted() -> None:
    r = run_over_time(over(scrub_hours=1.0))
    assert r.due == 0 and r.sdc == 0
    assert r.scrub["corrected"] > 0 and r.scrub_passes == 240
    d = r.to_dict()
    assert d["due"]["n"] == 0 and d["due"]["hi"] > 0 and d["scrub_mb_per_s"] > 0


def test_over_time_is_a_function_of_its_seed() -> None:
    a = run_over_time(over(scrub_hours=5.0, seed=3)).to_dict()
    b = run_over_time(over(scrub_hours=5.0, seed=3)).to_dict()
    assert a == b


def test_bad_over_time_configs_name_the_key() -> None:
    with pytest.raises(ConfigError, match="days"):
        OverTimeConfig(days=0)
    with pytest.raises(ConfigError, match="unknown key"):
        OverTimeConfig(campaign={"tierr": "nvme"})
    with pytest.raises(ConfigError, match="blocks"):
        OverTimeConfig(blocks=0)


def test_cli_days_runs_with_and_without_scrubbing(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from rkv.cli import main

    rc = main(["campaign", "--tier", "dram", "--fault-model", "raw-ber", "--param",
               "ber=1.5e-4", "--param", "per_hour=true", "--protection", "rs(255,239)",
               "--chunk-tokens", "16", "--kv-heads", "1", "--head-dim", "8", "--days", "5",
               "--blocks", "6", "--trials", "1", "--residency-hours", "100", "--scrub", "1",
               "--refresh-hours", "1e9", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["model"] == "raw-ber ber=0.00015 per_hour=True"
    off, on = out["runs"]["no scrub"], out["runs"]["scrub every 1 h"]
    assert off["due"]["n"] > 0 and on["due"]["n"] == 0 and on["scrub"]["corrected"] > 0
    assert out["target_per_block_day"] == pytest.approx(1e-9 * 24)


def test_cli_days_bad_scrub_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    from rkv.cli import main

    rc = main(["campaign", "--days", "1", "--scrub", "often", "--refresh-hours", "5"])
    assert rc == 2 and "--scrub expects hours" in capsys.readouterr().err
