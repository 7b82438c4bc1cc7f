"""The rkv vLLM connector's settings and the identity its KV is stored under (no vLLM import).

Settings come from vLLM's ``kv_connector_extra_config`` (see :class:`ConnectorSettings`);
unknown keys and bad values are a :class:`~rkv.errors.ConfigError` at start, never ignored.

The identity (:func:`model_spec`) binds everything that changes what a stored block means:
the model's weights (a digest of the weight files' bytes), its config, the KV dtype, the
heads and head size, the paged layout the connector reads vLLM's cache with, the attention
backend, the vLLM version and a user salt. A change of any of them gives other chunk keys:
a miss, never another configuration's KV.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from rkv.checks import check_keys
from rkv.errors import ConfigError
from rkv.format.model import KV_DTYPES, ModelSpec
from rkv.store.config import EngineConfig

#: What the store holds: ``[layers, 2, tokens, kv_heads, head_dim]``, keys after RoPE, as
#: the model's attention layers wrote them into vLLM's paged cache.
STORED_LAYOUT = "vllm-token-major"

#: Weight files hashed into the identity (the model directory's top level).
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


@dataclass(frozen=True)
class ConnectorSettings:
    """``kv_connector_extra_config`` of ``RkvConnector``.

    - ``store``: the rkv store directory (required; or ``RKV_VLLM_STORE``).
    - ``config``: a TOML file (``EngineConfig.load``) or a dict (``EngineConfig.from_dict``)
      for the store; none: a new store gets the embedded default, an existing one keeps its
      own. ``chunk_tokens``: a new store's chunk size when ``config`` has none (default
      256); it must be a multiple of vLLM's block size.
    - ``placement``: each put's placement targets (``{"max_p_due": 1e-12}``: docs/placement.md).
    - ``load`` / ``save``: restore stored prefixes / store new full chunks (default both);
      ``save_decode``: also store chunks of generated tokens (default true).
    - ``save_async``: store in a background thread (default true), at most
      ``save_queue_mb`` MiB of KV waiting (default 512; a save past it is dropped and
      counted, never waited for).
    - ``stream_ahead``: layers read ahead of the one vLLM is computing (default 2).
    - ``min_load_tokens``: a stored prefix shorter than this is recomputed (default 0).
    - ``canary``: check the paged layout at start (default true; docs/vllm.md).
    - ``layout``: how vLLM's paged cache is read: ``"auto"`` (from the attention backend) or
      a name from :data:`rkv.adapters.vllm_layout.LAYOUTS`.
    - ``announce_queue``: when vLLM queues a request, prefetch its stored prefix into the
      top tier and hold it against eviction until the request is scheduled (default true;
      :mod:`rkv.adapters.vllm_queue`). ``queue_hold_s``: the longest a hold lasts, in
      seconds (default none: twice the 95th percentile of measured queue waits, 5-600 s).
    - ``salt``: any string, part of every key (a new salt is a new key space).
    - ``faults``: a list of ``{"tier", "model", "hours", "seed"}`` dicts: reads of that tier
      go through :class:`rkv.tiers.faulty.FaultyTier` with errors drawn from the fault
      model (a preset name or a dict for ``faultmodels.get_model``) for ``hours`` of age.
    - ``stats_file``: a JSON file the connector rewrites with its counters (the worker's;
      the scheduler's at ``<stats_file>.scheduler``).
    """

    store: str
    config: str | dict[str, Any] | None = None
    chunk_tokens: int | None = None
    placement: dict[str, Any] | None = None
    load: bool = True
    save: bool = True
    save_decode: bool = True
    save_async: bool = True
    save_queue_mb: float = 512.0
    stream_ahead: int = 2
    min_load_tokens: int = 0
    canary: bool = True
    layout: str = "auto"
    salt: str = ""
    announce_queue: bool = True
    queue_hold_s: float | None = None
    faults: tuple[dict[str, Any], ...] = field(default_factory=tuple)
    stats_file: str | None = None

    @classmethod
    def from_extra(cls, extra: dict[str, Any] | None) -> ConnectorSettings:
        """Settings from ``kv_connector_extra_config`` (a ``ConfigError`` on a bad one)."""
        d = dict(extra or {})
        check_keys(d, (f.name for f in fields(cls)), "RkvConnector", noun="setting")
        if "store" not in d:
            env = os.environ.get("RKV_VLLM_STORE")
            if not env:
                raise ConfigError("RkvConnector needs a store: kv_connector_extra_config="
                                  "{'store': '/path/to/store'} (or RKV_VLLM_STORE)")
            d["store"] = env
        for name in ("load", "save", "save_decode", "save_async", "canary", "announce_queue"):
            if name in d and not isinstance(d[name], bool):
                raise ConfigError(f"RkvConnector: {name} must be true or false, got "
                                  f"{d[name]!r}")
        for name, lo in (("chunk_tokens", 1), ("stream_ahead", 1), ("min_load_tokens", 0)):
            v = d.get(name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < lo):
                raise ConfigError(f"RkvConnector: {name} must be an int >= {lo}, got {v!r}")
        q = d.get("save_queue_mb", 512.0)
        if not isinstance(q, int | float) or isinstance(q, bool) or q < 0:
            raise ConfigError(f"RkvConnector: save_queue_mb must be >= 0, got {q!r}")
        hold = d.get("queue_hold_s")
        if hold is not None and (not isinstance(hold, int | float) or isinstance(hold, bool)
                                 or not 0 < hold <= 86400):
            raise ConfigError(f"RkvConnector: queue_hold_s must be seconds in (0, 86400], "
                              f"got {hold!r}")
        for name in ("store", "layout", "salt"):
            if name in d and not isinstance(d[name], str):
                raise ConfigError(f"RkvConnector: {name} must be a string, got {d[name]!r}")
        cfg = d.get("config")
        if cfg is not None and not isinstance(cfg, str | dict):
            raise ConfigError("RkvConnector: config must be a TOML path or a dict")
        faults = d.get("faults") or ()
        if isinstance(faults, dict):
            faults = (faults,)
        if not all(isinstance(f, dict) and "tier" in f and "model" in f for f in faults):
            raise ConfigError("RkvConnector: faults must be a list of {'tier', 'model', "
                              "'hours', 'seed'} dicts")
        d["faults"] = tuple(faults)
        return cls(**d)

    def engine_config(self) -> EngineConfig | None:
        """The config to open the store with (None: the store's own, or the default)."""
        if isinstance(self.config, str):
            cfg = EngineConfig.load(self.config)
        elif isinstance(self.config, dict):
            cfg = EngineConfig.from_dict(self.config)
        elif self.chunk_tokens is not None:
            cfg = EngineConfig(chunk_tokens=self.chunk_tokens)
        else:
            return None
        if self.chunk_tokens is not None and cfg.chunk_tokens != self.chunk_tokens:
            raise ConfigError(f"RkvConnector: chunk_tokens={self.chunk_tokens} contradicts "
                              f"the config's chunk_tokens={cfg.chunk_tokens}")
        return cfg


_digests: dict[tuple[str, tuple[tuple[str, int, int], ...]], str] = {}


def weights_digest(model: str) -> str:
    """A 128-bit digest (hex) of a local model directory's weight files and config.json,
    by content (xxh3-128, streamed); files are listed by name, size and mtime, and the
    digest is kept per process while they are unchanged. A name that is not a directory (a
    hub id) is its own identity: ``"<id>"`` hashed."""
    import xxhash

    d = Path(model)
    if not d.is_dir():
        return hashlib.blake2b(model.encode(), digest_size=16).hexdigest()
    files = sorted(p for p in d.iterdir() if p.is_file() and (
        p.suffix in WEIGHT_SUFFIXES or p.name == "config.json"))
    if not any(p.suffix in WEIGHT_SUFFIXES for p in files):
        raise ConfigError(f"RkvConnector: {d} has no weight files ({', '.join(WEIGHT_SUFFIXES)})")
    listing = tuple((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files)
    memo = (str(d.resolve()), listing)
    if memo in _digests:
        return _digests[memo]
    h = xxhash.xxh3_128()
    for p in files:
        h.update(p.name.encode() + b"\0")
        with p.open("rb") as f:
            while block := f.read(1 << 24):
                h.update(block)
    _digests[memo] = h.hexdigest()
    return _digests[memo]


@dataclass(frozen=True)
class KVShape:
    """What vLLM's KV cache config says about the model's KV (both connector roles know it)."""

    n_layers: int
    n_kv_heads: int
    head_dim: int
    block_size: int
    dtype: str                      # rkv's dtype name


def torch_dtype_name(dtype: Any) -> str:
    """A torch dtype as rkv's name; a KV cache rkv cannot store (fp8) is a ConfigError."""
    name = str(dtype).removeprefix("torch.")
    if name not in KV_DTYPES:
        raise ConfigError(f"RkvConnector stores KV as one of {KV_DTYPES}; this KV cache is "
                          f"{name} (use kv_cache_dtype='auto')")
    return name


def model_spec(model: str, shape: KVShape, *, model_id: str, hf_config: str,
               salt: dict[str, str], tp_rank: int = 0, tp_size: int = 1) -> ModelSpec:
    """The spec (hence the chunk keys) of this vLLM instance's KV: the weights digest of
    ``model`` (a directory) as the revision, a digest of the config text and the engine
    salt in ``extra``."""
    extra = dict(salt)
    extra["hf_config"] = hashlib.blake2b(hf_config.encode(), digest_size=16).hexdigest()
    return ModelSpec(model_id, n_layers=shape.n_layers,
                     n_kv_heads=shape.n_kv_heads, head_dim=shape.head_dim, dtype=shape.dtype,
                     revision=weights_digest(model), layout=STORED_LAYOUT, tp_rank=tp_rank,
                     tp_size=tp_size, extra=tuple(sorted(extra.items())))


def spec_summary(spec: ModelSpec) -> str:
    """One line naming a spec (for logs): model, dtype, fingerprint."""
    return (f"{spec.model_id} {spec.dtype} L={spec.n_layers} H={spec.n_kv_heads} "
            f"D={spec.head_dim} fp={spec.fingerprint().hex()[:16]} "
            f"salt={json.dumps(dict(spec.extra), sort_keys=True)}")
