"""Engine put/get throughput against raw LMDB on the same bytes, measured in the same run.

    .venv/bin/python benchmarks/bench_engine.py [--repeat 5] [--seqs 8] [--tokens 2048]
        [--read-mode mmap|pread] [--json benchmarks/results/engine.json]

Baselines (one LMDB environment on the same medium, same flags, one write transaction per
sequence, one read transaction per sequence):
* raw put: ``txn.put`` of each block's bytes (already contiguous) under a 34-byte key; also
  committed in transactions of about 2 MiB (``rkv.store.txn.WRITE_SLICE``), as the engine commits
  its tier writes (a large LMDB write transaction is much slower: see rkv/store/txn.py);
* raw get: in one read transaction per sequence, ``txn.get`` of each block (zero-copy) and a
  copy into a ``[layers, 2, tokens, heads, dim]`` array, the least any reader must do: once
  into a fresh array per sequence (like ``Engine.get``), once into a reused buffer (like
  ``Engine.get(out=...)``).
The engine does the same work plus chunk hashing, record framing, the index, the end-to-end
checksum (xxh3_128) on write and verification (header + checksum) on every read.
Two more figures, each against a baseline in the same run:
* ``put_many``: ``--batch-seqs`` small sequences (``--batch-tokens`` each, distinct) stored by
  one :meth:`Engine.put_many` against the same puts one call at a time, each into a fresh
  store (sequences per second, ratio batched / one at a time); next to it raw LMDB writes of
  the same blocks, a transaction per sequence against the batch's transactions (what
  batching gains in the storage itself) and their share of put_many's time;
* layer streaming: a ``--stream-tokens`` prefix of the 30-layer model read with
  :meth:`Engine.get_layers` into a reused buffer: the time until the first layer is handed
  out, against a full ``get(out=)`` of the same prefix (ratio first layer / full get).
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
from rkv.format.keys import as_token_array, block_key, chunk_bounds, chunk_keys
from rkv.store.paths import memory_dir
from rkv.store.txn import WRITE_SLICE

MODELS = {
    "smollm2-135m": ModelSpec("bench/smollm2", n_layers=30, n_kv_heads=3, head_dim=64),
    "llama3-8b": ModelSpec("bench/llama3-8b", n_layers=32, n_kv_heads=8, head_dim=128),
}


def workload(spec: ModelSpec, seqs: int, tokens: int, seed: int = 0
             ) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(seqs):
        t = rng.integers(0, 50000, tokens)
        kv = rng.standard_normal((spec.n_layers, 2, tokens, spec.n_kv_heads, spec.head_dim),
                                 dtype=np.float32).astype(np.float16)
        out.append((t, kv))
    return out


Items = list[tuple[bytes, np.ndarray]]


def blocks_of(spec: ModelSpec, data: list[tuple[np.ndarray, np.ndarray]], chunk: int
              ) -> list[Items]:
    """Per sequence, its blocks as raw LMDB stores them: (block key, contiguous bytes)."""
    fp = spec.fingerprint()
    out = []
    for t, kv in data:
        keys = chunk_keys(as_token_array(t), fp, chunk)
        out.append([(block_key(key, layer), np.ascontiguousarray(kv[layer, :, s:e]))
                    for key, (s, e) in zip(keys, chunk_bounds(len(t), chunk), strict=True)
                    for layer in range(spec.n_layers)])
    return out


def sliced(items: Items) -> list[Items]:
    """``items`` in groups of about WRITE_SLICE bytes, as the engine commits tier writes."""
    groups: list[Items] = [[]]
    size = 0
    for k, arr in items:
        if size >= WRITE_SLICE:
            groups, size = [*groups, []], 0
        groups[-1].append((k, arr))
        size += arr.nbytes
    return groups


def open_raw(path: Path) -> tuple[Any, Any]:
    """A raw LMDB environment with the engine's flags, and its block database."""
    env = lmdb.open(str(path), map_size=1 << 36, sync=False, metasync=False,
                    readahead=False, max_dbs=2)
    return env, env.open_db(b"blocks")


def write_groups(env: Any, db: Any, groups: list[Items]) -> float:
    """Seconds to write ``groups``, one write transaction each."""
    t0 = time.perf_counter()
    for group in groups:
        with env.begin(write=True, db=db) as txn:
            for k, arr in group:
                txn.put(k, arr)
    return time.perf_counter() - t0


def timed_writes(path: Path, groups: list[Items]) -> float:
    """:func:`write_groups` into a fresh environment at ``path``, closed after."""
    env, db = open_raw(path)
    t = write_groups(env, db, groups)
    env.close()
    return t


def raw_lmdb(base: Path, spec: ModelSpec, data: list[tuple[np.ndarray, np.ndarray]],
             chunk: int, reads: int) -> tuple[float, float, float, float]:
    # Blocks are prepared (contiguous, keyed) outside the timed region: raw LMDB gets its
    # best case.
    prepared = blocks_of(spec, data, chunk)
    # The same records, committed in transactions of about WRITE_SLICE bytes like the
    # engine's tier writes (a second environment: the figure the engine's put matches).
    t_put_sliced = timed_writes(base / "raw2", [g for items in prepared for g in sliced(items)])
    env, db = open_raw(base / "raw")
    t_put = write_groups(env, db, prepared)       # one transaction per sequence

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
    return (t_put, t_put_sliced, *t_get)


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


def raw_batch(base: Path, spec: ModelSpec, data: list[tuple[np.ndarray, np.ndarray]],
              chunk: int) -> tuple[float, float]:
    """Raw LMDB writes of the same blocks (seconds): one write transaction per sequence (as
    a put commits its tier writes), then all of them in transactions of about WRITE_SLICE
    bytes (as put_many does), each into a fresh environment: what batching gains where the
    bytes are stored."""
    items = blocks_of(spec, data, chunk)
    return (timed_writes(base / "raw-per-seq", items),
            timed_writes(base / "raw-batched", sliced([x for seq in items for x in seq])))


def batch_run(base: Path, spec: ModelSpec, data: list[tuple[np.ndarray, np.ndarray]],
              chunk: int, medium: str) -> tuple[float, float, float, float]:
    """(seconds for the puts one call at a time, for one put_many, then raw LMDB's
    :func:`raw_batch` of the same blocks), fresh stores."""
    times = []
    for batched in (False, True):
        cfg = EngineConfig(chunk_tokens=chunk, tiers=(
            TierConfig("t0", medium=medium, path=str(base / f"b{batched}"),
                       capacity_bytes=1 << 40),))
        with Engine.open(base / f"store{batched}", cfg) as e:
            e.put(*workload(spec, 1, chunk)[0], model=spec)   # first write: structure check
            t0 = time.perf_counter()
            if batched:
                res = e.put_many(data, model=spec)
            else:
                res = [e.put(t, kv, model=spec) for t, kv in data]
            times.append(time.perf_counter() - t0)
            assert all(r.chunks_written == r.chunks for r in res)
    return (times[0], times[1], *raw_batch(base, spec, data, chunk))


def stream_run(base: Path, spec: ModelSpec, tokens: int, chunk: int, medium: str,
               reads: int) -> tuple[float, float, float]:
    """Medians of (time to the first layer of get_layers, the whole stream, a full get),
    all into one reused buffer."""
    (t, kv), = workload(spec, 1, tokens)
    cfg = EngineConfig(chunk_tokens=chunk, tiers=(
        TierConfig("t0", medium=medium, path=str(base / "s0"), capacity_bytes=1 << 40),))
    buf = np.empty_like(kv)
    first, whole, full = [], [], []
    with Engine.open(base / "sstore", cfg) as e:
        e.put(t, kv, model=spec)
        for i in range(reads + 1):
            t0 = time.perf_counter()
            stream = e.get_layers(t, model=spec, out=buf)
            layer0 = next(stream)
            t1 = time.perf_counter()
            n = 1 + sum(1 for _ in stream)
            t2 = time.perf_counter()
            got = e.get(t, model=spec, out=buf)
            t3 = time.perf_counter()
            assert layer0.layer == 0 and n == spec.n_layers and got.n_tokens == tokens
            if i:      # the first pass is untimed (first touch)
                first.append(t1 - t0)
                whole.append(t2 - t0)
                full.append(t3 - t2)
        assert np.array_equal(buf, kv)
    return statistics.median(first), statistics.median(whole), statistics.median(full)


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
    ap.add_argument("--batch-seqs", type=int, default=16, help="sequences per put_many")
    ap.add_argument("--batch-tokens", default="16,256",
                    help="tokens per small sequence (a comma list: one figure each)")
    ap.add_argument("--batch-model", default="smollm2-135m")
    ap.add_argument("--stream-tokens", type=int, default=4096)
    ap.add_argument("--stream-model", default="smollm2-135m")
    ap.add_argument("--json", default=None, help="write results to this file")
    args = ap.parse_args()
    where = memory_dir() if args.medium == "memory" else None
    rows: list[dict[str, Any]] = []
    for name in args.models.split(","):
        spec = MODELS[name]
        data = workload(spec, args.seqs, args.tokens)
        total = sum(kv.nbytes for _, kv in data)
        samples: dict[str, list[float]] = {k: [] for k in (
            "raw_put", "raw_put_sliced", "raw_get", "raw_get_into", "put", "get",
            "get_into")}
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
                     "put_ratio_sliced": med["put"] / med["raw_put_sliced"],
                     "get_ratio": med["get"] / med["raw_get"],
                     "get_into_ratio": med["get_into"] / med["raw_get_into"]})
    print(f"\nmedium={args.medium}, ecc={args.ecc}, reads={args.read_mode}, {args.seqs} "
          f"sequences x {args.tokens} tokens, chunk {args.chunk}, median of {args.repeat} "
          "(GB/s of KV)\n")
    print("| model | block | raw put | raw put, 2 MiB txns | rkv put | ratio (vs 2 MiB) | "
          "raw get | rkv get | ratio | raw get into buffer | rkv get out= | ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['block_bytes'] // 1024} KiB | {r['raw_put']:.2f} | "
              f"{r['raw_put_sliced']:.2f} | {r['put']:.2f} | {r['put_ratio']:.2f} "
              f"({r['put_ratio_sliced']:.2f}) | {r['raw_get']:.2f} | {r['get']:.2f} | "
              f"{r['get_ratio']:.2f} | {r['raw_get_into']:.2f} | {r['get_into']:.2f} | "
              f"{r['get_into_ratio']:.2f} |")
    bspec, sspec = MODELS[args.batch_model], MODELS[args.stream_model]
    sizes = [int(x) for x in str(args.batch_tokens).split(",")]
    smalls = {n: workload(bspec, args.batch_seqs, n, seed=1) for n in sizes}
    bt: dict[int, dict[str, list[float]]] = {
        n: {"one_at_a_time": [], "put_many": [], "raw_per_seq": [], "raw_batched": []}
        for n in sizes}
    st: dict[str, list[float]] = {"first_layer": [], "stream": [], "get": []}
    for _ in range(args.repeat):
        base = Path(tempfile.mkdtemp(prefix="rkv-bench-", dir=where))
        try:
            for n, small in smalls.items():
                sub = base / f"batch{n}"
                for k, v in zip(bt[n], batch_run(sub, bspec, small, args.chunk, args.medium),
                                strict=True):
                    bt[n][k].append(v)
            for k, v in zip(st, stream_run(base, sspec, args.stream_tokens, args.chunk,
                                           args.medium, args.reads), strict=True):
                st[k].append(v)
        finally:
            shutil.rmtree(base, ignore_errors=True)
    batches = []
    for n in sizes:
        bmed = {k: statistics.median(v) for k, v in bt[n].items()}
        batches.append({"model": args.batch_model, "seqs": args.batch_seqs, "tokens": n,
                        **{f"{k}_seqs_per_s": args.batch_seqs / v for k, v in bmed.items()},
                        "ratio": bmed["one_at_a_time"] / bmed["put_many"],
                        "raw_ratio": bmed["raw_per_seq"] / bmed["raw_batched"],
                        "raw_share_of_put_many": bmed["raw_batched"] / bmed["put_many"]})
    smed = {k: statistics.median(v) for k, v in st.items()}
    stream = {"model": args.stream_model, "layers": sspec.n_layers,
              "tokens": args.stream_tokens, **{f"{k}_ms": v * 1e3 for k, v in smed.items()},
              "first_layer_over_get": smed["first_layer"] / smed["get"],
              "stream_over_get": smed["stream"] / smed["get"]}
    print()
    for b in batches:
        print(f"put_many of {args.batch_seqs} sequences x {b['tokens']} tokens "
              f"({args.batch_model}): {b['one_at_a_time_seqs_per_s']:.0f} sequences/s one "
              f"put at a time, {b['put_many_seqs_per_s']:.0f} with put_many: "
              f"**{b['ratio']:.2f}x**; raw LMDB writes of the same blocks "
              f"{b['raw_ratio']:.2f}x batched against a transaction per sequence, "
              f"{100 * b['raw_share_of_put_many']:.0f} % of put_many's time")
    print(f"get_layers of {args.stream_tokens} tokens x {sspec.n_layers} layers "
          f"({args.stream_model}, out=): first layer {stream['first_layer_ms']:.2f} ms, "
          f"whole stream {stream['stream_ms']:.2f} ms, full get {stream['get_ms']:.2f} ms: "
          f"first layer at **{100 * stream['first_layer_over_get']:.1f} %** of a get")
    load = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else []
    print(f"load average at the end: {' '.join(load)}")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"args": vars(args), "loadavg_end": load, "engine": rows, "put_many": batches,
             "stream": stream}, indent=2))


if __name__ == "__main__":
    main()
