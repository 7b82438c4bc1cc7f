"""Replaying a trace through a real store: the same policies, driven by the engine.

``rkv replay TRACE --store PATH`` creates a one-tier store at ``PATH`` whose tier runs the
policy under test, and for every request of the trace does what a serving engine does: a
``get`` of the prompt's KV, then a ``put`` of all of it (chunks already stored are
deduplicated). Each trace block becomes one chunk of ``chunk_tokens`` synthetic tokens
(derived from the block id, so equal ids give equal chunk keys) with deterministic KV of a
small model, so records are real: encoded, written to LMDB, verified on read.

The result has the same metrics as the store-less replay (:mod:`rkv.eval.replay.simulate`), from the
engine's own answers: a request's leading hits are the tokens its ``get`` returned, its
block hits the chunks its ``put`` found stored. For the same policy and capacity both drivers
make the same decisions, which the tests check.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path

import numpy as np

from policies.base import EvictionPolicy
from rkv.errors import ConfigError
from rkv.eval.replay.queue import Lookahead, parse_lookahead
from rkv.eval.replay.simulate import Capacity, CostModel, Result, Trace, _result
from rkv.format.model import ModelSpec
from rkv.store.config import EngineConfig, TierConfig

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
    from rkv.codec.pipeline import Pipeline

    return Pipeline().record_bytes(spec.block_shape(n), spec.dtype) * spec.n_layers


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
                    keep: list[EvictionPolicy] | None = None,
                    lookahead: int | str | Lookahead = 0) -> Result:
    """Replay ``trace`` through a new store at ``path`` whose one tier holds ``capacity``
    bytes' worth of the trace's blocks (``capacity // cost.block_bytes`` chunks) under
    ``policy`` (a tier policy spec, e.g. ``"lru"`` or ``"prefix+after(n=2)"``).

    ``lookahead`` (N requests or a time, :mod:`.queue`): each request is announced to the
    engine with :meth:`Engine.prefetch` when it joins the queue (so its chunks are held until
    its ``get``), as the store-less replay's look-ahead models. ``keep``, when given,
    receives the tier's policy object at the end (tests compare its contents with the
    store-less replay's)."""
    from rkv.store.engine import Engine

    cost = cost or CostModel()
    ahead = parse_lookahead(lookahead)
    ends = trace.queue_ends(ahead) if ahead else None
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
    def tokens_of(r: int) -> np.ndarray:
        ids = trace.refs[trace.starts[r]:trace.starts[r + 1]]
        return np.concatenate([block_tokens(b, ct) for b in ids]) if ids else np.empty(0)

    with Engine.open(root, cfg) as engine:
        tail = 1                        # requests below ``tail`` have been announced
        for r in range(trace.requests):
            if ends is not None:
                for q in range(max(tail, r + 1), ends[r]):   # the new arrivals join the queue
                    if len(tokens_of(q)):
                        engine.prefetch(tokens_of(q), model=spec, hold=math.inf)
                tail = max(tail, ends[r])
            ids = trace.refs[trace.starts[r]:trace.starts[r + 1]]
            if not ids:
                continue
            toks = tokens_of(r)
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
            keep.append(engine.core.decisions.policies["cache"])
    seconds = time.perf_counter() - t0
    return _result(trace, cost, label or f"{policy} (store)", capacity, capacity_text, lead,
                   hits, evictions, seconds, lookahead=ahead.requests,
                   lookahead_s=float(ahead.seconds))


def run_on_store(trace: Trace, specs: list[str], capacities: list[Capacity],
                 root: str | Path, cost: CostModel | None = None, *,
                 lookaheads: Sequence[int | str | Lookahead] | None = None,
                 progress: Callable[[str], None] | None = None) -> list[Result]:
    """Every spec at every capacity and look-ahead through a new store under ``root``
    (one store per run, destroyed after it), labelled ``spec [store]``."""
    from rkv.store.engine import Engine

    cost = cost or CostModel()
    base = Path(root)
    if base.exists() and any(base.iterdir()):
        raise ConfigError(f"{base} exists and is not empty: --store needs a new directory")
    out: list[Result] = []
    run = 0
    for spec in specs:
        for ahead in [parse_lookahead(n) for n in lookaheads or [0]]:
            label = f"{spec} [store]" + (f" +queue {ahead.text}" if ahead else "")
            for cap in capacities:
                if progress is not None:
                    progress(f"{label} at {cap.text}")
                path = base / f"run-{run}"
                run += 1
                try:
                    out.append(replay_on_store(trace, path, spec, cap.resolve(trace, cost),
                                               cost, label=label, capacity_text=cap.text,
                                               lookahead=ahead))
                finally:
                    Engine.destroy(path)
    return out
