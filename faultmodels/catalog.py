"""The names a fault model spec may use, without any model class: the shipped presets (TOML
data files), the model classes registered by name, and the parameters a spec stands for.

Presets live in ``faultmodels/presets/<name>.toml``. Each file is a plain parameter table
(``model = "..."`` plus that model's parameters) with a comment block and a ``source`` string
citing where the numbers come from. Users copy a file, change it, and `load` it.

:mod:`faultmodels.registry` turns a spec into a model (it adds the shipped model classes to
this table on its first lookup); a model whose parameters name another model (CXL media)
resolves them here, so that no model module needs the registry.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import FaultModelError
from .files import MAX_TOML_BYTES, load_toml, read_text

if TYPE_CHECKING:
    from .base import FaultModel

__all__ = [
    "add_shipped",
    "deep_merge",
    "list_presets",
    "load_preset",
    "read_spec",
    "register_model",
    "registered",
    "registered_names",
    "spec_params",
]

_MODELS: dict[str, type[FaultModel]] = {}


def register_model(cls: type[FaultModel]) -> type[FaultModel]:
    """Register a FaultModel subclass under its `name` (usable as a class decorator)."""
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise FaultModelError(f"{cls!r} has no model name")
    _MODELS[name] = cls
    return cls


def add_shipped(cls: type[FaultModel]) -> None:
    """Add a shipped model class; a model registered before under the same name keeps its
    place."""
    _MODELS.setdefault(cls.name, cls)


def registered(name: Any) -> type[FaultModel] | None:
    """The class registered under ``name`` (None for a name not registered, or not a name)."""
    try:
        return _MODELS.get(name)
    except TypeError:  # an unhashable value where a name belongs
        return None


def registered_names() -> list[str]:
    return sorted(_MODELS)


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


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with the fields of ``over`` put in (nested tables merge field by field)."""
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def _resolve(d: Mapping[str, Any]) -> dict[str, Any]:
    """Expand a ``{"preset": name, ...overrides}`` mapping into full parameters."""
    if not isinstance(d, Mapping):
        raise FaultModelError(f"expected a mapping of parameters, got {type(d).__name__}")
    if "preset" in d:
        over = {k: v for k, v in d.items() if k != "preset"}
        return deep_merge(load_preset(d["preset"]), over)
    return dict(d)


def read_spec(path: str | Path) -> dict[str, Any]:
    """The parameters a TOML file (the preset format; a ``preset = "name"`` key is allowed)
    stands for."""
    text = read_text(path, "fault model file", limit=MAX_TOML_BYTES)
    return _resolve(load_toml(text, f"fault model file {path}"))


def spec_params(spec: str | Path | Mapping[str, Any]) -> dict[str, Any]:
    """The parameters a spec stands for: a preset name, a path to a ``.toml`` file, or a dict
    (``"preset"`` expanded, the dict's other fields merged over the preset's). The dict may
    lack a ``"model"`` key; the caller says what that means."""
    if isinstance(spec, str):
        if spec.endswith(".toml") and spec not in list_presets():
            return read_spec(spec)
        return _resolve(load_preset(spec))
    if isinstance(spec, Path):
        return read_spec(spec)
    if not isinstance(spec, Mapping):
        raise FaultModelError(
            f"a fault model spec is a preset name, a dict or a FaultModel; got {spec!r}")
    return _resolve(spec)
