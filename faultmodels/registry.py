"""Model registry and loading: a spec (a preset name, a path to a ``.toml`` file, a dict or a
model) to a model, and a model back to a file; and the `accelerated` model.

The names a spec may use, the presets and the registered model classes, are in
:mod:`faultmodels.catalog`; this module adds the shipped model classes to them on its first
lookup. The accelerated model lives here because its base is any model a spec may name:
building one from its parameters is a lookup in this registry, which lists it among the
shipped models.

Accelerated testing: a model whose fault events are ``ber_multiplier`` times as frequent.

Field fault rates are far too low for a campaign or a quality run to see what protection does
(a healthy SSD loses a 192 KiB block about twice in a billion days). :func:`accelerate` wraps
any model so that every one of its event classes has ``x`` times its expected count (a
Poisson class's mean times x, a binomial class's per-unit probability times x) with the same
footprints: the mix of fault kinds the reader sees is kept, only their frequency changes, the
same way for every tier. For ``raw-ber`` this is ``ber`` times x exactly; for DRAM and CXL the
FIT rates times x (coincidences of correctable faults included, at x, not x squared); for
NAND behind its device ECC the lost sectors, miscorrections, latent sector errors and silent
corruption times x (not the raw bit error rate, which would fall off the ECC's cliff; raise
``pe_cycles`` or ``hours`` for that). Rare outcomes therefore grow close to linearly in x
(exactly for one-event outcomes), which keeps extrapolation back to x = 1 honest.

The wrapped model is an ordinary :class:`FaultModel` (``model = "accelerated"``, with
``ber_multiplier`` and ``base`` parameters), so sampling, importance sampling and
:func:`rkv.reliability.analytic.predict` all see the same accelerated rates. Latent faults
(``latent_hours`` of a DRAM or CXL base) are part of the base's classes, so they are
accelerated with them; ``with_latent_hours`` changes the base's window.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from .base import EventClass, FaultModel, binomial_class, poisson_class
from .catalog import add_shipped, read_spec, registered, registered_names, spec_params
from .checks import as_float, split_params
from .errors import FaultModelError
from .rawber import RawBerModel

__all__ = [
    "AcceleratedModel",
    "accelerate",
    "check_multiplier",
    "dump",
    "get_model",
    "load",
    "model_class",
    "model_names",
]

_builtins_loaded = False


def _load_builtins() -> None:
    """Register the shipped models (once, on first lookup: the package loads lazily). A
    model registered before under the same name keeps its place."""
    global _builtins_loaded
    if _builtins_loaded:
        return
    _builtins_loaded = True
    # Here, not at the top: check_multiplier and dump need none of the DRAM, CXL and NAND
    # models, whose import costs about 0.1 s.
    from .cxl import CxlModel
    from .dram import DramModel
    from .nand import NandModel

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


def check_multiplier(x: Any) -> float:
    """``x`` as a float if it is a finite number > 0, else :class:`FaultModelError`."""
    return as_float(x, "ber_multiplier", lo=0.0, lo_open=True)


@dataclass(frozen=True)
class AcceleratedModel(FaultModel):
    """``base`` with every event class ``ber_multiplier`` times as frequent."""

    name: ClassVar[str] = "accelerated"

    base: FaultModel = field(default_factory=RawBerModel)
    ber_multiplier: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.base, FaultModel):
            raise FaultModelError(f"accelerated.base must be a fault model, got {self.base!r}")
        object.__setattr__(self, "ber_multiplier", check_multiplier(self.ber_multiplier))

    def params(self) -> dict[str, Any]:
        return {"model": self.name, "ber_multiplier": self.ber_multiplier,
                "base": self.base.params()}

    @classmethod
    def from_params(cls, d: Mapping[str, Any]) -> AcceleratedModel:
        kw = split_params(d, cls.name, ("base", "ber_multiplier"))
        if "base" not in kw:
            raise FaultModelError("accelerated model: 'base' (the model to accelerate) is "
                                  "missing")
        return cls(get_model(kw["base"]), kw.get("ber_multiplier", 1.0))

    @property
    def latent_hours(self) -> float:
        return self.base.latent_hours

    def with_latent_hours(self, hours: float) -> AcceleratedModel:
        """The base model with its latent window changed, accelerated as before."""
        return AcceleratedModel(self.base.with_latent_hours(hours), self.ber_multiplier)

    def _scaled(self, c: EventClass) -> EventClass:
        x = self.ber_multiplier
        what = c.rate.label or c.rate.kind
        if c.realize is None or c.law is None:
            raise FaultModelError(f"{self.base.name}: event class {what!r} has no count law "
                                  "to scale (e.g. nand overdispersion > 0)")
        if c.law == "poisson":
            return poisson_class(dataclasses.replace(c.rate, mean=c.mu * x), c.realize)
        p = c.p * x
        if p > 1.0:
            raise FaultModelError(f"event class {what!r}: per-unit probability {c.p:.3g} "
                                  f"times {x:g} exceeds 1")
        return binomial_class(dataclasses.replace(c.rate, mean=c.units * p), c.units, p,
                              c.realize)

    def _build_classes(self, nbytes: int, hours: float) -> list[EventClass]:
        return [self._scaled(c) for c in self.base.event_classes(nbytes, hours)]

    def _bit_probs(self, hours: float) -> tuple[float, float]:
        """First order in the base model's probabilities (exact while they are small)."""
        pu, pf = self.base._bit_probs(hours)
        x = self.ber_multiplier
        return min(1.0, x * pu), min(1.0, x * pf)


def accelerate(model: FaultModel | str | Mapping[str, Any], ber_multiplier: Any = 1.0
               ) -> FaultModel:
    """``model`` (a model or a ``get_model`` spec) with every fault event class
    ``ber_multiplier`` times as frequent (:class:`AcceleratedModel`; multipliers of an
    accelerated model multiply); the model itself when the multiplier is 1. A multiplier
    that is not a finite number > 0 is a :class:`FaultModelError`, and so is one that takes
    a per-unit probability past 1 (when the model's classes are built)."""
    m = get_model(model)
    x = check_multiplier(ber_multiplier)
    if x == 1.0:
        return m
    if isinstance(m, AcceleratedModel):
        return AcceleratedModel(m.base, m.ber_multiplier * x)
    return AcceleratedModel(m, x)
