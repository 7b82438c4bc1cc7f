"""The embedded-default demo: prompts with shared prefixes stored, deduplicated and verified.

KV here is synthetic but deterministic per (position, token), like a real model's KV for an
identical prefix, so a reloaded prefix can be compared byte for byte with what was computed.
The model shape is SmolLM2-135M's (30 layers, 3 KV heads, head dim 64) in fp16.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from rkv.config import EngineConfig
from rkv.engine import Engine
from rkv.model import ModelSpec

DEMO_MODEL = ModelSpec("demo/SmolLM2-135M-shape", n_layers=30, n_kv_heads=3, head_dim=64,
                       dtype="float16")


def synthetic_kv(spec: ModelSpec, tokens: np.ndarray) -> np.ndarray:
    """Deterministic KV: a function of each token and its position only."""
    rng = np.random.default_rng(1234)
    table = rng.standard_normal((512, spec.n_layers, 2, spec.n_kv_heads, spec.head_dim),
                                dtype=np.float32)
    pos = np.arange(len(tokens), dtype=np.float32)[:, None, None, None, None]
    kv = table[tokens % 512] + np.sin(pos / 64.0)        # [tokens, layers, 2, heads, dim]
    return np.ascontiguousarray(kv.transpose(1, 2, 0, 3, 4)).astype(spec.dtype)


def demo_prompts(n: int, seed: int = 7) -> list[np.ndarray]:
    """A shared system prompt, two documents, and multi-turn conversations on top."""
    rng = np.random.default_rng(seed)
    system = rng.integers(0, 49152, 1024)
    docs = [rng.integers(0, 49152, 768) for _ in range(2)]
    prompts: list[np.ndarray] = []
    history: dict[int, np.ndarray] = {}
    for i in range(n):
        d = i % 2
        base = history.get(d, np.concatenate([system, docs[d]]))
        turn = rng.integers(0, 49152, 200 + 37 * i)
        prompt = np.concatenate([base, turn])
        history[d] = prompt
        prompts.append(prompt)
    return prompts


def run_demo(path: str | None = None, prompts: int = 6, keep: bool = False) -> int:
    tmp = None
    if path is None:
        tmp = tempfile.mkdtemp(prefix="rkv-demo-")
        path = str(Path(tmp) / "store")
    spec = DEMO_MODEL
    per_token = spec.bytes_per_token()
    print(f"rkv demo: store at {path}")
    print(f"model shape {spec.model_id}: {spec.n_layers} layers, {spec.n_kv_heads} KV heads, "
          f"head dim {spec.head_dim}, {spec.dtype} ({per_token / 1024:.1f} KiB of KV per token)")
    # The default tiers, with DRAM and CXL made small so that the demo's ~110 MiB spill over:
    # older chunks are demoted to CXL (Reed-Solomon) and NVMe (sharded Reed-Solomon).
    config = (EngineConfig().with_tier("dram", capacity_bytes=40 << 20)
              .with_tier("cxl", capacity_bytes=40 << 20))
    try:
        with Engine.open(path, config) as engine:
            cfg = engine.config
            print("tiers: " + ", ".join(
                f"{t.name} ({t.medium}, {t.capacity_bytes >> 20} MiB, ecc {t.ecc})"
                for t in cfg.tiers))
            print(f"\n{'#':>2} {'tokens':>6} {'cached':>6} {'written':>8} {'deduped':>8} "
                  f"{'put MB/s':>9} {'read':>6} {'verified':>9} {'get MB/s':>9} {'exact':>5}")
            total_written = total_logical = 0
            all_ok = True
            for i, toks in enumerate(demo_prompts(prompts)):
                kv = synthetic_kv(spec, toks)
                cached = engine.lookup(toks, model=spec)
                t0 = time.perf_counter()
                put = engine.put(toks, kv, model=spec)
                t_put = time.perf_counter() - t0
                t0 = time.perf_counter()
                got = engine.get(toks, model=spec)
                t_get = time.perf_counter() - t0
                exact = got.n_tokens == len(toks) and np.array_equal(got.kv, kv)
                all_ok &= exact and got.ok
                counts = got.counts
                verified = counts["ok"] + counts["corrected"]
                total_written += put.bytes_written
                total_logical += kv.nbytes
                put_mbs = put.bytes_written / t_put / 1e6 if put.bytes_written else 0.0
                print(f"{i:>2} {len(toks):>6} {cached:>6} {put.chunks_written:>4} ch. "
                      f"{put.chunks_deduped:>5} ch. {put_mbs:>9.0f} {got.n_tokens:>6} "
                      f"{verified:>5} bl. {got.kv.nbytes / t_get / 1e6:>9.0f} "
                      f"{'yes' if exact else 'NO':>5}")
            st = engine.stats()
            rep = engine.verify()
        saved = 1 - total_written / total_logical if total_logical else 0.0
        print(f"\nlogical KV {total_logical / 2**20:.1f} MiB, written {total_written / 2**20:.1f} "
              f"MiB: prefix dedup saved {100 * saved:.0f}%")
        print(f"store: {st['chunks']} chunks ({st['shared_chunks']} shared), "
              f"{st['session'].get('demoted_chunks', 0)} chunk demotions; blocks per tier: "
              + ", ".join(f"{n}={t['blocks']}" for n, t in st["tiers"].items()))
        print(f"verify: {rep.blocks} blocks, {rep.ok} ok, {rep.corrected} corrected, "
              f"{rep.uncorrectable} uncorrectable, {rep.missing} missing")
        ok = all_ok and rep.clean
        print("every reload was byte-exact and verified" if ok else "MISMATCH: see above")
        if keep or tmp is None:
            print(f"store kept at {path}; inspect it with `rkv info {path}`")
        return 0 if ok else 1
    finally:
        if tmp is not None and not keep:
            Engine.destroy(path)
            shutil.rmtree(tmp, ignore_errors=True)
