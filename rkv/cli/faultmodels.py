"""``rkv faultmodels [NAME]``: the shipped fault-model presets (faultmodels/presets/*.toml)
and their parameters; with NAME, one preset's parameters in full (defaults included)."""

from __future__ import annotations

import json
import logging
import re
from importlib import resources
from typing import Any

import click

from rkv.cli.common import command, complete_presets, output_options

log = logging.getLogger(__name__)
#: The first line of a preset file: ``# rkv faultmodels preset: NAME (DESCRIPTION)``.
_HEADER = re.compile(r"^#\s*rkv faultmodels preset:\s*\S+\s*\((?P<desc>.*)\)\s*$")


def describe(name: str) -> str:
    """The one-line description in a preset file's header comment ('' if it has none)."""
    text = resources.files("faultmodels").joinpath("presets", f"{name}.toml").read_text(
        encoding="utf-8")
    m = _HEADER.match(text.splitlines()[0]) if text else None
    return m.group("desc") if m else ""


def _value(v: Any) -> str:
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}={_value(x)}" for k, x in v.items()) + "}"
    return f"{v:g}" if isinstance(v, float) else str(v)


def preset_rows() -> list[dict[str, Any]]:
    """One row per preset: name, model, description, the file's parameters, source."""
    import faultmodels

    rows = []
    for name in faultmodels.list_presets():
        d = faultmodels.load_preset(name)
        params = {k: v for k, v in d.items() if k not in ("model", "source")}
        rows.append({"name": name, "model": d.get("model", ""), "description": describe(name),
                     "parameters": params, "source": d.get("source", "")})
    return rows


def parameter_rows(name: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(the preset's row, one row per parameter of its model: value and whether the preset
    file sets it or it is the model's default)."""
    import faultmodels

    presets = faultmodels.list_presets()
    if name not in presets:
        raise click.BadParameter(f"no preset {name!r}; presets: {', '.join(presets)}",
                                 param_hint="'NAME'")
    row = next(r for r in preset_rows() if r["name"] == name)
    full = faultmodels.get_model(name).params()
    log.debug("preset %s: %d parameters, %d set by the file", name, len(full),
              len(row["parameters"]))
    params = [{"parameter": k, "value": v, "from": "preset" if k in row["parameters"]
               else "default"} for k, v in full.items() if k not in ("model", "source")]
    return row, params


@command("faultmodels")
@click.argument("name", required=False, default=None, shell_complete=complete_presets)
@output_options()
def faultmodels_cmd(name: str | None, fmt: str) -> int:
    """List the fault-model presets with their model and parameters; with NAME, that
    preset's parameters in full (the model's defaults included) and its sources.

    Tiers name a preset as their fault_model; campaigns take --fault-model NAME and
    --param KEY=VALUE overrides (docs/faultmodels/index.md)."""
    from rkv.ui import Column, echo_table

    if name is None:
        rows = preset_rows()
        if fmt == "json":
            print(json.dumps(rows, indent=2))
            return 0
        if fmt == "text":
            for r in rows:      # the first few; NAME shows them all
                items = [f"{k}={_value(v)}" for k, v in r["parameters"].items()]
                more = f", +{len(items) - 4} more" if len(items) > 4 else ""
                r["parameters"] = ", ".join(items[:4]) + more
        echo_table(rows, [Column("name"), Column("model"), Column("description"),
                          Column("parameters")], fmt=fmt)
        if fmt == "text":
            print("\n`rkv faultmodels NAME` shows one preset's parameters in full.")
        return 0
    row, params = parameter_rows(name)
    if fmt == "json":
        print(json.dumps({**row, "parameters": {p["parameter"]: p["value"] for p in params},
                          "set_by_preset": sorted(row["parameters"])}, indent=2))
        return 0
    if fmt == "text":
        print(f"{name}: model {row['model']}" + (f" ({row['description']})"
                                                 if row["description"] else ""))
        print(f"source: {row['source']}\n")
        for p in params:
            p["value"] = _value(p["value"])
    echo_table(params, [Column("parameter"), Column("value", align="right"), Column("from")],
               fmt=fmt)
    return 0
