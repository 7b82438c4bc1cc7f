"""Accelerated testing: a model whose raw fault rates are multiplied by a factor.

Field fault rates are far too low for a campaign or a quality run to see what protection does
(a healthy SSD loses a 192 KiB block about twice in a billion days). Accelerated testing
raises the rates of the physical faults and lets every model derive what follows from them,
so coincidences and device-ECC failures grow faster than linearly, as they would on a worse
medium. :func:`accelerate` returns a model *of the same class* with those rates scaled: its
parameters say what was tested, and everything that takes a model (sampling, importance
sampling, :func:`rkv.faults.reliability.predict`) sees the same accelerated rates.

What ``ber_multiplier`` x multiplies, per model:

* ``raw-ber``: ``ber`` (a probability must stay <= 1 unless ``per_hour``);
* ``dram``: ``fit_multiplier`` (every mode's FIT rate);
* ``cxl``: ``media_multiplier`` (the media's FIT rates), ``controller_fit`` and ``link_ber``;
* ``nand``: the raw bit error rate (``rber_fresh`` x for the power law, ``rber_d`` + ln x for
  the ``luo`` form; RBER stays capped at 0.5), ``lse_rate`` and ``silent_rate``.

A model class of one's own can take part by defining ``scaled_by(x) -> FaultModel``.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping
from typing import Any

from .base import FaultModel
from .cxl import CxlModel
from .dram import DramModel
from .errors import FaultModelError
from .nand import NandModel
from .rawber import RawBerModel

__all__ = ["accelerate", "check_multiplier"]


def check_multiplier(x: Any) -> float:
    """``x`` as a float if it is a finite number > 0, else :class:`FaultModelError`."""
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise FaultModelError(f"ber_multiplier must be a number, got {x!r}")
    v = float(x)
    if not (v > 0.0 and math.isfinite(v)):
        raise FaultModelError(f"ber_multiplier must be a finite number > 0, got {x!r}")
    return v


def _scale(m: FaultModel, x: float) -> FaultModel:
    replace: Any = dataclasses.replace
    if isinstance(m, RawBerModel):
        return replace(m, ber=m.ber * x)  # type: ignore[no-any-return]
    if isinstance(m, DramModel):
        return replace(m, fit_multiplier=m.fit_multiplier * x)  # type: ignore[no-any-return]
    if isinstance(m, CxlModel):
        return replace(m, media_multiplier=m.media_multiplier * x,  # type: ignore[no-any-return]
                       controller_fit=m.controller_fit * x, link_ber=m.link_ber * x)
    if isinstance(m, NandModel):
        rber = ({"rber_fresh": m.rber_fresh * x} if m.rber_form == "power"
                else {"rber_d": m.rber_d + math.log(x)})
        return replace(m, lse_rate=m.lse_rate * x,  # type: ignore[no-any-return]
                       silent_rate=m.silent_rate * x, **rber)
    hook = getattr(m, "scaled_by", None)
    if callable(hook):
        got = hook(x)
        if not isinstance(got, FaultModel):
            raise FaultModelError(f"{type(m).__name__}.scaled_by must return a FaultModel")
        return got
    raise FaultModelError(f"fault model {m.name!r} has no rate multiplier (define "
                          "scaled_by(x) on its class)")


def accelerate(model: FaultModel | str | Mapping[str, Any], ber_multiplier: Any = 1.0
               ) -> FaultModel:
    """``model`` (a model or a ``get_model`` spec) with its raw fault rates multiplied by
    ``ber_multiplier``; the model itself when the multiplier is 1. A multiplier that is not
    a finite number > 0, or that takes a probability past its bound, is a
    :class:`FaultModelError`."""
    from .registry import get_model

    m = get_model(model)
    x = check_multiplier(ber_multiplier)
    if x == 1.0:
        return m
    try:
        return _scale(m, x)
    except FaultModelError as exc:
        raise FaultModelError(f"ber_multiplier {x:g} on {m.name!r}: {exc}") from None
