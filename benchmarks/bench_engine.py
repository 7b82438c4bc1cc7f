"""Engine put/get throughput against raw LMDB on the same bytes, measured in the same run.

    .venv/bin/python benchmarks/bench_engine.py [--repeat 5] [--seqs 8] [--tokens 2048]
        [--read-mode mmap|pread]

Baselines (one LMDB environment on the same medium, same flags, one write transaction per
sequence like the engine):
* raw put: ``txn.put`` of each block's bytes (already contiguous) under a 34-byte key;
* raw get: in one read transaction per sequence, ``txn.get`` of each block (zero-copy) and a
  copy into a ``[layers, 2, tokens, heads, dim]`` array, the least any reader must do: once
  into a fresh array per sequence (like ``Engine.get``), once into a reused buffer (like
  ``Engine.get(out=...)``).
The engine does the same work plus chunk hashing, record framing, the index, the end-to-end
checksum (xxh3_128) on write and verification (header + checksum) on every read.
Reads: one untimed pass first (first-touch page faults of fresh mappings and buffers), then
the median of ``--reads`` passes. Reports medians over ``--repeat`` fresh stores; timings are
never asserted anywhere.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import lmdb
import numpy as np

from rkv import Engine, EngineConfig, ModelSpec, TierConfig
from rkv.keys import as_token_array, block_key, chunk_bounds, chunk_keys
from rkv.store import memory_dir

MODELS = {
    "smollm2-135m": ModelSpec("bench/smollm2", n_layers=30, n_kv_heads=3, head_dim=64),
    "llama3-8b": ModelSpec("bench/llama3-8b", n_layers=32, n_kv_heads=8, head_dim=128),
}


def workload(spec: ModelSpec, seqs: int, tokens: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(0)
    out = []
    for _ in range(seqs):
        t = rng.integers(0, 50000, tokens)
        kv = rng.standard_normal((spec.n_layers, 2, tokens, spec.n_kv_heads, spec.head_dim),
                                 dtype=np.float32).astype(np.float16)
        out.append((t, kv))
    return out


def raw_lmdb(base: Path, spec: ModelSpec, data: list[tuple[np.ndarray, np.ndarray]],
             chunk: int, reads: int) -> tuple[float, float, float]:
    env = lmdb.open(str(base / "raw"), map_size=1 << 36, sync=False, metasync=False,
                    readahead=False, max_dbs=2)
    db = env.open_db(b"blocks")
    fp = spec.fingerprint()
    # Blocks are prepared (contiguous, keyed) outside the timed region: raw LMDB gets its
    # best case.
    prepared = []
    for t, kv in data:
        keys = chunk_keys(as_token_array(t), fp, chunk)
        items = []
        for key, (s, e) in zip(keys, chunk_bounds(len(t), chunk), strict=True):
            for layer in range(spec.n_layers):
                items.append((block_key(key, layer), np.ascontiguousarray(kv[layer, :, s:e])))
        prepared.append(items)
    t0 = time.perf_counter()
    for items in prepared:
        with env.begin(write=True, db=db) as txn:
            for k, arr in items:
                txn.put(k, arr)
    t_put = time.perf_counter() - t0

    bufs = [np.empty_like(kv) for _, kv in data]

    def read_all(reuse: bool) -> None:
        for (t, kv), items, buf in zip(data, prepared, bufs, strict=True):
            out = buf if reuse else np.empty_like(kv)
            with env.begin(buffers=True, db=db) as txn:
                i = 0
                for s, e in chunk_bounds(len(t), chunk):
                    for layer in range(spec.n_layers):
                        buf = txn.get(items[i][0])
                        out[layer, :, s:e] = np.frombuffer(buf, np.float16).reshape(
                            2, e - s, spec.n_kv_heads, spec.head_dim)
                        i += 1

    t_get = timed_reads(read_all, reads)
    env.close()
    return (t_put, *t_get)


def timed_reads(fn: Any, reads: int) -> tuple[float, float]:
    """Median read pass into fresh arrays and into reused buffers.

    One untimed pass of each first (first-touch page faults of fresh mappings and buffers).
    """
    out = []
    for reuse in (False, True):
        fn(reuse)
        times = []
        for _ in range(reads):
            t0 = time.perf_counter()
            fn(reuse)
            times.append(time.perf_counter() - t0)
        out.append(statistics.median(times))
    return out[0], out[1]


def engine_run(base: Path, spec: ModelSpec, data: list[tuple[np.ndarray, np.ndarray]],
               chunk: int, medium: str, reads: int, ecc: str, read_mode: str = "mmap"
               ) -> tuple[float, float, float]:
    cfg = EngineConfig(chunk_tokens=chunk, tiers=(
        TierConfig("t0", medium=medium, path=str(base / "t0"), capacity_bytes=1 << 40,
                   ecc=ecc, reads=read_mode),))
    with Engine.open(base / "store", cfg) as e:
        t0 = time.perf_counter()
        for t, kv in data:
            e.put(t, kv, model=spec)
        t_put = time.perf_counter() - t0

        bufs = [np.empty_like(kv) for _, kv in data]

        def read_all(reuse: bool) -> None:
            for (t, _), buf in zip(data, bufs, strict=True):
                got = e.get(t, model=spec, out=buf if reuse else None)
                assert got.ok and got.n_tokens == len(t)

        t_get = timed_reads(read_all, reads)
        t, kv = data[-1]
        assert np.array_equal(e.get(t, model=spec).kv, kv)
    return (t_put, *t_get)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--seqs", type=int, default=4)
    ap.add_argument("--reads", type=int, default=3, help="timed read passes per store")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--medium", choices=["memory", "disk"], default="memory")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--ecc", default="none", help="the engine tier's codec, e.g. rs(255,239)")
    ap.add_argument("--read-mode", choices=["mmap", "pread"], default="mmap",
                    help="the tier's reads setting (pread: SIGBUS-safe copies from the file)")
    ap.add_argument("--json", default=None, help="write results to this file")
    args = ap.parse_args()
    where = memory_dir() if args.medium == "memory" else None
    rows: list[dict[str, Any]] = []
    for name in args.models.split(","):
        spec = MODELS[name]
        data = workload(spec, args.seqs, args.tokens)
        total = sum(kv.nbytes for _, kv in data)
        samples: dict[str, list[float]] = {k: [] for k in (
            "raw_put", "raw_get", "raw_get_into", "put", "get", "get_into")}
        for _ in range(args.repeat):
            base = Path(tempfile.mkdtemp(prefix="rkv-bench-", dir=where))
            try:
                raw = raw_lmdb(base, spec, data, args.chunk, args.reads)
                eng = engine_run(base, spec, data, args.chunk, args.medium, args.reads,
                                 args.ecc, args.read_mode)
            finally:
                shutil.rmtree(base, ignore_errors=True)
            for k, v in zip(samples, (*raw, *eng), strict=True):
                samples[k].append(total / v / 1e9)
        med = {k: statistics.median(v) for k, v in samples.items()}
        block = 2 * args.chunk * spec.n_kv_heads * spec.head_dim * 2
        rows.append({"model": name, "block_bytes": block, "total_bytes": total, **med,
                     "put_ratio": med["put"] / med["raw_put"],
                     "get_ratio": med["get"] / med["raw_get"],
                     "get_into_ratio": med["get_into"] / med["raw_get_into"]})
    print(f"\nmedium={args.medium}, ecc={args.ecc}, reads={args.read_mode}, {args.seqs} "
          f"sequences x {args.tokens} tokens, chunk {args.chunk}, median of {args.repeat} "
          "(GB/s of KV)\n")
    print("| model | block | raw put | rkv put | ratio | raw get | rkv get | ratio | "
          "raw get into buffer | rkv get out= | ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['block_bytes'] // 1024} KiB | {r['raw_put']:.2f} | "
              f"{r['put']:.2f} | {r['put_ratio']:.2f} | {r['raw_get']:.2f} | {r['get']:.2f} | "
              f"{r['get_ratio']:.2f} | {r['raw_get_into']:.2f} | {r['get_into']:.2f} | "
              f"{r['get_into_ratio']:.2f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
