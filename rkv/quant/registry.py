"""Quantizer registry and spec parsing: ``get_quantizer("kivi(bits=2,group=32)")``."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, TypeVar

from rkv.errors import ConfigError
from rkv.quant.base import Quantizer

_REGISTRY: dict[str, type[Quantizer]] = {}

Q = TypeVar("Q", bound=type[Quantizer])

_SPEC_RE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(?:\((.*)\))?\s*$", re.DOTALL)
_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_INT_RE = re.compile(r"^[+-]?\d+$")


def register_quantizer(cls: Q) -> Q:
    """Register a :class:`Quantizer` subclass under its ``codec_id`` (usable as a decorator)."""
    qid = getattr(cls, "codec_id", None)
    if not isinstance(qid, str) or not _KEY_RE.match(qid):
        raise ConfigError(f"quantizer class {cls.__name__} has no valid codec_id")
    old = _REGISTRY.get(qid)
    if old is not None and old is not cls:
        raise ConfigError(f"quantizer id {qid!r} is already registered to {old.__name__}")
    _REGISTRY[qid] = cls
    return cls


def available_quantizers() -> tuple[str, ...]:
    """The registered quantizer ids, sorted."""
    return tuple(sorted(_REGISTRY))


def quantizer_class(qid: str) -> type[Quantizer]:
    try:
        return _REGISTRY[qid]
    except KeyError:
        raise ConfigError(
            f"unknown quantizer {qid!r}; known: {', '.join(available_quantizers())}"
        ) from None


def _parse_value(text: str) -> Any:
    text = text.strip()
    if _INT_RE.match(text):
        return int(text)
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


def parse_spec(spec: str) -> dict[str, Any]:
    """Turn ``"id(a, key=value)"`` into a config dict (positional args named per quantizer)."""
    m = _SPEC_RE.match(spec)
    if m is None:
        raise ConfigError(f"malformed quantizer spec {spec!r}; expected e.g. 'kivi(bits=4)'")
    qid = m.group(1).lower()
    cls = quantizer_class(qid)
    cfg: dict[str, Any] = {"id": qid}
    body = m.group(2)
    if body is None or not body.strip():
        return cfg
    seen_kw = False
    for pos, part in enumerate(body.split(",")):
        part = part.strip()
        if not part:
            raise ConfigError(f"empty argument in quantizer spec {spec!r}")
        if "=" in part:
            key, _, val = part.partition("=")
            key = key.strip()
            if not _KEY_RE.match(key):
                raise ConfigError(f"bad parameter name {key!r} in quantizer spec {spec!r}")
            if key in cfg:
                raise ConfigError(f"parameter {key!r} given twice in quantizer spec {spec!r}")
            cfg[key] = _parse_value(val)
            seen_kw = True
        else:
            if seen_kw:
                raise ConfigError(f"positional argument after keyword in quantizer spec {spec!r}")
            if pos >= len(cls.positional):
                raise ConfigError(
                    f"too many positional arguments in quantizer spec {spec!r}; {qid} takes "
                    f"{', '.join(cls.positional) or 'none'}"
                )
            cfg[cls.positional[pos]] = _parse_value(part)
    return cfg


def get_quantizer(spec: str | Mapping[str, Any] | Quantizer) -> Quantizer:
    """A quantizer from a string spec, a config dict or a quantizer (returned as is).

    Examples: ``"none"``, ``"kivi"`` (4 bits, group 32), ``"kivi(bits=2)"``, ``"kivi(8, 64)"``,
    ``"kivi(bits=16)"`` (= ``none``), ``{"id": "kivi", "bits": 8, "group": 32}``.
    Raises :class:`ConfigError`.
    """
    if isinstance(spec, Quantizer):
        return spec
    if isinstance(spec, str):
        cfg: Mapping[str, Any] = parse_spec(spec)
    elif isinstance(spec, Mapping):
        cfg = spec
        if "id" not in cfg or not isinstance(cfg["id"], str):
            raise ConfigError("quantizer config needs a string 'id'")
    else:
        raise ConfigError(f"cannot make a quantizer from {type(spec).__name__}")
    return quantizer_class(cfg["id"]).from_config(cfg)
