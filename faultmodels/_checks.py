"""Parameter validation helpers shared by the models (internal)."""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping
from typing import Any

from .errors import FaultModelError


def check_keys(d: Mapping[str, Any], allowed: Iterable[str], where: str) -> None:
    """Raise FaultModelError naming every key of `d` that is not in `allowed`."""
    if not isinstance(d, Mapping):
        raise FaultModelError(f"{where}: expected a mapping of parameters, got {type(d).__name__}")
    allowed_set = set(allowed)
    unknown = sorted(str(k) for k in d if k not in allowed_set)
    if unknown:
        raise FaultModelError(
            f"{where}: unknown parameter(s) {', '.join(unknown)}; "
            f"allowed: {', '.join(sorted(allowed_set))}"
        )


def as_float(
    value: Any,
    name: str,
    *,
    lo: float | None = None,
    hi: float | None = None,
    lo_open: bool = False,
    hi_open: bool = False,
    finite: bool = True,
) -> float:
    """A real number in [lo, hi] (bounds optional, open if asked); bools are rejected."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise FaultModelError(f"{name} must be a number, got {value!r}")
    x = float(value)
    if math.isnan(x) or (finite and math.isinf(x)):
        raise FaultModelError(f"{name} must be a finite number, got {value!r}")
    if lo is not None and (x < lo or (lo_open and x == lo)):
        op = ">" if lo_open else ">="
        raise FaultModelError(f"{name} must be {op} {lo}, got {value!r}")
    if hi is not None and (x > hi or (hi_open and x == hi)):
        op = "<" if hi_open else "<="
        raise FaultModelError(f"{name} must be {op} {hi}, got {value!r}")
    return x


def as_int(value: Any, name: str, *, lo: int | None = None, hi: int | None = None) -> int:
    """An integer in [lo, hi]; bools and non-integral floats are rejected."""
    if isinstance(value, bool):
        raise FaultModelError(f"{name} must be an integer, got {value!r}")
    if isinstance(value, numbers.Integral) or (isinstance(value, float) and value.is_integer()):
        x = int(value)
    else:
        raise FaultModelError(f"{name} must be an integer, got {value!r}")
    if lo is not None and x < lo:
        raise FaultModelError(f"{name} must be >= {lo}, got {value!r}")
    if hi is not None and x > hi:
        raise FaultModelError(f"{name} must be <= {hi}, got {value!r}")
    return x


def as_bool(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise FaultModelError(f"{name} must be true or false, got {value!r}")
    return value


def as_choice(value: Any, name: str, choices: Iterable[str]) -> str:
    options = tuple(choices)
    if not isinstance(value, str) or value not in options:
        raise FaultModelError(f"{name} must be one of {', '.join(options)}; got {value!r}")
    return value


def as_str(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise FaultModelError(f"{name} must be a string, got {value!r}")
    return value


def check_nbytes(nbytes: Any) -> int:
    return as_int(nbytes, "nbytes", lo=0)


def check_hours(hours: Any) -> float:
    return as_float(hours, "hours", lo=0.0)


def split_params(d: Mapping[str, Any], model: str, fields: Iterable[str]) -> dict[str, Any]:
    """Check `d` is a parameter mapping for `model` and return the field values it sets."""
    names = tuple(fields)
    check_keys(d, (*names, "model"), f"{model} model")
    got = d.get("model", model)
    if got != model:
        raise FaultModelError(f"parameters are for model {got!r}, not {model!r}")
    return {k: d[k] for k in names if k in d}
