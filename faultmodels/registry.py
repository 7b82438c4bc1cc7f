"""Model registry, presets (TOML data files) and loading.

Presets live in ``faultmodels/presets/<name>.toml``. Each file is a plain parameter table
(``model = "..."`` plus that model's parameters) with a comment block and a ``source`` string
citing where the numbers come from. Users copy a file, change it, and `load` it.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from .base import FaultModel
from .errors import FaultModelError

__all__ = [
    "dump",
    "get_model",
    "list_presets",
    "load",
    "load_preset",
    "model_class",
    "model_names",
    "register_model",
]

_MODELS: dict[str, type[FaultModel]] = {}
_builtins_loaded = False


def _load_builtins() -> None:
    """Register the shipped models (once, on first lookup: the package loads lazily). A
    model registered before under the same name keeps its place."""
    global _builtins_loaded
    if _builtins_loaded:
        return
    _builtins_loaded = True
    from .accel import AcceleratedModel
    from .cxl import CxlModel
    from .dram import DramModel
    from .nand import NandModel
    from .rawber import RawBerModel

    for cls in (RawBerModel, DramModel, CxlModel, NandModel, AcceleratedModel):
        _MODELS.setdefault(cls.name, cls)


def register_model(cls: type[FaultModel]) -> type[FaultModel]:
    """Register a FaultModel subclass under its `name` (usable as a class decorator)."""
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise FaultModelError(f"{cls!r} has no model name")
    _MODELS[name] = cls
    return cls


def model_names() -> list[str]:
    _load_builtins()
    return sorted(_MODELS)


def model_class(name: str) -> type[FaultModel]:
    _load_builtins()
    try:
        return _MODELS[name]
    except (KeyError, TypeError):
        raise FaultModelError(
            f"unknown fault model {name!r}; known: {', '.join(model_names())}") from None


def _preset_dir() -> Any:
    return resources.files("faultmodels").joinpath("presets")


def list_presets() -> list[str]:
    """Names of the shipped presets (the TOML files in faultmodels/presets)."""
    out = []
    for entry in _preset_dir().iterdir():
        nm = entry.name
        if nm.endswith(".toml"):
            out.append(nm[: -len(".toml")])
    return sorted(out)


def load_preset(name: str) -> dict[str, Any]:
    """The parameter dict of a shipped preset (a fresh copy)."""
    if not isinstance(name, str) or name not in list_presets():
        raise FaultModelError(
            f"unknown preset {name!r}; presets: {', '.join(list_presets())}")
    text = _preset_dir().joinpath(name + ".toml").read_text(encoding="utf-8")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:  # pragma: no cover - shipped files are tested
        raise FaultModelError(f"preset {name!r} is not valid TOML: {e}") from None


def _deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def _resolve(d: Mapping[str, Any]) -> dict[str, Any]:
    """Expand a ``{"preset": name, ...overrides}`` mapping into full parameters."""
    if not isinstance(d, Mapping):
        raise FaultModelError(f"expected a mapping of parameters, got {type(d).__name__}")
    if "preset" in d:
        over = {k: v for k, v in d.items() if k != "preset"}
        return _deep_merge(load_preset(d["preset"]), over)
    return dict(d)


def get_model(spec: str | Mapping[str, Any] | FaultModel) -> FaultModel:
    """A model from a preset name (``"dram-ddr4"``), a path to a ``.toml`` file, a dict
    (``{"preset": "nvme-tlc", "pe_cycles": 1000}`` overrides a preset's fields, nested tables
    merge; ``{"model": "raw-ber", "ber": 1e-6}`` builds directly) or a FaultModel (returned)."""
    if isinstance(spec, FaultModel):
        return spec
    if isinstance(spec, str):
        if spec.endswith(".toml") and spec not in list_presets():
            return load(spec)
        return get_model(load_preset(spec))
    if isinstance(spec, Path):
        return load(spec)
    if not isinstance(spec, Mapping):
        raise FaultModelError(
            f"a fault model spec is a preset name, a dict or a FaultModel; got {spec!r}")
    d = _resolve(spec)
    if "model" not in d:
        raise FaultModelError(
            "a fault model dict needs a 'model' key (one of "
            f"{', '.join(model_names())}) or a 'preset' key")
    return model_class(d["model"]).from_params(d)


def load(path: str | Path) -> FaultModel:
    """A model from a TOML file (the preset format; a ``preset = "name"`` key is allowed)."""
    from .files import MAX_TOML_BYTES, load_toml, read_text

    text = read_text(path, "fault model file", limit=MAX_TOML_BYTES)
    return get_model(load_toml(text, f"fault model file {path}"))


def dump(model: FaultModel, path: str | Path) -> None:
    """Write `model.to_toml()` to `path`."""
    Path(path).write_text(model.to_toml(), encoding="utf-8")
