"""Validation of parameter and config values: the one implementation rkv and faultmodels share.

Every function checks one value and returns it (converted where that is meaningful: a
number as ``float`` or ``int``), or raises ``error`` with a one-line message of the form
``"<name> must be <what>, got <value>"``. ``error`` defaults to :class:`FaultModelError`;
:mod:`rkv.checks` binds the same functions to :class:`rkv.errors.ConfigError` (faultmodels
is the lower package: it must not import rkv).

Rules shared by all: bools are never numbers; NaN is never a number; infinities are
rejected unless ``finite=False``. ``plain=True`` accepts only the builtin types a TOML or
JSON document holds (``int``, ``float``, ``dict``: what a config written back to TOML can
hold; integers then also refuse whole floats such as ``3.0``); otherwise any
:class:`numbers.Real` (NumPy scalars included) and any :class:`~collections.abc.Mapping`.
"""

from __future__ import annotations

import difflib
import math
import numbers
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from .errors import FaultModelError

T = TypeVar("T")


def check_keys(d: Any, allowed: Iterable[str], where: str, *, noun: str = "parameter",
               error: type[Exception] = FaultModelError) -> None:
    """Raise ``error`` naming every key of ``d`` not in ``allowed``, each with the closest
    allowed key when one is close (``unknown parameter(s) pe_cyles (did you mean 'pe_cycles'?)``),
    and the allowed ones: every config and parameter table of rkv and faultmodels checks its
    keys here."""
    if not isinstance(d, Mapping):
        raise error(f"{where}: expected a table of {noun}s, got {type(d).__name__}")
    allowed_set = set(allowed)
    unknown = sorted(str(k) for k in d if k not in allowed_set)
    if unknown:
        # difflib's ratio cut-off (0.6) catches a dropped, doubled or swapped letter
        # (pe_cyles, capacty_bytes) without suggesting an unrelated key.
        hints = [f"{k} (did you mean {m[0]!r}?)" if m else k for k in unknown
                 for m in [difflib.get_close_matches(k, sorted(map(str, allowed_set)), n=1)]]
        raise error(f"{where}: unknown {noun}(s) {', '.join(hints)}; "
                    f"allowed: {', '.join(sorted(map(str, allowed_set))) or 'none'}")


def _num(x: float) -> str:
    return str(int(x)) if isinstance(x, float) and x.is_integer() else str(x)


def _bounds(lo: float | None, hi: float | None, lo_open: bool, hi_open: bool) -> str:
    if lo is not None and hi is not None:
        return f"in {'(' if lo_open else '['}{_num(lo)}, {_num(hi)}{')' if hi_open else ']'}"
    if lo is not None:
        return f"{'>' if lo_open else '>='} {_num(lo)}"
    return f"{'<' if hi_open else '<='} {_num(hi) if hi is not None else ''}"


def as_float(value: Any, name: str, *, lo: float | None = None, hi: float | None = None,
             lo_open: bool = False, hi_open: bool = False, finite: bool = True,
             plain: bool = False, error: type[Exception] = FaultModelError) -> float:
    """A real number in the interval from ``lo`` to ``hi`` (each optional, closed unless
    ``lo_open``/``hi_open``); infinities only with ``finite=False``."""
    kinds = (int, float) if plain else (numbers.Real,)
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise error(f"{name} must be a number, got {value!r}")
    x = float(value)
    if math.isnan(x) or (finite and math.isinf(x)):
        raise error(f"{name} must be a finite number, got {value!r}")
    if (lo is not None and (x < lo or (lo_open and x == lo))) or (
            hi is not None and (x > hi or (hi_open and x == hi))):
        raise error(f"{name} must be {_bounds(lo, hi, lo_open, hi_open)}, got {value!r}")
    return x


def as_int(value: Any, name: str, *, lo: int | None = None, hi: int | None = None,
           plain: bool = False, error: type[Exception] = FaultModelError) -> int:
    """An integer in [lo, hi] (each optional); whole floats such as ``3.0`` count unless
    ``plain``."""
    whole = not plain and isinstance(value, float) and value.is_integer()
    integral = isinstance(value, int) if plain else isinstance(value, numbers.Integral)
    if isinstance(value, bool) or not (integral or whole):
        raise error(f"{name} must be an integer, got {value!r}")
    x = int(value)
    if (lo is not None and x < lo) or (hi is not None and x > hi):
        raise error(f"{name} must be {_bounds(lo, hi, False, False)}, got {value!r}")
    return x


def as_probability(value: Any, name: str, *, plain: bool = False,
                   error: type[Exception] = FaultModelError) -> float:
    """A probability: a real number in [0, 1]."""
    kinds = (int, float) if plain else (numbers.Real,)
    if isinstance(value, bool) or not isinstance(value, kinds) or not 0.0 <= float(value) <= 1.0:
        raise error(f"{name} must be a probability in [0, 1], got {value!r}")
    return float(value)


def as_bool(value: Any, name: str, *, error: type[Exception] = FaultModelError) -> bool:
    """``True`` or ``False`` (not 0, 1, or a string such as ``"yes"``)."""
    if not isinstance(value, bool):
        raise error(f"{name} must be true or false, got {value!r}")
    return value


def _same_kind(value: Any, choice: Any) -> bool:
    # 1 == True == 1.0 in Python; a choice matches only a value of its own kind.
    return isinstance(value, bool) == isinstance(choice, bool) and (
        isinstance(value, type(choice)) or isinstance(choice, type(value)))


def _alternatives(choices: tuple[Any, ...]) -> str:
    shown = [repr(c) for c in choices]
    if len(shown) == 1:
        return shown[0]
    if len(shown) == 2:
        return f"{shown[0]} or {shown[1]}"
    return f"one of {', '.join(shown[:-1])} or {shown[-1]}"


def one_of(value: Any, choices: Iterable[T], name: str, *,
           error: type[Exception] = FaultModelError) -> T:
    """One of ``choices``, of the same type as that choice (``True`` is not ``1``)."""
    options = tuple(choices)
    for c in options:
        if _same_kind(value, c) and value == c:
            return c
    raise error(f"{name} must be {_alternatives(options)}, got {value!r}")


def as_str(value: Any, name: str, *, nonempty: bool = False, what: str = "",
           error: type[Exception] = FaultModelError) -> str:
    """A string; with ``nonempty`` one that is not blank. ``what`` says what it should be
    (default: "a string", "a non-empty string")."""
    if not isinstance(value, str) or (nonempty and not value.strip()):
        what = what or ("a non-empty string" if nonempty else "a string")
        raise error(f"{name} must be {what}, got {value!r}")
    return value


def as_table(value: Any, name: str, *, what: str = "a table", plain: bool = False,
             error: type[Exception] = FaultModelError) -> Mapping[str, Any]:
    """A mapping (with ``plain``, a ``dict``). ``what`` says what it should hold."""
    if not isinstance(value, dict if plain else Mapping):
        raise error(f"{name} must be {what}, got {type(value).__name__}")
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


__all__ = ["as_bool", "as_float", "as_int", "as_probability", "as_str", "as_table",
           "check_hours", "check_keys", "check_nbytes", "one_of", "split_params"]
