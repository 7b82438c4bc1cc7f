"""The table of named eviction policies that ``@register`` fills, and reading their specs.

The bottom of the package's lookup side: policy modules import :func:`register` from here and
nothing above it, so registering never imports the registry (:mod:`policies.registry`, which
imports the built-in policies before it looks a name up). A spec is a name, optionally
followed by keyword arguments in parentheses (numbers, booleans, strings), in rkv's one spec
grammar (:mod:`policies.spec`); :func:`build` turns one into an object through a table of
constructors.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, TypeVar

from policies.base import EvictionPolicy, PolicyError
from policies.spec import SpecError, parse_call

P = TypeVar("P", bound=type[EvictionPolicy])
T = TypeVar("T")
_TABLE: dict[str, type[EvictionPolicy]] = {}
#: The registered eviction policies by name, in registration order (read-only).
REGISTERED: Mapping[str, type[EvictionPolicy]] = MappingProxyType(_TABLE)


def register(name: str) -> Callable[[P], P]:
    """Class decorator: make an eviction policy available under ``name``."""

    def deco(cls: P) -> P:
        if name in _TABLE and _TABLE[name] is not cls:
            raise PolicyError(f"policy {name!r} is registered twice")
        cls.name = name
        _TABLE[name] = cls
        return cls

    return deco


def parse_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """``"arc"`` -> ("arc", {}); ``"s3fifo(small=0.1)"`` -> ("s3fifo", {"small": 0.1}). The
    grammar is rkv's one spec grammar (:mod:`policies.spec`); policies take keyword
    arguments only (their capacity is the one positional argument, given by the cache)."""
    try:
        call = parse_call(spec, "policy spec")
    except SpecError as exc:
        raise PolicyError(f"{exc} (expected name or name(key=value, ...))") from None
    if call.args:
        raise PolicyError(f"policy arguments must be key=value pairs: {spec!r}")
    return call.name, dict(call.kwargs)


def build(spec: str, table: Mapping[str, Callable[..., T]], kind: str, *args: Any) -> T:
    """``table[name](*args, **params)`` for a spec, with PolicyError for an unknown name or
    bad parameters (admission and prefetch policies use it; eviction policies register)."""
    name, params = parse_spec(spec)
    cls = table.get(name)
    if cls is None:
        raise PolicyError(f"unknown {kind} policy {name!r} (known: {', '.join(sorted(table))})")
    try:
        return cls(*args, **params)
    except TypeError as exc:
        raise PolicyError(f"bad parameters for {kind} {name!r}: {exc}") from exc
