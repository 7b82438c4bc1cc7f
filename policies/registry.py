"""Policies by name: ``make_policy("s3fifo(small=0.1)", capacity)``.

A spec is a registered name, optionally followed by keyword arguments in parentheses whose
values are Python literals (numbers, strings, booleans). Parameters are validated once, by
the policy's constructor; an unknown name or argument raises :class:`PolicyError`.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from policies.base import EvictionPolicy, PolicyError

P = TypeVar("P", bound=type[EvictionPolicy])
T = TypeVar("T")
_REGISTRY: dict[str, type[EvictionPolicy]] = {}
_SPEC = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_-]*)\s*(?:\((.*)\))?\s*$", re.S)


def register(name: str) -> Callable[[P], P]:
    """Class decorator: make an eviction policy available under ``name``."""

    def deco(cls: P) -> P:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise PolicyError(f"policy {name!r} is registered twice")
        cls.name = name
        _REGISTRY[name] = cls
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


def make_policy(spec: str, capacity: int) -> EvictionPolicy:
    """A fresh eviction policy from its spec, for a cache of ``capacity`` bytes."""
    import policies  # noqa: F401  (importing the package registers the built-in policies)

    name, params = parse_spec(spec)
    cls = _REGISTRY.get(name)
    if cls is None:
        raise PolicyError(f"unknown policy {name!r} (known: {', '.join(available())})")
    try:
        return cls(capacity, **params)  # type: ignore[call-arg]
    except TypeError as exc:
        raise PolicyError(f"bad parameters for policy {name!r}: {exc}") from exc


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


def available() -> list[str]:
    return sorted(_REGISTRY)
