"""The sweep file: grid expansion and filtering (property tests), cell keys, and errors that
name the bad key."""

from __future__ import annotations

import itertools
import math
import tomllib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rkv.errors import ConfigError
from rkv.eval.sweep.spec import cell_key, load_sweep, parse_sweep

BASE: dict[str, Any] = {"sweep": {"name": "t", "metrics": ["reliability", "cost"]}}
CODES = ["none", "crc32c", "rs(255,239)", "rs(255,223)", "bch(m=13,t=8)"]


def sweep_of(**parts: Any) -> Any:
    return parse_sweep({**BASE, **parts})


def keys_of(cells: Any) -> list[tuple[Any, ...]]:
    return [(c["tier"], c["bits"], c["code"], c["ber_multiplier"], c["seed"]) for c in cells]


axes_st = st.fixed_dictionaries({
    "tier": st.lists(st.sampled_from(["dram", "cxl", "nvme"]), min_size=1, max_size=3,
                     unique=True),
    "bits": st.lists(st.sampled_from([16, 8, 4, 2]), min_size=1, max_size=4, unique=True),
    "code": st.lists(st.sampled_from(CODES), min_size=1, max_size=4, unique=True),
    "ber_multiplier": st.lists(st.sampled_from([1.0, 10.0, 1e3]), min_size=1, max_size=2,
                               unique=True),
})
rule_st = st.dictionaries(
    st.sampled_from(["tier", "bits", "code"]),
    st.one_of(st.sampled_from(["dram", "cxl", "nvme", 16, 8, 4, 2, *CODES]),
              st.lists(st.sampled_from([16, 8, 4, 2]), min_size=1, max_size=2)),
    min_size=1, max_size=2)


def _match(rule: dict[str, Any], cell: dict[str, Any]) -> bool:
    return all(cell[k] in (v if isinstance(v, list) else [v]) for k, v in rule.items())


@settings(max_examples=40, deadline=None)
@given(axes=axes_st, seeds=st.lists(st.integers(0, 5), min_size=1, max_size=2, unique=True),
       include=st.lists(rule_st, max_size=2), exclude=st.lists(rule_st, max_size=2))
def test_grid_is_the_filtered_product(axes: dict[str, Any], seeds: list[int],
                                      include: list[dict[str, Any]],
                                      exclude: list[dict[str, Any]]) -> None:
    """Cells = product of the axes, kept iff they match an include rule (when there are
    any) and no exclude rule; in axis order, each once, keys unique."""
    want = []
    for tier, bits, code, mult, seed in itertools.product(
            axes["tier"], axes["bits"], axes["code"], axes["ber_multiplier"], seeds):
        cell = {"tier": tier, "bits": bits, "code": code}
        if include and not any(_match(r, cell) for r in include):
            continue
        if any(_match(r, cell) for r in exclude):
            continue
        want.append((tier, bits, code, mult, seed))
    data = {**BASE, "sweep": {**BASE["sweep"], "seeds": seeds}, "axes": axes,
            "include": include, "exclude": exclude}
    if not want:
        with pytest.raises(ConfigError, match="no cells"):
            parse_sweep(data)
        return
    got = parse_sweep(data)
    assert sorted(keys_of(got.cells)) == sorted(want)
    assert len(set(got.cell_keys())) == len(want)


@settings(max_examples=25, deadline=None)
@given(axes=axes_st, extra=st.sampled_from([("bits", 2), ("code", "rs(255,247)"),
                                            ("ber_multiplier", 100.0)]))
def test_a_new_axis_value_only_adds_cells(axes: dict[str, Any], extra: tuple[str, Any]
                                          ) -> None:
    """Keys are a function of the cell alone: widening an axis keeps every old key."""
    name, value = extra
    old = set(sweep_of(axes=axes).cell_keys())
    wider = {**axes, name: [*axes[name], value] if value not in axes[name] else axes[name]}
    new = set(sweep_of(axes=wider).cell_keys())
    assert old <= new
    n_old = math.prod(len(v) for v in axes.values())
    assert len(new) - len(old) == math.prod(len(v) for v in wider.values()) - n_old


def test_cell_config_and_key() -> None:
    s = sweep_of(axes={"tier": ["nvme"], "bits": [4], "code": ["default"]},
                 params={"nvme-tlc": {"pe_cycles": [1000, 3000], "temperature_c": 40.0}})
    assert len(s.cells) == 2
    c = s.cells[0]
    assert c["preset"] == "nvme-tlc" and c["code"] == "shardrs(k=16,m=2)"
    assert c["params"] == {"pe_cycles": 1000, "temperature_c": 40.0}
    assert c["layout"] == {"chunk_tokens": 256, "planes": None} and c["placement"] is None
    assert set(c["settings"]) == {"reliability", "cost"}
    assert len(cell_key(c)) == 16 and cell_key(c) == cell_key(dict(reversed(c.items())))
    assert cell_key(c) != cell_key({**c, "seed": 1})


def test_presets_without_tiers_get_their_medium() -> None:
    s = sweep_of(axes={"preset": ["dram-ddr4", "nvme-tlc", "raw-ber"]})
    assert [(c["tier"], c["preset"]) for c in s.cells] == [
        ("dram", "dram-ddr4"), ("nvme", "nvme-tlc"), ("dram", "raw-ber")]


def test_rules_match_params_and_layout() -> None:
    s = sweep_of(axes={"tier": ["nvme"], "code": ["rs(255,239)"],
                       "layout": [{}, {"planes": "none"}]},
                 params={"nvme-tlc": {"pe_cycles": [1000, 3000]}},
                 exclude=[{"params": {"pe_cycles": 3000}, "layout": {"planes": "none"}}])
    got = {(c["params"]["pe_cycles"], c["layout"]["planes"]) for c in s.cells}
    assert got == {(1000, None), (1000, "none"), (3000, None)}


def test_the_shipped_default_sweep_loads() -> None:
    s = load_sweep("default")
    assert s.name == "default" and len(s.cells) == 47
    assert {c["tier"] for c in s.cells} == {"dram", "cxl", "nvme"}
    assert {c["bits"] for c in s.cells} == {16, 8, 4, 2, None}     # None: planned
    assert {c["preset"] for c in s.cells} == {"dram-ddr5", "cxl", "nvme-tlc", "raw-ber"}


@pytest.mark.parametrize(("data", "named"), [
    ({"sweeep": {}}, "unknown key(s) sweeep"),
    ({"axes": {"bitz": [4]}}, "axes: unknown key(s) bitz"),
    ({"axes": {"bits": [16, 3]}}, "axes.bits[1]"),
    ({"axes": {"bits": 4}}, "axes.bits"),
    ({"axes": {"code": ["none", "rs(255,300)"]}}, "axes.code[1]"),
    ({"axes": {"preset": ["nvme-qlc"]}}, "axes.preset[0]"),
    ({"axes": {"tier": ["ssd"]}}, "axes.tier[0]"),
    ({"axes": {"hours": [-1.0]}}, "axes.hours[0]"),
    ({"axes": {"ber_multiplier": [0.0]}}, "axes.ber_multiplier[0]"),
    ({"axes": {"layout": [{"chunk_tokens": 256, "plane": "none"}]}},
     "axes.layout[0]: unknown key(s) plane"),
    ({"axes": {"layout": [{"planes": "rs(9)"}]}}, "axes.layout[0].planes"),
    ({"axes": {"placement": [{}, {"max_p_due": 2.0}]}}, "axes.placement[1]"),
    ({"axes": {"tier": ["nvme"]}, "params": {"nvme-tlc": {"pe_cylces": 10}}},
     "params.nvme-tlc.pe_cylces"),
    ({"axes": {"tier": ["nvme"]}, "params": {"dram-ddr5": {"fit_multiplier": 2.0}}},
     "params.dram-ddr5"),
    ({"exclude": [{"bitz": 2}]}, "exclude[0].bitz"),
    ({"include": [{}]}, "include[0]"),
    ({"sweep": {"metrics": ["speed"]}}, "sweep.metrics[0]"),
    ({"sweep": {"seeds": [-1]}}, "sweep.seeds[0]"),
    ({"reliability": {"trials": 0}}, "reliability.trials"),
    ({"quality": {"text": ["wiki"]}}, "quality.text[0]"),
    ({"axes": {"bits": [4.0]}}, "axes.bits[0] must be one of 16, 8, 4 or 2, got 4.0"),
    ({"axes": {"layout": [{"chunk_tokens": 8}]}}, "axes.layout[0].chunk_tokens must be in"),
    ({"axes": {"tier": []}}, "axes.tier must be a non-empty list"),
    ({"params": {"nvme-tlc": {"pe_cycles": [[1000]]}}}, "params.nvme-tlc.pe_cycles[0]"),
    ({"sweep": {"name": "a b"}}, "sweep.name must be"),
    ({"cost": {"chunks": 0}}, "cost.chunks must be >= 1, got 0"),
    ({"include": {"bits": 4}}, "include must be a list of tables"),
    ({"exclude": [{"bits": 16}]}, "no cells"),
    ({"axes": {"bits": [4], "layout": [{"planes": "none"}]}}, "exclude rule"),
])
def test_bad_sweep_files_name_the_bad_key(data: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_sweep(data)
    assert named in str(err.value)


def test_bad_toml_and_missing_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[axes\nbits = [4]\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_sweep(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        load_sweep(tmp_path / "none.toml")


def test_results_path_is_relative_to_the_sweep_file(tmp_path: Path) -> None:
    f = tmp_path / "s.toml"
    f.write_text('[sweep]\nname = "x"\nresults = "out/r.jsonl"\nmetrics = ["cost"]\n')
    assert load_sweep(f).results == tmp_path / "out" / "r.jsonl"
    assert tomllib.loads(f.read_text())["sweep"]["name"] == "x"


def test_planned_cells_name_what_their_plan_depends_on() -> None:
    plain = sweep_of(axes={"bits": [16, 4], "hours": [24.0, 2.0]})
    mixed = sweep_of(axes={"bits": [16, 4], "hours": [24.0, 2.0],
                           "placement": [{}, {"max_p_due": 1e-6}]})
    unplanned = [c for c in mixed.cells if c["placement"] is None]
    planned = [c for c in mixed.cells if c["placement"] is not None]
    # adding a placement axis leaves the unplanned cells' keys (and results) as they were
    assert [cell_key(c) for c in unplanned] == plain.cell_keys()
    assert len(planned) == 2            # one per hours value: not multiplied by bits
    for c in planned:
        assert c["bits"] is None and c["code"] is None
        assert c["placement"] == {"max_p_due": 1e-6, "profile": "smollm2-135m",
                                  "estimate": False, "residency_hours": c["hours"]}
        assert c["settings"]["reliability"]["chunks"] == 2
    assert all("chunks" not in c["settings"]["reliability"] for c in unplanned)
    # a table that sets a default keeps its own value
    own = sweep_of(axes={"placement": [{"residency_hours": 1.0, "profile": "x.json"}]})
    assert own.cells[0]["placement"]["residency_hours"] == 1.0


def test_placement_rules_match_the_keys_they_name() -> None:
    axes = {"placement": [{}, {"max_p_due": 1e-6}, {"max_p_due": 1e-3}], "bits": [16]}
    only = sweep_of(axes=axes, include=[{"placement": {"max_p_due": 1e-3}}])
    assert [c["placement"]["max_p_due"] for c in only.cells] == [1e-3]
    plain = sweep_of(axes=axes, include=[{"placement": {}}])
    assert [c["placement"] for c in plain.cells] == [None]
    rest = sweep_of(axes=axes, exclude=[{"placement": {"max_p_due": 1e-6}}])
    assert len(rest.cells) == 2
