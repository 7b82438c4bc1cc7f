"""Codec registry and spec parsing: ``get_codec("rs(255,223,interleave=8)")``."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, TypeVar

from rkv.ecc.base import Codec
from rkv.errors import ConfigError

_REGISTRY: dict[str, type[Codec]] = {}

C = TypeVar("C", bound=type[Codec])

_SPEC_RE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(?:\((.*)\))?\s*$", re.DOTALL)
_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_INT_RE = re.compile(r"^[+-]?\d+$")


def register_codec(cls: C) -> C:
    """Register a :class:`Codec` subclass under its ``codec_id`` (usable as a decorator)."""
    cid = getattr(cls, "codec_id", None)
    if not isinstance(cid, str) or not _KEY_RE.match(cid):
        raise ConfigError(f"codec class {cls.__name__} has no valid codec_id")
    old = _REGISTRY.get(cid)
    if old is not None and old is not cls:
        raise ConfigError(f"codec id {cid!r} is already registered to {old.__name__}")
    _REGISTRY[cid] = cls
    return cls


def available_codecs() -> tuple[str, ...]:
    """The registered codec ids, sorted."""
    return tuple(sorted(_REGISTRY))


def codec_class(codec_id: str) -> type[Codec]:
    try:
        return _REGISTRY[codec_id]
    except KeyError:
        raise ConfigError(
            f"unknown codec {codec_id!r}; known: {', '.join(available_codecs())}"
        ) from None


def _parse_value(text: str) -> Any:
    text = text.strip()
    if _INT_RE.match(text):
        return int(text)
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


def parse_spec(spec: str) -> dict[str, Any]:
    """Turn ``"id(a, b, key=value)"`` into a config dict (positional args named per codec)."""
    m = _SPEC_RE.match(spec)
    if m is None:
        raise ConfigError(f"malformed codec spec {spec!r}; expected e.g. 'rs(255,223)'")
    cid = m.group(1).lower()
    cls = codec_class(cid)
    cfg: dict[str, Any] = {"id": cid}
    body = m.group(2)
    if body is None or not body.strip():
        return cfg
    seen_kw = False
    for pos, part in enumerate(body.split(",")):
        part = part.strip()
        if not part:
            raise ConfigError(f"empty argument in codec spec {spec!r}")
        if "=" in part:
            key, _, val = part.partition("=")
            key = key.strip()
            if not _KEY_RE.match(key):
                raise ConfigError(f"bad parameter name {key!r} in codec spec {spec!r}")
            if key in cfg:
                raise ConfigError(f"parameter {key!r} given twice in codec spec {spec!r}")
            cfg[key] = _parse_value(val)
            seen_kw = True
        else:
            if seen_kw:
                raise ConfigError(f"positional argument after keyword in codec spec {spec!r}")
            if pos >= len(cls.positional):
                raise ConfigError(
                    f"too many positional arguments in codec spec {spec!r}; {cid} takes "
                    f"{', '.join(cls.positional) or 'none'}"
                )
            cfg[cls.positional[pos]] = _parse_value(part)
    return cfg


def get_codec(spec: str | Mapping[str, Any] | Codec) -> Codec:
    """A codec from a string spec, a config dict or a codec (returned as is).

    Examples: ``"none"``, ``"xxh3"``, ``"crc32c"``, ``"rs(255,223)"``,
    ``"rs(255,223,interleave=8)"``, ``"bch(m=13,t=40)"``, ``"shardrs(k=16,m=2)"``,
    ``{"id": "rs", "n": 255, "k": 223, "interleave": 8}``. Raises :class:`ConfigError`.
    """
    if isinstance(spec, Codec):
        return spec
    if isinstance(spec, str):
        cfg: Mapping[str, Any] = parse_spec(spec)
    elif isinstance(spec, Mapping):
        cfg = spec
        if "id" not in cfg or not isinstance(cfg["id"], str):
            raise ConfigError("codec config needs a string 'id'")
    else:
        raise ConfigError(f"cannot make a codec from {type(spec).__name__}")
    return codec_class(cfg["id"]).from_config(cfg)
