"""PlacementConfig and the planner's inputs: loading and validation (quality profiles:
tests/test_profiles.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rkv.errors import ConfigError
from rkv.placement import (
    DEFAULT_CODES,
    BlockInput,
    InfeasiblePlanError,
    PlacementConfig,
    TierInput,
)


def test_defaults_and_roundtrip() -> None:
    cfg = PlacementConfig()
    assert cfg.codes == DEFAULT_CODES and cfg.bits == (16, 8, 4)
    assert cfg.recompute_us(256) == 25600.0
    assert PlacementConfig.from_dict(cfg.to_dict()) == cfg


def test_toml(tmp_path: Path) -> None:
    text = """
[placement]
max_p_due = 1e-12
max_p_sdc = 1e-20
quality_budget_kl = 0.02
recompute_us_per_chunk = 5000.0
bits = [16, 4]
codes = ["none", "rs(255,239)"]
lossy_demotion = true
[placement.capacity_cost]
dram = 1000.0
nvme = 10
"""
    path = tmp_path / "p.toml"
    path.write_text(text)
    cfg = PlacementConfig.load(path)
    assert cfg.max_p_due == 1e-12 and cfg.bits == (16, 4) and cfg.lossy_demotion
    assert cfg.recompute_us(1) == 5000.0 and cfg.capacity_cost == {"dram": 1000.0,
                                                                     "nvme": 10.0}


@pytest.mark.parametrize(("d", "key"), [
    ({"max_p_due": 2.0}, "max_p_due"),
    ({"max_p_sdc": "x"}, "max_p_sdc"),
    ({"quality_budget_kl": -1}, "quality_budget_kl"),
    ({"bits": [16, 3]}, "bits"),
    ({"bits": [8, 8]}, "bits"),
    ({"bits": "16"}, "bits"),
    ({"codes": ["rs(255,300)"]}, "codes"),
    ({"codes": []}, "codes"),
    ({"capacity_cost": {"dram": -1.0}}, "capacity_cost.dram"),
    ({"recompute_us_per_token": 1.0, "recompute_us_per_chunk": 2.0}, "recompute_us_per"),
    ({"recompute_us_per_token": float("nan")}, "recompute_us_per_token"),
    ({"lossy_demotion": "yes"}, "lossy_demotion"),
    ({"colour": 1}, "colour"),
])
def test_validation_names_the_key(d: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace("(", r"\(")):
        PlacementConfig.from_dict(d)


def test_bad_toml() -> None:
    with pytest.raises(ConfigError, match="TOML"):
        PlacementConfig.from_toml("max_p_due = ")


def test_inputs_validate() -> None:
    with pytest.raises(ConfigError, match="kind"):
        BlockInput(0, "q", 0, 256, 24.0, 1.0, 3, 64)
    with pytest.raises(ConfigError, match="residency_hours"):
        BlockInput(0, "k", 0, 256, 0.0, 1.0, 3, 64)
    with pytest.raises(ConfigError, match="n_chunks"):
        BlockInput(0, "k", 3, 256, 1.0, 1.0, 3, 64, n_chunks=2)
    with pytest.raises(ConfigError, match="free_bytes"):
        TierInput("dram", "dram-ddr5", -1, 20.0, 0.1)
    with pytest.raises(ConfigError, match="read_gbps"):
        TierInput("dram", "dram-ddr5", 1, 0.0, 0.1)


def test_infeasible_is_a_config_error() -> None:
    assert issubclass(InfeasiblePlanError, ConfigError)
