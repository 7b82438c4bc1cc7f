"""Quantizer registry and spec parsing: ``get_quantizer("kivi(bits=2,group=32)")``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from rkv.quant.base import Quantizer
from rkv.specs import Registry

Q = TypeVar("Q", bound=type[Quantizer])

_REGISTRY: Registry[Quantizer] = Registry("quantizer", Quantizer, "kivi(bits=4)")


def register_quantizer(cls: Q) -> Q:
    """Register a :class:`Quantizer` subclass under its ``codec_id`` (usable as a decorator)."""
    _REGISTRY.register(cls)
    return cls


def available_quantizers() -> tuple[str, ...]:
    """The registered quantizer ids, sorted."""
    return _REGISTRY.available()


def quantizer_class(qid: str) -> type[Quantizer]:
    return _REGISTRY.cls(qid)


def parse_spec(spec: str) -> dict[str, Any]:
    """Turn ``"id(a, key=value)"`` into a config dict (positional args named per quantizer)."""
    return _REGISTRY.parse(spec)


def get_quantizer(spec: str | Mapping[str, Any] | Quantizer) -> Quantizer:
    """A quantizer from a string spec, a config dict or a quantizer (returned as is).

    Examples: ``"none"``, ``"kivi"`` (4 bits, group 32), ``"kivi(bits=2)"``, ``"kivi(8, 64)"``,
    ``"kivi(bits=16)"`` (= ``none``), ``{"id": "kivi", "bits": 8, "group": 32}``.
    Raises :class:`ConfigError`.
    """
    return _REGISTRY.get(spec)
