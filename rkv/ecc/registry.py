"""Codec registry and spec parsing: ``get_codec("rs(255,223,interleave=8)")``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from rkv.ecc.base import Codec
from rkv.specs import Registry

C = TypeVar("C", bound=type[Codec])

_REGISTRY: Registry[Codec] = Registry("codec", Codec, "rs(255,223)")


def register_codec(cls: C) -> C:
    """Register a :class:`Codec` subclass under its ``codec_id`` (usable as a decorator)."""
    _REGISTRY.register(cls)
    return cls


def available_codecs() -> tuple[str, ...]:
    """The registered codec ids, sorted."""
    return _REGISTRY.available()


def codec_class(codec_id: str) -> type[Codec]:
    return _REGISTRY.cls(codec_id)


def parse_spec(spec: str) -> dict[str, Any]:
    """Turn ``"id(a, b, key=value)"`` into a config dict (positional args named per codec)."""
    return _REGISTRY.parse(spec)


def get_codec(spec: str | Mapping[str, Any] | Codec) -> Codec:
    """A codec from a string spec, a config dict or a codec (returned as is).

    Examples: ``"none"``, ``"xxh3"``, ``"crc32c"``, ``"rs(255,223)"``,
    ``"rs(255,223,interleave=8)"``, ``"bch(m=13,t=40)"``, ``"shardrs(k=16,m=2)"``,
    ``{"id": "rs", "n": 255, "k": 223, "interleave": 8}``. Raises :class:`ConfigError`.
    """
    return _REGISTRY.get(spec)
