"""``rkv demo``: prompts with shared prefixes stored, deduplicated and verified; then faults
injected into stored records, caught by rkv where raw storage returns wrong values
(:mod:`rkv.eval.demo_faults`).

KV here is synthetic but deterministic per (position, token), like a real model's KV for an
identical prefix, so a reloaded prefix can be compared byte for byte with what was computed.
The model shape is SmolLM2-135M's (30 layers, 3 KV heads, head dim 64) in fp16.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from rkv.format.model import ModelSpec
from rkv.store.config import EngineConfig
from rkv.store.engine import Engine
from rkv.ui import Column, Progress, echo_table, human_bytes

log = logging.getLogger(__name__)

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


_PROMPT_COLUMNS = [Column("#", align="right"), Column("tokens", align="right"),
                   Column("cached", align="right"),
                   Column("written", align="right", fmt="{} ch."),
                   Column("deduped", align="right", fmt="{} ch."),
                   Column("put MB/s", align="right", fmt=".0f"),
                   Column("read", align="right"),
                   Column("verified", align="right", fmt="{} bl."),
                   Column("get MB/s", align="right", fmt=".0f"),
                   Column("exact", fmt=lambda b: "yes" if b else "NO")]


def run_demo(path: str | None = None, prompts: int = 6, keep: bool = False,
             faults: bool = True, quiet: bool = False) -> int:
    """Store ``prompts`` prompts with shared prefixes, reload and verify them, then (with
    ``faults``) inject faults into stored records and show rkv catching them where raw
    storage returns wrong values. Exit status 0 when everything checks out."""
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
                f"{t.name} ({t.medium}, {human_bytes(t.capacity_bytes)}, ecc {t.ecc})"
                for t in cfg.tiers))
            rows, totals, all_ok = _store_prompts(engine, prompts, quiet)
            st = engine.stats()
            rep = engine.verify()
        print("\nprompts with shared prefixes (a system prompt, two documents, growing chats):")
        echo_table(rows, _PROMPT_COLUMNS)
        total_written, total_logical = totals
        saved = 1 - total_written / total_logical if total_logical else 0.0
        print(f"logical KV {human_bytes(total_logical)}, written {human_bytes(total_written)}: "
              f"prefix dedup saved {100 * saved:.0f}%")
        print(f"store: {st['chunks']} chunks ({st['shared_chunks']} shared), "
              f"{st['session'].get('demoted_chunks', 0)} chunk demotions; blocks per tier: "
              + ", ".join(f"{n}={t['blocks']}" for n, t in st["tiers"].items()))
        print(f"verify: {rep.blocks} blocks, {rep.ok} ok, {rep.corrected} corrected, "
              f"{rep.uncorrectable} uncorrectable, {rep.missing} missing")
        ok = all_ok and rep.clean
        print("every reload was byte-exact and verified" if ok else "MISMATCH: see above")
        if faults:
            ok &= _show_faults(spec)
        if keep or tmp is None:
            print(f"\nstore kept at {path}; inspect it with `rkv info {path}`")
        return 0 if ok else 1
    finally:
        if tmp is not None and not keep:
            Engine.destroy(path)
            shutil.rmtree(tmp, ignore_errors=True)


def _store_prompts(engine: Engine, prompts: int, quiet: bool
                   ) -> tuple[list[dict[str, Any]], tuple[int, int], bool]:
    spec = DEMO_MODEL
    rows: list[dict[str, Any]] = []
    total_written = total_logical = 0
    all_ok = True
    with Progress("demo", prompts, unit="prompt", quiet=quiet) as bar:
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
            total_written += put.bytes_written
            total_logical += kv.nbytes
            rows.append({"#": i, "tokens": len(toks), "cached": cached,
                         "written": put.chunks_written, "deduped": put.chunks_deduped,
                         "put MB/s": put.bytes_written / t_put / 1e6 if put.bytes_written
                         else 0.0,
                         "read": got.n_tokens, "verified": counts["ok"] + counts["corrected"],
                         "get MB/s": got.kv.nbytes / t_get / 1e6, "exact": exact})
            log.info("demo: prompt %d: %d tokens, %d cached, %d chunks written", i, len(toks),
                     cached, put.chunks_written)
            bar.update()
    return rows, (total_written, total_logical), all_ok


def _show_faults(spec: ModelSpec) -> bool:
    """The fault half of the demo; True when rkv returned no wrong value and raw storage
    did (the point being made)."""
    from rkv.eval.demo_faults import fault_demo, fault_rows

    tokens = np.arange(512, dtype=np.int64) * 7 + 3
    d = fault_demo(spec, synthetic_kv(spec, tokens), tokens)
    head, rows, verdict = fault_rows(d)
    print("\n" + head)
    echo_table(rows, [Column("fault"), Column("rkv"), Column("raw storage")])
    print(verdict)
    return d.rkv_exact and d.raw_wrong > 0
