from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rkv import ConfigError, EngineConfig, TierConfig

tiers = st.builds(
    TierConfig,
    name=st.sampled_from(["dram", "cxl", "nvme", "pmem"]),
    medium=st.sampled_from(["memory", "disk"]),
    path=st.text(max_size=10),
    capacity_bytes=st.integers(1, 2**50),
    read_gbps=st.floats(0.01, 1000),
    sync=st.booleans(),
)
configs = st.builds(
    EngineConfig,
    chunk_tokens=st.integers(1, 4096),
    tiers=st.lists(tiers, min_size=1, max_size=4, unique_by=lambda t: t.name).map(tuple),
    on_full=st.sampled_from(["evict", "error"]),
)


@given(configs)
def test_config_round_trips(cfg: EngineConfig) -> None:
    assert EngineConfig.from_dict(cfg.to_dict()) == cfg
    assert EngineConfig.from_toml(cfg.to_toml()) == cfg


def test_default_has_three_tiers() -> None:
    cfg = EngineConfig()
    assert [t.name for t in cfg.tiers] == ["dram", "cxl", "nvme"]
    assert cfg.tier("cxl").medium == "memory" and cfg.tier("nvme").medium == "disk"
    assert cfg.with_tier("cxl", path="/mnt/cxl").tier("cxl").path == "/mnt/cxl"


@pytest.mark.parametrize(
    "text",
    [
        "chunk_tokens = 0",
        "chunk_tokens = 'x'",
        "on_full = 'panic'",
        "bogus = 1",
        "tiers = []",
        "[[tiers]]\nname = 'a'\ncapacity_bytes = -5",
        "[[tiers]]\nname = 'a'\n[[tiers]]\nname = 'a'",
        "[[tiers]]\nmedium = 'disk'",
        "[[tiers]]\nname = 'a'\nmedium = 'tape'",
        "[[tiers]]\nname = 'a'\nunknown = 1",
        "not toml at all [",
        "tiers = 5",
    ],
)
def test_bad_configs_rejected(text: str) -> None:
    with pytest.raises(ConfigError):
        EngineConfig.from_toml(text)


def test_load_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        EngineConfig.load(tmp_path / "nope.toml")
    (tmp_path / "c.toml").write_text(EngineConfig().to_toml())
    assert EngineConfig.load(tmp_path / "c.toml") == EngineConfig()


def test_nested_tables_are_parsed_once_and_round_trip_as_written() -> None:
    from rkv.placement.config import PlacementConfig
    from rkv.store.plans import EnginePlacement
    from rkv.store.scrub_report import ScrubConfig

    cfg = EngineConfig(placement={"max_p_due": 1e-12}, scrub={"margin": 2})
    assert isinstance(cfg.placement_config, PlacementConfig)
    assert cfg.placement_config is cfg.placement_config          # one parse, kept
    assert isinstance(cfg.scrub_config, ScrubConfig) and cfg.scrub_config.margin == 2
    placement = EnginePlacement.for_engine(cfg)
    assert placement is not None and placement.cfg is cfg.placement_config
    again = EngineConfig.from_toml(cfg.to_toml())
    assert again.placement == {"max_p_due": 1e-12} and again == cfg
    assert EngineConfig().placement_config is None
    with pytest.raises(ConfigError, match="placement"):
        EngineConfig(placement={"max_p_due": -1})
