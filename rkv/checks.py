"""Config value checks: :mod:`faultmodels.checks` bound to :class:`~rkv.errors.ConfigError`.

Every rkv config (engine, tiers, remote tiers, placement, scrub, campaigns over time,
replays, sweep values) validates its values through these functions, and every fault model
through :mod:`faultmodels.checks`: one implementation, one message form
(``"<name> must be <what>, got <value>"``). Numbers and tables are ``plain`` by default:
only the builtin types a TOML document holds (``int``, ``float``, ``dict``), since configs
are written back to TOML and JSON; integers then also refuse whole floats such as ``3.0``.
Bools are never numbers, NaN never, infinities only with ``finite=False``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from faultmodels import checks as _c
from rkv.errors import ConfigError

T = TypeVar("T")


def check_keys(d: Any, allowed: Iterable[str], where: str, *, noun: str = "key") -> None:
    """Raise ConfigError naming every key of ``d`` not in ``allowed``, each with the closest
    allowed key when one is close (``unknown key(s) pe_cyles (did you mean 'pe_cycles'?)``),
    and the allowed ones: the one check of unknown keys, for every rkv table."""
    _c.check_keys(d, allowed, where, noun=noun, error=ConfigError)


def as_float(value: Any, name: str, *, lo: float | None = None, hi: float | None = None,
             lo_open: bool = False, hi_open: bool = False, finite: bool = True,
             plain: bool = True) -> float:
    """A real number between ``lo`` and ``hi`` (each optional, closed unless ``*_open``)."""
    return _c.as_float(value, name, lo=lo, hi=hi, lo_open=lo_open, hi_open=hi_open,
                       finite=finite, plain=plain, error=ConfigError)


def as_int(value: Any, name: str, *, lo: int | None = None, hi: int | None = None,
           plain: bool = True) -> int:
    """An integer in [lo, hi] (each optional)."""
    return _c.as_int(value, name, lo=lo, hi=hi, plain=plain, error=ConfigError)


def as_probability(value: Any, name: str, *, plain: bool = True) -> float:
    """A real number in [0, 1]."""
    return _c.as_probability(value, name, plain=plain, error=ConfigError)


def as_bool(value: Any, name: str) -> bool:
    """``True`` or ``False``."""
    return _c.as_bool(value, name, error=ConfigError)


def one_of(value: Any, choices: Iterable[T], name: str) -> T:
    """One of ``choices`` (of its type: ``True`` is not ``1``)."""
    return _c.one_of(value, choices, name, error=ConfigError)


def as_str(value: Any, name: str, *, nonempty: bool = False, what: str = "") -> str:
    """A string (``nonempty``: not blank); ``what`` says what it should be."""
    return _c.as_str(value, name, nonempty=nonempty, what=what, error=ConfigError)


def as_table(value: Any, name: str, *, what: str = "a table",
             plain: bool = True) -> Mapping[str, Any]:
    """A table (``plain``: a ``dict``; else any mapping)."""
    return _c.as_table(value, name, what=what, plain=plain, error=ConfigError)


__all__ = ["as_bool", "as_float", "as_int", "as_probability", "as_str", "as_table",
           "check_keys", "one_of"]
