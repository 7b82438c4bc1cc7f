"""Model registry and loading: a spec (a preset name, a path to a ``.toml`` file, a dict or a
model) to a model, and a model back to a file.

The names a spec may use, the presets and the registered model classes, are in
:mod:`faultmodels.catalog`; this module adds the shipped model classes to them on its first
lookup.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .base import FaultModel
from .catalog import add_shipped, read_spec, registered, registered_names, spec_params
from .errors import FaultModelError

__all__ = ["dump", "get_model", "load", "model_class", "model_names"]

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
        add_shipped(cls)


def model_names() -> list[str]:
    _load_builtins()
    return registered_names()


def model_class(name: str) -> type[FaultModel]:
    _load_builtins()
    cls = registered(name)
    if cls is None:
        raise FaultModelError(
            f"unknown fault model {name!r}; known: {', '.join(model_names())}")
    return cls


def get_model(spec: str | Mapping[str, Any] | FaultModel) -> FaultModel:
    """A model from a preset name (``"dram-ddr4"``), a path to a ``.toml`` file, a dict
    (``{"preset": "nvme-tlc", "pe_cycles": 1000}`` overrides a preset's fields, nested tables
    merge; ``{"model": "raw-ber", "ber": 1e-6}`` builds directly) or a FaultModel (returned)."""
    if isinstance(spec, FaultModel):
        return spec
    return _build(spec_params(spec))


def _build(d: dict[str, Any]) -> FaultModel:
    if "model" not in d:
        raise FaultModelError(
            "a fault model dict needs a 'model' key (one of "
            f"{', '.join(model_names())}) or a 'preset' key")
    return model_class(d["model"]).from_params(d)


def load(path: str | Path) -> FaultModel:
    """A model from a TOML file (the preset format; a ``preset = "name"`` key is allowed)."""
    return _build(read_spec(path))


def dump(model: FaultModel, path: str | Path) -> None:
    """Write `model.to_toml()` to `path`."""
    Path(path).write_text(model.to_toml(), encoding="utf-8")
