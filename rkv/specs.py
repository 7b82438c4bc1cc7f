"""One registry of named, configurable stages (codecs, quantizers) and their spec strings.

A spec string is ``id`` or ``id(a, b, key=value)``, in the grammar policies use too
(:mod:`policies.spec`): positional arguments are named by the class's ``positional`` tuple,
numbers and booleans are parsed, quotes stripped. ``Registry.get`` accepts a
spec string, a config dict with an ``id``, or an instance (returned as is).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any, Generic, TypeVar, cast

from policies.spec import SpecError, parse_call
from rkv.checks import as_int, as_table, one_of
from rkv.checks import check_keys as check_keys_
from rkv.errors import ConfigError

T = TypeVar("T")

_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON (not a finite number)")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"the JSON repeats the key {k!r}")
        out[k] = v
    return out


def strict_json(text: str | bytes) -> Any:
    """``json.loads`` that refuses NaN/Infinity, repeated keys and nesting deeper than
    :data:`faultmodels.files.MAX_NESTING` (``ValueError``, as for any other malformed JSON;
    bytes must be UTF-8): for files rkv reads from users and disks, where a second value for
    a key must not silently win and a hostile document must not exhaust the stack."""
    from faultmodels.files import MAX_NESTING, nesting

    if isinstance(text, bytes | bytearray):
        text = bytes(text).decode("utf-8")
    if nesting(text, "json") > MAX_NESTING:
        raise ValueError(f"the JSON is nested deeper than {MAX_NESTING} levels")
    return json.loads(text, parse_constant=_no_constants, object_pairs_hook=_no_duplicates)


class Configured:
    """Identity by configuration for codecs and quantizers: equal configs are equal stages."""

    def get_config(self) -> dict[str, Any]:  # pragma: no cover - overridden
        raise NotImplementedError

    @property
    def spec(self) -> str:
        """The string form, e.g. ``rs(255,223,interleave=8)`` or ``kivi(bits=4,group=32)``."""
        cfg = self.get_config()
        args = [f"{k}={v}" for k, v in cfg.items() if k != "id"]
        return f"{cfg['id']}({','.join(args)})" if args else str(cfg["id"])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Configured):
            return NotImplemented
        return type(self) is type(other) and self.get_config() == other.get_config()

    def __hash__(self) -> int:
        return hash(tuple(sorted((k, str(v)) for k, v in self.get_config().items())))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.spec}>"


# -- config validation helpers ---------------------------------------------------------------
def check_keys(cfg: Mapping[str, Any], codec_id: str, allowed: Iterable[str]) -> None:
    """Raise ConfigError unless ``cfg`` is a mapping for ``codec_id`` with only ``allowed``."""
    as_table(cfg, f"{codec_id} config", what="a mapping", plain=False)
    if cfg.get("id") != codec_id:
        raise ConfigError(f"config id {cfg.get('id')!r} is not {codec_id!r}")
    check_keys_({k: v for k, v in cfg.items() if k != "id"}, allowed, codec_id,
                noun="parameter")


def int_param(
    cfg: Mapping[str, Any],
    codec_id: str,
    name: str,
    *,
    lo: int,
    hi: int,
    default: int | None = None,
) -> int:
    """An integer parameter in ``[lo, hi]``; bools and non-integers are rejected."""
    if name not in cfg:
        if default is None:
            raise ConfigError(f"{codec_id}: missing required parameter {name!r}")
        return default
    val = cfg[name]
    if isinstance(val, float):                     # integers only: no whole floats
        raise ConfigError(f"{codec_id}: {name} must be an integer, got {val!r}")
    return as_int(val, f"{codec_id}: {name}", lo=lo, hi=hi, plain=False)


def choice_param(
    cfg: Mapping[str, Any], codec_id: str, name: str, choices: tuple[str, ...], default: str
) -> str:
    return one_of(cfg.get(name, default), choices, f"{codec_id}: {name}")


class Registry(Generic[T]):
    """Classes of one kind (``what``, e.g. "codec"), by their ``codec_id``."""

    def __init__(self, what: str, base: type[Any], example: str) -> None:
        self.what = what
        self.base = base
        self.example = example
        self._classes: dict[str, type[T]] = {}

    def register(self, cls: type[T]) -> type[T]:
        """Register ``cls`` under its ``codec_id`` (usable as a decorator)."""
        cid = getattr(cls, "codec_id", None)
        if not isinstance(cid, str) or not _KEY_RE.match(cid):
            raise ConfigError(f"{self.what} class {cls.__name__} has no valid codec_id")
        old = self._classes.get(cid)
        if old is not None and old is not cls:
            raise ConfigError(f"{self.what} id {cid!r} is already registered to {old.__name__}")
        self._classes[cid] = cls
        return cls

    def available(self) -> tuple[str, ...]:
        return tuple(sorted(self._classes))

    def cls(self, cid: str) -> type[T]:
        try:
            return self._classes[cid]
        except KeyError:
            raise ConfigError(
                f"unknown {self.what} {cid!r}; known: {', '.join(self.available())}"
            ) from None

    def parse(self, spec: str) -> dict[str, Any]:
        """Turn ``"id(a, b, key=value)"`` into a config dict (the grammar:
        :mod:`policies.spec`); positional arguments are named by the class's ``positional``."""
        what = f"{self.what} spec"
        try:
            call = parse_call(spec, what)
        except SpecError as exc:
            raise ConfigError(f"{exc}; expected e.g. {self.example!r}") from None
        positional: tuple[str, ...] = getattr(self.cls(call.name), "positional", ())
        if len(call.args) > len(positional):
            raise ConfigError(
                f"too many positional arguments in {what} {spec!r}; {call.name} takes "
                f"{', '.join(positional) or 'none'}"
            )
        cfg: dict[str, Any] = {"id": call.name, **dict(zip(positional, call.args, strict=False))}
        for key, val in call.kwargs.items():
            if key in cfg:
                raise ConfigError(f"parameter {key!r} given twice in {what} {spec!r}")
            cfg[key] = val
        return cfg

    def get(self, spec: str | Mapping[str, Any] | T) -> T:
        """An instance from a spec string, a config dict or an instance (returned as is)."""
        if isinstance(spec, self.base):
            return cast(T, spec)
        if isinstance(spec, str):
            cfg: Mapping[str, Any] = self.parse(spec)
        elif isinstance(spec, Mapping):
            cfg = spec
            if "id" not in cfg or not isinstance(cfg["id"], str):
                raise ConfigError(f"{self.what} config needs a string 'id'")
        else:
            raise ConfigError(f"cannot make a {self.what} from {type(spec).__name__}")
        return self.cls(cfg["id"]).from_config(cfg)  # type: ignore[attr-defined,no-any-return]
