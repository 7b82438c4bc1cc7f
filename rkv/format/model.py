"""Model descriptions and their fingerprints.

A KV block is only meaningful for the exact model configuration that produced it. The
fingerprint hashes every field that changes the KV bytes, so blocks of two configurations can
never be confused: a different dtype, layer count, head layout or tensor-parallel rank gives a
different fingerprint, hence different chunk keys.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from rkv.checks import check_keys
from rkv.errors import ConfigError
from rkv.format.dtypes import NAMES, check_dtype

#: dtypes a KV tensor may have, by canonical name (the table: :mod:`rkv.format.dtypes`).
KV_DTYPES = NAMES
FINGERPRINT_BYTES = 16


@dataclass(frozen=True)
class ModelSpec:
    """What produced a KV cache: everything that changes its bytes.

    ``layout`` names the meaning of the stored tensors (for example ``"lkthd"`` for
    ``[layers, 2, tokens, kv_heads, head_dim]`` keys after RoPE); change it whenever the KV
    semantics change (a new RoPE scaling, a different attention implementation).
    ``extra`` holds any further JSON-able fields that should split the key space.
    """

    model_id: str
    n_layers: int
    n_kv_heads: int
    head_dim: int
    dtype: str = "float16"
    revision: str = ""
    layout: str = "lkthd"
    tp_rank: int = 0
    tp_size: int = 1
    extra: tuple[tuple[str, str], ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if not isinstance(self.model_id, str) or not self.model_id:
            raise ConfigError("ModelSpec.model_id must be a non-empty string")
        for name in ("n_layers", "n_kv_heads", "head_dim", "tp_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"ModelSpec.{name} must be a positive int, got {value!r}")
        if self.n_layers > 65535:
            raise ConfigError("ModelSpec.n_layers must be at most 65535")
        if not isinstance(self.tp_rank, int) or not 0 <= self.tp_rank < self.tp_size:
            raise ConfigError(f"ModelSpec.tp_rank must be in [0, tp_size), got {self.tp_rank!r}")
        check_dtype(self.dtype, "ModelSpec.dtype")
        if not isinstance(self.revision, str) or not isinstance(self.layout, str):
            raise ConfigError("ModelSpec.revision and layout must be strings")
        extra = self.extra
        if isinstance(extra, dict):
            extra = tuple(sorted((str(k), str(v)) for k, v in extra.items()))
            object.__setattr__(self, "extra", extra)
        elif not all(isinstance(p, tuple) and len(p) == 2 for p in extra):
            raise ConfigError("ModelSpec.extra must be a dict or a tuple of (key, value) pairs")

    @property
    def itemsize(self) -> int:
        return 4 if self.dtype == "float32" else 2

    def block_shape(self, n_tokens: int) -> tuple[int, int, int, int]:
        """Shape of one block (one chunk of one layer): ``[2, tokens, kv_heads, head_dim]``."""
        return (2, n_tokens, self.n_kv_heads, self.head_dim)

    def bytes_per_token(self) -> int:
        """KV bytes per token over all layers (K and V)."""
        return self.n_layers * 2 * self.n_kv_heads * self.head_dim * self.itemsize

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["extra"] = {k: v for k, v in self.extra}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelSpec:
        if not isinstance(d, dict):
            raise ConfigError(f"model spec must be a dict, got {type(d).__name__}")
        check_keys(d, cls.__dataclass_fields__, "model spec", noun="field")
        try:
            return cls(**d)
        except TypeError as exc:
            raise ConfigError(f"bad model spec: {exc}") from exc

    def stored_json(self) -> bytes:
        """The JSON form the index keeps under :meth:`fingerprint` (computed once per spec
        object: every put writes it)."""
        raw: bytes | None = self.__dict__.get("_stored_json")
        if raw is None:
            raw = json.dumps(self.to_dict(), sort_keys=True).encode()
            object.__setattr__(self, "_stored_json", raw)
        return raw

    def fingerprint(self) -> bytes:
        """16-byte blake2b digest of the canonical JSON form of this spec (computed once per
        spec object: every put and get needs it, and the spec is frozen)."""
        fp: bytes | None = self.__dict__.get("_fingerprint")
        if fp is None:
            canon = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
            fp = hashlib.blake2b(
                canon.encode(), digest_size=FINGERPRINT_BYTES, person=b"rkv-model-v1"
            ).digest()
            object.__setattr__(self, "_fingerprint", fp)
        return fp


def as_model_spec(model: ModelSpec | dict[str, Any]) -> ModelSpec:
    """Accept a :class:`ModelSpec` or its dict form."""
    if isinstance(model, ModelSpec):
        return model
    if isinstance(model, dict):
        return ModelSpec.from_dict(model)
    raise ConfigError(f"model must be a ModelSpec or a dict, got {type(model).__name__}")
