"""Get throughput of the shared tier on a Redis Cluster, against a raw redis-py RedisCluster
client reading the same bytes and against rkv on one server, all in the same run.

    .venv/bin/python benchmarks/bench_remote_cluster.py [--repeat 7] [--tokens 4096]
        [--json benchmarks/results/remote_cluster.json]

A local 3-master cluster (no replicas) and one redis-server are started on free loopback
ports (rkv.tiers.local_redis, no persistence) and stopped at the end. The prefix is
SmolLM2-135M's shape (30 layers, 3 KV heads, head dim 64, fp16; 256-token chunks: 480
blocks of 192 KiB for 4096 tokens, 94 MB of KV), stored by one engine per backend whose only
tier is the remote tier (no MACs).

Rows, each a median over ``--repeat`` passes taken in turn (ABCD ABCD ...), GB/s of KV:
* ``raw cluster MGET``: the baseline: RedisCluster.mget_nonatomic of the same keys in
  windows of the tier's ``window_bytes`` (32 MiB), values left as the client returns them;
* ``rkv get (cluster)``: ``Engine.get(out=)`` through the cluster tier (per-node batches of
  per-slot MGETs per window, every record verified and copied into the buffer);
* ``raw MGET (one node)`` and ``rkv get (one node)``: the same on one server.
Ratios are against the raw cluster MGET of the same pass; the load average is recorded.
Timings are never asserted. All servers share this machine's cores with the client, so a
cluster here shows the client-side cost of slot grouping, not a cluster's capacity.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import redis
from redis.cluster import ClusterNode, RedisCluster

from rkv import Engine, EngineConfig, ModelSpec, TierConfig
from rkv.format.keys import as_token_array, block_key, chunk_keys
from rkv.tiers.local_redis import LocalCluster, LocalRedis

SMOLLM2 = ModelSpec("bench/smollm2", n_layers=30, n_kv_heads=3, head_dim=64)


def config(url: str) -> EngineConfig:
    tier = TierConfig("remote", kind="redis", url=url, capacity_bytes=1 << 40,
                      remote={"namespace": uuid.uuid4().hex[:12]})
    return EngineConfig(chunk_tokens=256, tiers=(tier,))


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def windows(sizes: Sequence[int], window: int) -> list[tuple[int, int]]:
    """The tier's MGET windows over records of ``sizes``: (start, end) each."""
    out, i = [], 0
    while i < len(sizes):
        j, budget = i, window
        while j < len(sizes) and (j == i or budget > 0):
            budget -= sizes[j]
            j += 1
        out.append((i, j))
        i = j
    return out


class Backend:
    """One engine that stored the prefix on ``url``, and a raw client of the same server(s)."""

    def __init__(self, url: str, root: Path, toks: Any, kv: Any, raw: Any) -> None:
        self.cfg = config(url)
        self.engine = Engine.open(root / uuid.uuid4().hex[:8], self.cfg)
        self.engine.put(toks, kv, model=SMOLLM2)
        tier = self.engine.tiers["remote"]
        self.names = [tier.key(block_key(k, layer))  # type: ignore[attr-defined]
                      for k in chunk_keys(as_token_array(toks), SMOLLM2.fingerprint(), 256)
                      for layer in range(SMOLLM2.n_layers)]
        self.raw = raw
        sizes = [len(v) for v in self.mget(self.names)]
        self.windows = windows(sizes, self.cfg.tiers[0].remote_settings().window_bytes)
        self.toks, self.out = toks, np.empty_like(kv)

    def mget(self, names: list[bytes]) -> list[Any]:
        if isinstance(self.raw, RedisCluster):
            return list(self.raw.mget_nonatomic(names))
        return list(self.raw.mget(names))

    def raw_read(self) -> None:
        for i, j in self.windows:
            assert all(v is not None for v in self.mget(self.names[i:j]))

    def get(self) -> None:
        assert self.engine.get(self.toks, model=SMOLLM2, out=self.out).n_tokens == len(
            self.toks)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--json", default=None, help="write the results to this file")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    toks = rng.integers(0, 50000, args.tokens)
    kv = rng.standard_normal((SMOLLM2.n_layers, 2, args.tokens, SMOLLM2.n_kv_heads,
                              SMOLLM2.head_dim), dtype=np.float32).astype(np.float16)
    root = Path(tempfile.mkdtemp(prefix="rkv-bench-cluster-"))
    load_before = os.getloadavg()
    with LocalCluster(root / "cluster") as cluster, LocalRedis(root / "one") as one:
        raw_cluster = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1",  # type: ignore[no-untyped-call]
                                                              cluster.nodes[0].port)])
        on_cluster = Backend(cluster.url, root, toks, kv, raw_cluster)
        on_one = Backend(one.url, root, toks, kv, redis.Redis(port=one.port))
        on_cluster.get()
        np.testing.assert_array_equal(on_cluster.out, kv)
        rows: dict[str, tuple[Callable[[], None], list[float]]] = {
            "raw cluster MGET": (on_cluster.raw_read, []),
            "rkv get (cluster)": (on_cluster.get, []),
            "raw MGET (one node)": (on_one.raw_read, []),
            "rkv get (one node)": (on_one.get, []),
        }
        for fn, _ in rows.values():
            fn()                                   # warm-up (connections, slot map)
        for _ in range(args.repeat):
            for fn, times in rows.values():
                times.append(timed(fn))
        on_cluster.engine.close()
        on_one.engine.close()
        raw_cluster.close()
    shutil.rmtree(root, ignore_errors=True)
    med = {k: statistics.median(t) for k, (_, t) in rows.items()}
    base = med["raw cluster MGET"]
    result = {
        "machine": platform.machine(), "cpus": os.cpu_count(),
        "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
        "tokens": args.tokens, "blocks": len(on_cluster.names), "kv_bytes": kv.nbytes,
        "repeat": args.repeat,
        "rows": {k: {"median_s": m, "gbps": kv.nbytes / m / 1e9, "ratio": base / m}
                 for k, m in med.items()},
    }
    print(f"remote cluster get, {args.tokens}-token SmolLM2-135M prefix "
          f"({kv.nbytes / 1e6:.1f} MB of KV), medians of {args.repeat}; ratio = raw "
          f"cluster MGET time / row time; load {load_before[0]:.2f} -> "
          f"{result['loadavg_after'][0]:.2f}")     # type: ignore[index]
    print(f"{'row':<22} {'median ms':>10} {'GB/s':>7} {'vs raw cluster':>15}")
    for name, row in result["rows"].items():        # type: ignore[attr-defined]
        print(f"{name:<22} {1e3 * row['median_s']:>10.1f} {row['gbps']:>7.2f} "
              f"{row['ratio']:>14.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
