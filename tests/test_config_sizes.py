"""Config sizes, fault-model defaults and did-you-mean (issue 32): TOML takes the sizes an
``RKV_*`` variable takes, through the one grammar of :func:`rkv.ui.sizes.parse_size`; a tier
that names no fault model gets one by medium, said in a warning; a misspelt key is answered
with the closest allowed one, in every config that checks its keys."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rkv.errors import ConfigError
from rkv.store.config import EngineConfig, TierConfig, default_fault_model
from rkv.store.envconfig import apply_env
from rkv.ui.sizes import UNBOUNDED, human_capacity, parse_size


def _tier_toml(value: str) -> str:
    return f'[[tiers]]\nname = "dram"\nmedium = "memory"\nfault_model = "dram-ddr5"\n' \
           f"capacity_bytes = {value}\n"


@pytest.mark.parametrize(("text", "size"), [
    ('"64MiB"', 64 << 20), ('"8GiB"', 8 << 30), ('"1.5GB"', 1_500_000_000),
    ('"8 GiB"', 8 << 30), ('"4096"', 4096), ('"1.5KiB"', 1536), ("123", 123),
])
def test_toml_takes_sizes_like_the_environment(text: str, size: int) -> None:
    cfg = EngineConfig.from_toml(_tier_toml(text))
    assert cfg.tiers[0].capacity_bytes == size
    env = apply_env(EngineConfig.from_toml(_tier_toml("1")),
                    {"RKV_TIER_DRAM_CAPACITY_BYTES": text.strip('"')})
    assert env is not None and env.tiers[0].capacity_bytes == size
    # Stored back as the integer, so the round trip is exact.
    assert EngineConfig.from_toml(cfg.to_toml()).tiers[0].capacity_bytes == size


@pytest.mark.parametrize("text", [
    '"-64MiB"', '"64 MiBs"', '"64MiBs"', '"99999TiB"', '"nan"', "nan", "inf", '"0.5B"',
    '"1e9"', '""', '"  "', '"0x10"', '"1_000"', "true", "2.0", '"-0"', f'"{"9" * 40}"',
    "18446744073709551616", '"64 MiB 2"',
])
def test_hostile_sizes_are_config_errors_naming_the_key(text: str) -> None:
    with pytest.raises(ConfigError, match="tier dram: capacity_bytes"):
        EngineConfig.from_toml(_tier_toml(text))


@pytest.mark.parametrize("text", ["-64MiB", "64 MiBs", "nan", "9" * 40, "1.5B", "64MiB!"])
def test_hostile_sizes_from_the_environment_name_the_variable(text: str) -> None:
    with pytest.raises(ConfigError, match="RKV_TIER_DRAM_CAPACITY_BYTES"):
        apply_env(EngineConfig.from_toml(_tier_toml("1")),
                  {"RKV_TIER_DRAM_CAPACITY_BYTES": text})


def test_map_bytes_takes_sizes_too() -> None:
    t = TierConfig("t", capacity_bytes="1GiB", map_bytes="2GiB")   # type: ignore[arg-type]
    assert (t.capacity_bytes, t.map_bytes) == (1 << 30, 2 << 30)
    with pytest.raises(ConfigError, match="tier t: map_bytes"):
        TierConfig("t", capacity_bytes="1GiB", map_bytes="512MiB")  # type: ignore[arg-type]


@given(st.integers(min_value=0, max_value=1 << 40),
       st.sampled_from([("", 1), ("B", 1), ("KiB", 1 << 10), ("MiB", 1 << 20), ("kb", 1000),
                        ("GB", 10**9), ("TiB", 1 << 40)]),
       st.booleans())
def test_parse_size_is_exact(n: int, unit: tuple[str, int], space: bool) -> None:
    suffix, factor = unit
    text = f"{n}{' ' if space and suffix else ''}{suffix}"
    if n * factor > (1 << 63) - 1:
        with pytest.raises(ConfigError, match="too large"):
            parse_size(text, "x")
    else:
        assert parse_size(text, "x") == n * factor


def test_parse_size_is_bounded_in_time_on_long_input() -> None:
    with pytest.raises(ConfigError, match="expected a size"):
        parse_size("9" * 1_000_000, "x")


def test_human_capacity_names_the_unbounded_sentinel() -> None:
    assert human_capacity(UNBOUNDED) == "unbounded"
    assert human_capacity(1 << 62) == "unbounded"
    assert human_capacity((1 << 62) - 1) != "unbounded"
    assert human_capacity(2 << 30) == "2.0 GiB"


# -- fault-model defaults -------------------------------------------------------------------

@pytest.mark.parametrize(("fields", "model"), [
    ({"medium": "memory"}, "dram-ddr5"), ({"medium": "disk"}, "nvme-tlc"),
    ({}, "nvme-tlc"), ({"kind": "redis", "url": "redis://localhost:6379/0"}, "dram-ddr5"),
])
def test_a_tier_without_fault_model_gets_one_by_medium(fields: dict[str, str],
                                                       model: str) -> None:
    t = TierConfig("x", **fields)  # type: ignore[arg-type]
    assert t.fault_model == model == default_fault_model(t)
    assert t.fault_model != "raw-ber"


def test_the_name_does_not_choose_the_fault_model() -> None:
    # Named dram but on disk: the medium decides, never the name.
    assert TierConfig("dram", medium="disk").fault_model == "nvme-tlc"
    assert TierConfig("nvme", medium="memory").fault_model == "dram-ddr5"


def test_a_config_file_without_fault_model_is_warned_about(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="rkv.store.config"):
        cfg = EngineConfig.from_toml('[[tiers]]\nname = "dram"\nmedium = "memory"\n')
    assert cfg.tiers[0].fault_model == "dram-ddr5"
    assert "tier dram: no fault_model given; using 'dram-ddr5'" in caplog.text
    assert "medium = 'memory'" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rkv.store.config"):
        again = EngineConfig.from_toml(cfg.to_toml())     # the stored config names it
    assert again.tiers[0].fault_model == "dram-ddr5" and caplog.text == ""


def test_an_explicit_fault_model_is_kept() -> None:
    assert TierConfig("dram", medium="memory", fault_model="raw-ber").fault_model == "raw-ber"
    assert TierConfig("x", fault_model="cxl").fault_model == "cxl"


# -- did you mean ---------------------------------------------------------------------------

@pytest.mark.parametrize(("load", "match"), [
    (lambda: EngineConfig.from_dict({"chunk_tokns": 256}),
     r"engine config: unknown key\(s\) chunk_tokns \(did you mean 'chunk_tokens'\?\)"),
    (lambda: EngineConfig.from_dict({"tiers": [{"name": "a", "capacty_bytes": 1}]}),
     r"tier: unknown key\(s\) capacty_bytes \(did you mean 'capacity_bytes'\?\)"),
    (lambda: EngineConfig.from_dict({"placement": {"max_p_sdcc": 1e-9}}),
     r"placement: unknown key\(s\) max_p_sdcc \(did you mean 'max_p_sdc'\?\)"),
    (lambda: EngineConfig.from_dict({"scrub": {"budgt_mbps": 1}}),
     r"scrub: unknown key\(s\) budgt_mbps \(did you mean 'budget_mbps'\?\)"),
    (lambda: TierConfig("r", kind="redis", url="redis://h:1/0", remote={"namespce": "a"}),
     r"unknown key\(s\) namespce \(did you mean 'namespace'\?\)"),
])
def test_misspelt_keys_get_a_suggestion(load: object, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load()  # type: ignore[operator]


def test_fault_model_params_get_a_suggestion() -> None:
    import faultmodels
    from faultmodels.errors import FaultModelError

    with pytest.raises(FaultModelError, match=r"pe_cyles \(did you mean 'pe_cycles'\?\)"):
        faultmodels.get_model({"preset": "nvme-tlc", "pe_cyles": 100})


def test_an_unrelated_key_gets_no_suggestion() -> None:
    with pytest.raises(ConfigError) as info:
        EngineConfig.from_dict({"zzzzzz": 1})
    assert "did you mean" not in str(info.value)
    assert "allowed: chunk_tokens" in str(info.value)
