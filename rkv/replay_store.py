"""Replaying a trace through a real store: the same policies, driven by the engine.

``rkv replay TRACE --store PATH`` creates a one-tier store at ``PATH`` whose tier runs the
policy under test, and for every request of the trace does what a serving engine does: a
``get`` of the prompt's KV, then a ``put`` of all of it (chunks already stored are
deduplicated). Each trace block becomes one chunk of ``chunk_tokens`` synthetic tokens
(derived from the block id, so equal ids give equal chunk keys) with deterministic KV of a
small model, so records are real: encoded, written to LMDB, verified on read.

The result has the same metrics as the store-less replay (:mod:`rkv.replay`), from the
engine's own answers: a request's leading hits are the tokens its ``get`` returned, its
block hits the chunks its ``put`` found stored. For the same policy and capacity both drivers
make the same decisions, which the tests check.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Hashable
from pathlib import Path

import numpy as np

from policies.base import EvictionPolicy
from rkv.config import EngineConfig, TierConfig
from rkv.errors import ConfigError
from rkv.model import ModelSpec
from rkv.replay import CostModel, Result, Trace, _result

#: A tiny model: the records are real, the replay is about decisions, not bandwidth.
REPLAY_MODEL = ModelSpec("rkv/replay", n_layers=2, n_kv_heads=1, head_dim=8, dtype="float16")
REPLAY_CHUNK_TOKENS = 16


def block_tokens(block: Hashable, n: int = REPLAY_CHUNK_TOKENS) -> np.ndarray:
    """``n`` token ids standing for trace block ``block`` (stable across runs)."""
    digest = hashlib.blake2b(repr(block).encode(), digest_size=8).digest()
    rng = np.random.default_rng(int.from_bytes(digest, "little"))
    return rng.integers(0, 1 << 16, n, dtype=np.int64)


def _block_kv(block: Hashable, spec: ModelSpec, n: int) -> np.ndarray:
    digest = hashlib.blake2b(b"kv" + repr(block).encode(), digest_size=8).digest()
    rng = np.random.default_rng(int.from_bytes(digest, "little"))
    shape = (spec.n_layers, 2, n, spec.n_kv_heads, spec.head_dim)
    return rng.standard_normal(shape).astype(np.float16)


def chunk_record_bytes(spec: ModelSpec = REPLAY_MODEL, n: int = REPLAY_CHUNK_TOKENS) -> int:
    """Bytes one full chunk takes in a tier without ECC or quantization."""
    from rkv.blockcodec import codec_for, record_size
    from rkv.record import RecordHeader

    header = RecordHeader(key=bytes(32), layer=0, fingerprint=bytes(16),
                          shape=spec.block_shape(n), dtype=spec.dtype, data_len=0,
                          payload_len=0)
    data = 2 * n * spec.n_kv_heads * spec.head_dim * 2
    return record_size(header, data, codec_for("none"), None) * spec.n_layers


def store_config(policy: str, blocks: int) -> EngineConfig:
    """One disk tier inside the store holding ``blocks`` chunks, run by ``policy``."""
    cap = max(1, blocks) * chunk_record_bytes()
    return EngineConfig(chunk_tokens=REPLAY_CHUNK_TOKENS, promote="never", tiers=(
        TierConfig("cache", medium="disk", path="t/cache", capacity_bytes=cap,
                   policy=policy),))


def replay_on_store(trace: Trace, path: str | Path, policy: str, capacity: int,
                    cost: CostModel | None = None, *, label: str | None = None,
                    capacity_text: str = "",
                    progress: Callable[[int, int], None] | None = None,
                    keep: list[EvictionPolicy] | None = None) -> Result:
    """Replay ``trace`` through a new store at ``path`` whose one tier holds ``capacity``
    bytes' worth of the trace's blocks (``capacity // cost.block_bytes`` chunks) under
    ``policy`` (a tier policy spec, e.g. ``"lru"`` or ``"prefix+after(n=2)"``).

    ``keep``, when given, receives the tier's policy object at the end (tests compare its
    contents with the store-less replay's)."""
    from rkv.engine import Engine

    cost = cost or CostModel()
    root = Path(path)
    if root.exists() and any(root.iterdir()):
        raise ConfigError(f"{root} exists and is not empty: --store needs a new directory")
    blocks = capacity // cost.block_bytes
    cfg = store_config(policy, blocks)
    spec = REPLAY_MODEL
    ct = REPLAY_CHUNK_TOKENS
    lead = [0] * trace.requests
    hits = evictions = 0
    t0 = time.perf_counter()
    with Engine.open(root, cfg) as engine:
        for r in range(trace.requests):
            ids = trace.refs[trace.starts[r]:trace.starts[r + 1]]
            if not ids:
                continue
            toks = np.concatenate([block_tokens(b, ct) for b in ids])
            got = engine.get(toks, model=spec)
            kv = np.concatenate([_block_kv(b, spec, ct) for b in ids], axis=2)
            put = engine.put(toks, kv, model=spec)
            evictions += put.evicted_chunks
            if trace.counted[r]:
                lead[r] = got.n_tokens // ct
                hits += put.chunks_deduped
            if progress is not None:
                progress(r + 1, trace.requests)
        if keep is not None:
            keep.append(engine._decide.policies["cache"])
    seconds = time.perf_counter() - t0
    return _result(trace, cost, label or f"{policy} (store)", capacity, capacity_text, lead,
                   hits, evictions, seconds)
