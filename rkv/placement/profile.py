"""Quality profiles: the KL of the next-token distribution when one block's KV is stored at
``bits`` bits, per (layer, kind, bits); 16 bits costs nothing.

Accepted forms: a mapping ``{(layer, "k"|"v", bits): kl}``, a callable
``(layer, kind, bits) -> kl``, or the JSON document ``rkv calibrate`` writes,
``{"model": fingerprint, "kl": {"<layer>:<k|v>:<bits>": kl}}``. A block of kind ``"kv"``
(K and V in one record) costs the sum of its K and V entries.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rkv.errors import ConfigError

KlFn = Callable[[int, str, int], float]


class QualityProfile:
    """KL per (layer, kind, bits). Missing entries raise :class:`ConfigError`."""

    def __init__(self, source: Mapping[Any, Any] | KlFn | QualityProfile,
                 model: str | None = None) -> None:
        self.model = model
        self._fn: KlFn | None = None
        self._table: dict[tuple[int, str, int], float] = {}
        if isinstance(source, QualityProfile):
            self._fn, self._table, self.model = source._fn, source._table, source.model
        elif callable(source) and not isinstance(source, Mapping):
            self._fn = source
        elif isinstance(source, Mapping):
            if "kl" in source and isinstance(source["kl"], Mapping):
                self.model = str(source.get("model", "")) or model
                source = source["kl"]
            for key, v in source.items():
                self._table[_parse_key(key)] = _kl_value(key, v)
        else:
            raise ConfigError(f"quality profile: expected a mapping, a callable or a JSON "
                              f"profile, got {type(source).__name__}")

    @classmethod
    def load(cls, path: str | Path) -> QualityProfile:
        """Read the JSON profile ``rkv calibrate`` writes (a regular file of at most 4 MiB,
        strict JSON: :func:`rkv.inputs.read_json`)."""
        from rkv.inputs import read_json

        doc = read_json(path, "quality profile")
        if not isinstance(doc, dict):
            raise ConfigError(f"quality profile {path}: expected a JSON object, got "
                              f"{type(doc).__name__}")
        return cls(doc)

    def kl(self, layer: int, kind: str, bits: int) -> float:
        if bits >= 16:
            return 0.0
        if kind == "kv":
            return self.kl(layer, "k", bits) + self.kl(layer, "v", bits)
        if self._fn is not None:
            return _kl_value(f"{layer}:{kind}:{bits}", self._fn(layer, kind, bits))
        try:
            return self._table[(layer, kind, bits)]
        except KeyError:
            raise ConfigError(f"quality profile has no entry for layer {layer} "
                              f"{kind.upper()} at {bits} bits (key \"{layer}:{kind}:{bits}\")"
                              ) from None


    def degraded_kl(self, layer: int, kind: str) -> float:
        """What a degraded read of the block costs: its KL at the fewest bits the profile
        has (2, else 4, else 8). A failed tolerant low byte plane leaves every float16 value
        within one unit of its E5M2 high byte, finer than 2-bit KIVI, so this bounds it."""
        for bits in (2, 4, 8):
            try:
                return self.kl(layer, kind, bits)
            except ConfigError:
                continue
        raise ConfigError(f"quality profile has no lossy entry for layer {layer} "
                          f"{kind.upper()}: a degraded read's cost is unknown")


def _parse_key(key: Any) -> tuple[int, str, int]:
    try:
        if isinstance(key, str):
            layer_s, kind, bits_s = key.split(":")
            layer, bits = int(layer_s), int(bits_s)
        else:
            layer, kind, bits = key
            layer, bits = int(layer), int(bits)
    except (ValueError, TypeError):
        raise ConfigError(f"quality profile: bad key {key!r} (want \"<layer>:<k|v>:<bits>\" "
                          f"or (layer, kind, bits))") from None
    kind = str(kind).lower()
    if kind not in ("k", "v") or layer < 0 or bits not in (2, 4, 8, 16):
        raise ConfigError(f"quality profile: bad key {key!r} (layer >= 0, kind k or v, "
                          f"bits 2/4/8/16)")
    return layer, kind, bits


def _kl_value(key: Any, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
        raise ConfigError(f"quality profile: KL for {key!r} must be a finite number >= 0, "
                          f"got {v!r}")
    return float(v)


def as_profile(p: QualityProfile | Mapping[Any, Any] | KlFn | None) -> QualityProfile | None:
    return None if p is None else (p if isinstance(p, QualityProfile) else QualityProfile(p))
