"""The sweep file: TOML, validated, expanded into cells.

A sweep is the product of its axes (tier or fault preset x preset parameters x BER
multiplier x hours x bits x code x layout x placement x seed), filtered by ``include`` and
``exclude`` rules. Every cell is a plain dict (its *config*) that says everything its results
depend on, so that :func:`cell_key` (a hash of that dict) identifies the result: a resumed or
extended sweep runs only the cells whose key it has not seen.

The file's tables, keys and value types are checked by :mod:`rkv.eval.sweep.sweepfile`
(through :mod:`rkv.checks`, as every other rkv config); what needs more than the file
(codec specs, preset names and parameters, placement tables, rules, combinations) is checked
here. Every error is a one-line :class:`~rkv.errors.ConfigError` naming the bad key, e.g.
``axes.bits[2]`` or ``params.nvme-tlc.pe_cylces``. The format is documented in
docs/sweeps.md.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from rkv.errors import ConfigError
from rkv.eval.sweep.sweepfile import METRICS, TIERS, Layout, Scalar, SweepFile

RULE_KEYS = ("tier", "preset", "params", "ber_multiplier", "hours", "bits", "code", "layout",
             "placement", "seed")
BUILTIN = ("default",)          # sweep files shipped in the package (rkv/eval/sweep/NAME.toml)
#: Most cells a sweep may expand to (before its rules filter them): every cell is a campaign
#: and a quality run, minutes each; the shipped sweep has 36. A product of long axes is
#: refused before it is built.
MAX_CELLS = 100_000
#: What a planned cell's placement table gets when it leaves a key out (see placement_table).
PLACEMENT_DEFAULTS: dict[str, Any] = {"profile": "smollm2-135m", "estimate": False}
#: Chunks of the put whose (bits, code) mix a planned cell's campaigns weigh, by default.
PLANNED_CHUNKS = 2


# -- cells -----------------------------------------------------------------------------------
def canonical_json(obj: Any) -> str:
    """The one serialisation hashed for keys: sorted keys, no spaces, finite numbers only."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


def cell_key(config: Mapping[str, Any]) -> str:
    """16 hex digits of the SHA-256 of the cell config's canonical JSON."""
    return hashlib.sha256(canonical_json(config).encode()).hexdigest()[:16]


def default_preset(tier: str) -> str:
    from rkv.store.config import default_tiers

    return str(next(t for t in default_tiers() if t.name == tier).fault_model)


def default_code(tier: str) -> str:
    from rkv.store.config import default_tiers

    return str(next(t for t in default_tiers() if t.name == tier).ecc)


def tier_of(preset: str) -> str:
    """The default tier a preset belongs to (its medium): the tier whose default it is, else
    by name (``dram-*``, ``cxl*``, ``nvme-*``); anything else (``raw-ber``, files) is
    injected into a memory tier (``dram``)."""
    for tier in TIERS:
        if default_preset(tier) == preset or preset.startswith(tier):
            return tier
    return "dram"


def ber_multiplier_supported() -> bool:
    """Whether this rkv's campaigns take ``ber_multiplier`` (quality cells accelerate the
    fault model itself with :func:`faultmodels.accelerate`)."""
    from rkv.eval.faults.campaign import CampaignConfig

    return "ber_multiplier" in {f.name for f in dataclasses.fields(CampaignConfig)}


def effective_code(code: str, layout: Mapping[str, Any]) -> str:
    """The protection a cell stores with: its code, or byte planes with the code on the
    high plane and ``layout.planes`` on the low one."""
    low = layout.get("planes")
    if low is None or code == "raw":
        return code
    return f"planes(high={code},low={low},tolerant=1)"


def placement_table(placement: Mapping[str, Any], hours: float) -> dict[str, Any]:
    """A planned cell's placement table with the sweep's defaults filled in (its
    ``residency_hours`` is the cell's ``hours``), so that the cell's key names everything
    its plan depends on."""
    return {**PLACEMENT_DEFAULTS, "residency_hours": float(hours), **placement}


def campaign_kwargs(cell: Mapping[str, Any]) -> dict[str, Any]:
    """The :class:`~rkv.eval.faults.campaign.CampaignConfig` arguments of a cell (reliability
    settings included when the cell has them)."""
    kw: dict[str, Any] = {
        "tier": cell["tier"],
        "fault_model": {"preset": cell["preset"], **cell["params"]},
        "protection": effective_code(cell["code"], cell["layout"]),
        "hours": cell["hours"], "bits": cell["bits"], "seed": cell["seed"],
        "chunk_tokens": cell["layout"]["chunk_tokens"], "workers": 1,
    }
    if cell["ber_multiplier"] != 1.0:
        kw["ber_multiplier"] = cell["ber_multiplier"]
    rel = cell["settings"].get("reliability")
    if rel is not None:
        kw.update(trials=rel["trials"], blocks=rel["blocks"], sampling=rel["sampling"])
    return kw


@dataclass(frozen=True)
class Sweep:
    """A validated sweep: its name, where its results go, and its cells (configs)."""

    name: str
    source: str
    results: Path
    cells: tuple[dict[str, Any], ...]
    description: str = ""

    def cell_keys(self) -> list[str]:
        return [cell_key(c) for c in self.cells]


def _matches(rule: Mapping[str, Any], cell: Mapping[str, Any]) -> bool:
    for key, want in rule.items():
        got = cell[key]
        if key in ("params", "layout"):
            if not all(_one_of(v, got.get(k)) for k, v in want.items()):
                return False
        elif key == "placement":     # {} matches unplanned cells; else the keys it names
            if (not want and got is not None) or (want and (
                    got is None or not all(_same(v, got.get(k)) for k, v in want.items()))):
                return False
        elif not _one_of(want, got):
            return False
    return True


def _one_of(want: Any, got: Any) -> bool:
    return any(_same(w, got) for w in want) if isinstance(want, list) else _same(want, got)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, int | float) and isinstance(b, int | float) and not isinstance(a, bool):
        return float(a) == float(b)
    return bool(a == b)


def _check_rules(rules: list[dict[str, Any]], name: str) -> None:
    for i, rule in enumerate(rules):
        if not rule:
            raise ConfigError(f"{name}[{i}] is empty: a rule names at least one axis")
        for key in rule:
            if key not in RULE_KEYS:
                raise ConfigError(f"{name}[{i}].{key}: unknown axis (rules match "
                                  f"{', '.join(RULE_KEYS)})")
            if key in ("params", "layout", "placement") and not isinstance(rule[key], dict):
                raise ConfigError(f"{name}[{i}].{key} must be a table")


def _check_code(code: str, where: str) -> None:
    if code in ("default", "none", "raw"):
        return
    from rkv.ecc import get_codec

    try:
        get_codec(code)
    except (ConfigError, ValueError, TypeError) as exc:
        raise ConfigError(f"{where}: bad code {code!r}: {exc}") from exc


def _check_preset(preset: str, where: str) -> None:
    import faultmodels

    if preset.endswith(".toml") and Path(preset).is_file():
        return
    if preset not in faultmodels.list_presets():
        raise ConfigError(f"{where}: unknown fault preset {preset!r} (presets: "
                          f"{', '.join(faultmodels.list_presets())})")


def _param_axes(f: SweepFile, presets: list[str]) -> dict[str, list[dict[str, Scalar]]]:
    """Per preset, the list of its parameter settings (product of its list-valued keys)."""
    import faultmodels

    for name in f.params:
        if name not in presets:
            raise ConfigError(f"params.{name}: preset {name!r} is not in the sweep "
                              f"(its presets: {', '.join(presets)})")
    out: dict[str, list[dict[str, Scalar]]] = {}
    for preset in presets:
        table = f.params.get(preset, {})
        names = sorted(table)
        values: list[list[Scalar]] = []
        for k in names:
            v = table[k]
            vals = v if isinstance(v, list) else [v]
            if not vals:
                raise ConfigError(f"params.{preset}.{k} is an empty list")
            for x in vals:
                try:
                    faultmodels.get_model({"preset": preset, k: x})
                except (ValueError, TypeError, KeyError) as exc:
                    raise ConfigError(f"params.{preset}.{k}: {exc}") from exc
            values.append(vals)
        _check_count(math.prod(len(v) for v in values), f"params.{preset}")
        out[preset] = [dict(zip(names, combo, strict=True))
                       for combo in itertools.product(*values)]
    return out


def _check_count(n: int, what: str) -> None:
    if n > MAX_CELLS:
        raise ConfigError(f"{what}: the axes expand to {n} cells (at most {MAX_CELLS})")


def _settings(f: SweepFile, metrics: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if "reliability" in metrics:
        out["reliability"] = {k: v for k, v in dataclasses.asdict(f.reliability).items()
                              if v is not None}
    if "quality" in metrics:
        q = dataclasses.asdict(f.quality)
        del q["ber_multiplier"]            # resolved per cell (quality_settings)
        q["text_digest"] = text_digest(q["text"])
        out["quality"] = q
    if "cost" in metrics:
        out["cost"] = dataclasses.asdict(f.cost)
    return out


def quality_settings(q: Mapping[str, Any], table: Mapping[str, float], tier: str,
                     preset: str) -> dict[str, Any]:
    """A cell's quality settings: the shared ones, plus the fault multiplier of its quality
    windows when ``table`` (``quality.ber_multiplier``) names its preset or, failing that,
    its tier (left out otherwise, so a sweep without the table keeps its cells' keys)."""
    mult = table.get(preset, table.get(tier))
    return dict(q) if mult is None else {**q, "ber_multiplier": float(mult)}


def quality_multiplier(cell: Mapping[str, Any]) -> float:
    """The multiplier the cell's quality windows inject faults at: its quality settings' own,
    else the cell's ``ber_multiplier``."""
    q = cell["settings"].get("quality") or {}
    return float(q.get("ber_multiplier", cell["ber_multiplier"]))


def _check_quality_table(table: Mapping[str, float], pairs: Sequence[tuple[str, str]]) -> None:
    names = {t for t, _ in pairs} | {p for _, p in pairs}
    for key in table:
        if key not in names:
            raise ConfigError(f"quality.ber_multiplier.{key}: neither a preset nor a tier of "
                              f"the sweep (they are: {', '.join(sorted(names))})")


def text_digest(sources: list[str]) -> str:
    """12 hex digits identifying the text the quality windows are cut from (Python's topics
    and rkv's docs change between versions: a changed text is a new cell)."""
    from rkv.eval.sweep.texts import source_text

    h = hashlib.sha256()
    for s in sources:
        h.update(s.encode() + b"\0" + source_text(s).encode())
    return h.hexdigest()[:12]


def expand(f: SweepFile, source: str = "<sweep>") -> list[dict[str, Any]]:
    """Every cell of the grid, validated, in a stable order, filtered by the rules."""
    ax = f.axes
    for i, code in enumerate(ax.code):
        _check_code(code, f"axes.code[{i}]")
    for i, lay in enumerate(ax.layout):
        if lay.planes is not None:
            _check_code(lay.planes, f"axes.layout[{i}].planes")
    if any(m != 1.0 for m in ax.ber_multiplier) and not ber_multiplier_supported():
        raise ConfigError("axes.ber_multiplier: this rkv's campaigns have no ber_multiplier "
                          "yet; use [1.0] (or accelerate through "
                          "[params.<preset>], e.g. fit_multiplier or device_ecc)")
    placements: list[dict[str, Any] | None] = []
    for i, p in enumerate(ax.placement):
        placements.append(_check_placement(p, f"axes.placement[{i}]"))
    _check_rules(f.include, "include")
    _check_rules(f.exclude, "exclude")
    pairs: list[tuple[str, str]]
    if ax.preset is None:
        pairs = [(t, default_preset(t)) for t in (ax.tier or ["nvme"])]
    else:
        for i, name in enumerate(ax.preset):
            _check_preset(name, f"axes.preset[{i}]")
        pairs = ([(tier_of(p), p) for p in ax.preset] if ax.tier is None
                 else [(t, p) for t in ax.tier for p in ax.preset])
    grid = math.prod((len(pairs), len(placements), len(ax.layout), len(ax.bits), len(ax.code),
                      len(ax.ber_multiplier), len(ax.hours), len(f.sweep.seeds)))
    _check_count(grid, "axes")
    params = _param_axes(f, list(dict.fromkeys(p for _, p in pairs)))
    _check_count(grid * max((len(v) for v in params.values()), default=1), "axes and params")
    metrics = [m for m in METRICS if m in f.sweep.metrics]
    settings = _settings(f, metrics)
    _check_quality_table(f.quality.ber_multiplier, pairs)
    cells: list[dict[str, Any]] = []
    seen: set[str] = set()
    for (tier, preset), placement, layout, bits, code, mult, hours, seed in itertools.product(
            pairs, placements, ax.layout, ax.bits, ax.code, ax.ber_multiplier, ax.hours,
            f.sweep.seeds):
        for prm in params[preset]:
            planned = placement is not None
            cell_settings = settings
            if planned and "reliability" in settings:
                cell_settings = {**settings, "reliability": {"chunks": PLANNED_CHUNKS,
                                                             **settings["reliability"]}}
            if "quality" in settings:
                cell_settings = {**cell_settings, "quality": quality_settings(
                    settings["quality"], f.quality.ber_multiplier, tier, preset)}
            cell = {
                "tier": tier, "preset": preset, "params": prm,
                "ber_multiplier": float(mult), "hours": float(hours),
                "bits": None if planned else bits,
                "code": None if planned else (default_code(tier) if code == "default"
                                              else code),
                "layout": lay_dict(layout), "seed": seed, "metrics": metrics,
                "placement": None if placement is None else placement_table(placement, hours),
                "settings": cell_settings,
            }
            if f.include and not any(_matches(r, cell) for r in f.include):
                continue
            if any(_matches(r, cell) for r in f.exclude):
                continue
            key = cell_key(cell)
            if key in seen:        # planned cells do not multiply by bits and code
                continue
            seen.add(key)
            _check_cell(cell)
            cells.append(cell)
    if not cells:
        raise ConfigError(f"{source}: the sweep has no cells (every cell is excluded)")
    return cells


def lay_dict(layout: Layout) -> dict[str, Any]:
    return {"chunk_tokens": layout.chunk_tokens, "planes": layout.planes}


def _check_placement(p: dict[str, Any], where: str) -> dict[str, Any] | None:
    """A placement table, validated as the engine's ``[placement]`` (with the sweep's
    defaults, :func:`placement_table`); empty means none."""
    if not p:
        return None
    from rkv.placement import PlacementConfig

    try:
        PlacementConfig.from_dict(placement_table(p, 24.0))
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from exc
    return p


def describe(cell: Mapping[str, Any]) -> str:
    """A short label: ``nvme/nvme-tlc pe_cycles=3000 x1000 4b rs(255,239) seed 0``."""
    prm = " ".join(f"{k}={v}" for k, v in cell["params"].items())
    bits = "planned" if cell["placement"] is not None else f"{cell['bits']}b {cell['code']}"
    mult = f" x{cell['ber_multiplier']:g}" if cell["ber_multiplier"] != 1 else ""
    if "quality" in cell["metrics"] and quality_multiplier(cell) != cell["ber_multiplier"]:
        mult += f" (quality x{quality_multiplier(cell):g})"
    return (f"{cell['tier']}/{cell['preset']}{' ' + prm if prm else ''}{mult} {bits} "
            f"seed {cell['seed']}")


def _check_cell(cell: dict[str, Any]) -> None:
    """A combination the engine cannot store is an error naming the cell (exclude it)."""
    from rkv.eval.faults.campaign import CampaignConfig

    if cell["placement"] is not None:      # the tier and its model; the table is checked
        try:
            CampaignConfig(**campaign_kwargs({**cell, "bits": 16, "code": "none"}))
        except ConfigError as exc:
            raise ConfigError(f"cell {{{describe(cell)}}}: {exc}") from exc
        return
    try:
        CampaignConfig(**campaign_kwargs(cell))
    except ConfigError as exc:
        raise ConfigError(f"cell {{{describe(cell)}}}: {exc} (drop it with an exclude rule, "
                          f"e.g. exclude = [{{bits = {cell['bits']}, code = "
                          f"\"{cell['code']}\"}}])") from exc
    if "quality" in cell["metrics"] and cell["code"] == "raw" and cell["bits"] != 16:
        raise ConfigError(f"cell {{{describe(cell)}}}: quality of code \"raw\" is measured "
                          "at 16 bits only (exclude the others)")


# -- loading ---------------------------------------------------------------------------------
def parse_sweep(data: Mapping[str, Any], source: str = "<sweep>",
                base: Path | None = None) -> Sweep:
    """Validate a parsed sweep file and expand its cells."""
    f = SweepFile.from_dict(data, source)
    cells = expand(f, source)
    results = Path(f.sweep.results) if f.sweep.results else (
        Path("sweep-results") / f.sweep.name / "results.jsonl")
    if f.sweep.results and base is not None and not results.is_absolute():
        results = base / results
    return Sweep(f.sweep.name, source, results, tuple(cells), f.sweep.description)


def builtin_path(name: str) -> Path:
    return Path(str(resources.files("rkv.eval.sweep") / f"{name}.toml"))


def load_sweep(path: str | Path) -> Sweep:
    """Load and validate a sweep file; a built-in name (``default``) loads the shipped one."""
    p = Path(path)
    if not p.exists() and str(path) in BUILTIN:
        p = builtin_path(str(path))
    from rkv.inputs import load_toml, read_text

    text = read_text(p, "cannot read sweep file")   # a regular file of at most 1 MiB
    data = load_toml(text, f"sweep file {path}")
    return parse_sweep(data, str(path), p.parent if p.parent != builtin_path("x").parent
                       else None)
