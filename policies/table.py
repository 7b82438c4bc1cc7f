"""The table of named eviction policies that ``@register`` fills, and the spec grammar.

The bottom of the package's lookup side: policy modules import :func:`register` from here and
nothing above it, so registering never imports the registry (:mod:`policies.registry`, which
imports the built-in policies before it looks a name up). A spec is a name, optionally
followed by keyword arguments in parentheses whose values are Python literals (numbers,
strings, booleans); :func:`build` turns one into an object through a table of constructors.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, TypeVar

from policies.base import EvictionPolicy, PolicyError

P = TypeVar("P", bound=type[EvictionPolicy])
T = TypeVar("T")
_TABLE: dict[str, type[EvictionPolicy]] = {}
#: The registered eviction policies by name, in registration order (read-only).
REGISTERED: Mapping[str, type[EvictionPolicy]] = MappingProxyType(_TABLE)
_SPEC = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_-]*)\s*(?:\((.*)\))?\s*$", re.S)


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
    """``"arc"`` -> ("arc", {}); ``"s3fifo(small=0.1)"`` -> ("s3fifo", {"small": 0.1})."""
    m = _SPEC.match(spec) if isinstance(spec, str) else None
    if m is None:
        raise PolicyError(f"bad policy spec {spec!r} (expected name or name(key=value, ...))")
    name, args = m.group(1).lower(), (m.group(2) or "").strip()
    params: dict[str, Any] = {}
    if args:
        try:
            call = ast.parse(f"f({args})", mode="eval").body
        except SyntaxError as exc:
            raise PolicyError(f"bad arguments in policy spec {spec!r}: {exc.msg}") from exc
        if not isinstance(call, ast.Call) or call.args:
            raise PolicyError(f"policy arguments must be key=value pairs: {spec!r}")
        for kw in call.keywords:
            try:
                params[str(kw.arg)] = ast.literal_eval(kw.value)
            except ValueError as exc:
                raise PolicyError(f"argument {kw.arg!r} of {spec!r} is not a literal") from exc
    return name, params


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
