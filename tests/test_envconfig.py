"""RKV_* environment variables override the configuration a store opens with."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rkv import Engine
from rkv.errors import ConfigError
from rkv.store.config import EngineConfig
from rkv.store.envconfig import apply_env, overrides


def test_no_variables_keep_the_config_object() -> None:
    cfg = EngineConfig()
    assert apply_env(cfg, {}) is cfg
    assert apply_env(None, {"PATH": "/bin", "RKV_REDIS_PASSWORD": "x"}) is None
    assert overrides({"RKV_REDIS_PASSWORD": "x", "RKV_CODEC_THREADS": "2"}) == {
        "RKV_CODEC_THREADS": "2"}


def test_engine_and_tier_fields_by_type() -> None:
    cfg = apply_env(None, {
        "RKV_CODEC_THREADS": "3", "RKV_REPAIR": "off", "RKV_PROMOTE": "never",
        "RKV_SCRUB_TARGET_P_DUE": "1e-12", "RKV_SCRUB": "{enabled = true, budget_mbps = 5}",
        "RKV_TIER_DRAM_CAPACITY_BYTES": "1GiB", "RKV_TIER_NVME_ECC": "rs(255,239)",
        "RKV_TIER_CXL_SYNC": "yes", "RKV_TIER_NVME_READ_GBPS": "2.5",
    })
    assert cfg is not None
    assert (cfg.codec_threads, cfg.repair, cfg.promote) == (3, False, "never")
    assert cfg.scrub_target_p_due == 1e-12
    assert cfg.scrub == {"enabled": True, "budget_mbps": 5}
    assert cfg.tier("dram").capacity_bytes == 1 << 30
    assert cfg.tier("nvme").ecc == "rs(255,239)"
    assert cfg.tier("nvme").read_gbps == 2.5
    assert cfg.tier("cxl").sync is True
    # Fields not named keep the defaults.
    assert cfg.tier("cxl").ecc == EngineConfig().tier("cxl").ecc


@pytest.mark.parametrize(("env", "needle"), [
    ({"RKV_REPAIR": "maybe"}, "RKV_REPAIR"),
    ({"RKV_CODEC_THREADS": "four"}, "RKV_CODEC_THREADS"),
    ({"RKV_CODEC_THREADS": "1.5"}, "RKV_CODEC_THREADS"),
    ({"RKV_SCRUB": "{enabled = "}, "RKV_SCRUB"),
    ({"RKV_TIER_SSD_PATH": "/x"}, "no tier named like 'ssd'"),
    ({"RKV_TIER_DRAM_COLOUR": "red"}, "'colour' is not a tier setting"),
    ({"RKV_TIER_DRAM_NAME": "x"}, "'name' is not a tier setting"),
    ({"RKV_TIER_NVME_ECC": "rs(9,9)"}, "RKV_TIER_NVME_ECC"),
    ({"RKV_ON_FULL": "panic"}, "RKV_ON_FULL"),
])
def test_bad_values_name_the_variable(env: dict[str, str], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(")):
        apply_env(None, env)


@given(st.integers(0, 10**6), st.sampled_from(
    [("", 1), ("KiB", 1024), ("MiB", 1 << 20), ("GiB", 1 << 30), ("KB", 1000), ("gb", 10**9)]))
def test_sizes(n: int, unit: tuple[str, int]) -> None:
    cfg = apply_env(None, {"RKV_TIER_NVME_CAPACITY_BYTES": f"{n + 1}{unit[0]}"})
    assert cfg is not None and cfg.tier("nvme").capacity_bytes == (n + 1) * unit[1]


def test_config_file_then_fields(tmp_path: Path) -> None:
    base = EngineConfig(chunk_tokens=64)
    (tmp_path / "c.toml").write_text(base.to_toml())
    cfg = apply_env(None, {"RKV_CONFIG": str(tmp_path / "c.toml"), "RKV_CODEC_THREADS": "2"})
    assert cfg is not None and (cfg.chunk_tokens, cfg.codec_threads) == (64, 2)
    with pytest.raises(ConfigError):
        apply_env(None, {"RKV_CONFIG": str(tmp_path / "missing.toml")})


def test_engine_open_applies_the_environment(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RKV_CHUNK_TOKENS", "32")
    monkeypatch.setenv("RKV_TIER_DRAM_PATH", str(tmp_path / "dram"))
    monkeypatch.setenv("RKV_TIER_CXL_PATH", str(tmp_path / "cxl"))
    with Engine.open(tmp_path / "s") as e:
        assert e.config.chunk_tokens == 32
        assert e.config.tier("dram").path == str(tmp_path / "dram")
    assert (tmp_path / "dram").is_dir()
    # The store records what it was opened with; without the variables it keeps it.
    monkeypatch.delenv("RKV_CHUNK_TOKENS")
    monkeypatch.setenv("RKV_CODEC_THREADS", "1")
    with Engine.open(tmp_path / "s") as e:
        assert (e.config.chunk_tokens, e.config.codec_threads) == (32, 1)
    # chunk_tokens of an existing store cannot change, from the environment either.
    monkeypatch.setenv("RKV_CHUNK_TOKENS", "64")
    with pytest.raises(ConfigError, match="chunk_tokens"):
        Engine.open(tmp_path / "s")
    # An explicit config in code wins over the environment.
    monkeypatch.delenv("RKV_CHUNK_TOKENS")
    with Engine.open(tmp_path / "s", EngineConfig(chunk_tokens=32).with_tier(
            "dram", path=str(tmp_path / "dram")).with_tier("cxl", path=str(tmp_path / "cxl"))
    ) as e:
        assert e.config.codec_threads == 0


def test_stored_index_sync_is_honoured_on_reopen(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = EngineConfig(index_sync=False).with_tier("dram", path=str(tmp_path / "d")).with_tier(
        "cxl", path=str(tmp_path / "c"))
    with Engine.open(tmp_path / "s", cfg) as e:
        assert e.core.index.env.force_sync is False
    # RKV_INDEX_SYNC (or a stored index_sync) asks for it after the index is open.
    monkeypatch.setenv("RKV_INDEX_SYNC", "true")
    with Engine.open(tmp_path / "s") as e:
        assert e.config.index_sync and e.core.index.env.force_sync
    monkeypatch.delenv("RKV_INDEX_SYNC")
    with Engine.open(tmp_path / "s") as e:   # stored now: still fsynced without the variable
        assert e.config.index_sync and e.core.index.env.force_sync
