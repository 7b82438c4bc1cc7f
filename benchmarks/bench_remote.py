"""Remote-tier get throughput against a raw redis-py MGET of the same bytes, in the same run.

    .venv/bin/python benchmarks/bench_remote.py [--repeat 7] [--tokens 4096]
        [--url redis://127.0.0.1:6379/0] [--json benchmarks/results/remote.json]

Without ``--url`` a redis-server is started on a free loopback port (no persistence) and
stopped at the end. The prefix is SmolLM2-135M's shape (30 layers, 3 KV heads, head dim 64,
fp16; 256-token chunks: 480 blocks of 192 KiB for 4096 tokens, 94 MB of KV), stored by one
engine whose only tier is the Redis tier, with and without MACs (``--macs``: keyed blake2b,
HMAC-SHA256), a fresh namespace each.

Rows, each a median over ``--repeat`` passes taken in turn (ABAB...), throughput in GB/s of
KV data:
* ``raw MGET``: the baseline: redis-py MGET of the same keys (the stored values, envelopes
  included) in windows of the tier's ``window_bytes`` (32 MiB), the values left as the
  client returns them; also one MGET of every key at once;
* ``get (indexed)``: ``Engine.get(out=)`` into a reused buffer by the engine that stored
  the prefix: an MGET per window, then every record verified (header, xxh3 checksum; the MAC
  first on an authenticated tier) and copied into the buffer;
* ``get (other node)``: the same get by a node that has never seen the prefix: the probe
  (two pipelined round trips), adoption into its index (one mutation), then the get; a
  fresh store per pass.
Ratios are against the windowed raw MGET of the same pass. Timings are never asserted.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import redis

from rkv import Engine, EngineConfig, ModelSpec, TierConfig
from rkv.format.keys import as_token_array, block_key, chunk_keys

SMOLLM2 = ModelSpec("bench/smollm2", n_layers=30, n_kv_heads=3, head_dim=64)
MAC_ENV = "RKV_BENCH_MAC_KEY"


def start_server(root: Path) -> tuple[subprocess.Popen[bytes], str]:
    exe = shutil.which("redis-server")
    if exe is None:
        raise SystemExit("redis-server is not installed (apt-get install redis-server), or "
                         "pass --url")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(root)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(port=port)
    deadline = time.monotonic() + 20
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                proc.kill()
                raise SystemExit("redis-server did not start") from None
            time.sleep(0.05)
    return proc, f"redis://127.0.0.1:{port}/0"


def config(url: str, namespace: str, mac: str) -> EngineConfig:
    remote: dict[str, Any] = {"namespace": namespace}
    if mac != "none":
        remote |= {"mac_keys": {"k1": f"env:{MAC_ENV}"}, "mac_key_id": "k1",
                   "mac_algorithm": mac}
    tier = TierConfig("remote", kind="redis", url=url, capacity_bytes=1 << 40, remote=remote)
    return EngineConfig(chunk_tokens=256, tiers=(tier,))


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run_mode(url: str, root: Path, mac: str, tokens: int, repeat: int) -> dict[str, Any]:
    spec = SMOLLM2
    rng = np.random.default_rng(0)
    toks = rng.integers(0, 50000, tokens)
    kv = rng.standard_normal((spec.n_layers, 2, tokens, spec.n_kv_heads, spec.head_dim),
                             dtype=np.float32).astype(np.float16)
    namespace = uuid.uuid4().hex[:12]
    cfg = config(url, namespace, mac)
    writer = Engine.open(root / f"writer-{namespace}", cfg)
    writer.put(toks, kv, model=spec)
    remote = writer.tiers["remote"]
    names = [remote.key(block_key(k, layer))  # type: ignore[attr-defined]
             for k in chunk_keys(as_token_array(toks), spec.fingerprint(), 256)
             for layer in range(spec.n_layers)]
    client = redis.Redis.from_url(url)
    window = cfg.tiers[0].remote_settings().window_bytes
    pipe = client.pipeline(transaction=False)
    for k in names:
        pipe.strlen(k)
    sizes = [int(n) for n in pipe.execute()]
    stored = sum(sizes)

    def mget_windows() -> None:
        i = 0
        while i < len(names):
            j, budget = i, window
            while j < len(names) and (j == i or budget > 0):
                budget -= sizes[j]
                j += 1
            values = client.mget(names[i:j])
            assert all(v is not None for v in values)
            i = j

    def mget_all() -> None:
        assert all(v is not None for v in client.mget(names))

    out = np.empty_like(kv)

    def get_indexed() -> None:
        assert writer.get(toks, model=spec, out=out).n_tokens == tokens

    def get_other() -> float:
        with Engine.open(root / f"reader-{uuid.uuid4().hex[:8]}", cfg) as reader:
            t = timed(lambda: reader.get(toks, model=spec, out=out))
            assert reader.stats()["session"]["hits"] == 1
        return t

    get_indexed()
    np.testing.assert_array_equal(out, kv)
    mget_windows()                                   # warm-up (connections, allocator)
    rows: dict[str, list[float]] = {"raw MGET": [], "raw MGET (one call)": [],
                                    "get (indexed)": [], "get (other node)": []}
    for _ in range(repeat):
        rows["raw MGET"].append(timed(mget_windows))
        rows["get (indexed)"].append(timed(get_indexed))
        rows["raw MGET (one call)"].append(timed(mget_all))
        rows["get (other node)"].append(get_other())
    writer.close()
    data = kv.nbytes
    med = {k: statistics.median(v) for k, v in rows.items()}
    return {
        "mac": mac, "tokens": tokens, "blocks": len(names), "kv_bytes": data,
        "stored_bytes": stored,
        "rows": {k: {"median_s": med[k], "gbps": data / med[k] / 1e9,
                     "ratio": med["raw MGET"] / med[k]} for k in rows},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--url", default=None, help="use this server instead of starting one")
    ap.add_argument("--json", default=None, help="write the results to this file")
    ap.add_argument("--macs", default="none,blake2b,hmac-sha256",
                    help="MAC algorithms to run (none: no MAC)")
    args = ap.parse_args()
    import os

    os.environ.setdefault(MAC_ENV, os.urandom(32).hex())
    root = Path(tempfile.mkdtemp(prefix="rkv-bench-remote-"))
    proc = None
    try:
        url = args.url
        if url is None:
            proc, url = start_server(root)
        results = [run_mode(url, root, mac, args.tokens, args.repeat)
                   for mac in args.macs.split(",")]
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait()
        shutil.rmtree(root, ignore_errors=True)
    print(f"remote get, {args.tokens}-token SmolLM2-135M prefix "
          f"({results[0]['kv_bytes'] / 1e6:.1f} MB of KV), medians of {args.repeat}; "
          f"ratio = raw MGET time / row time")
    print(f"{'MAC':<12} {'row':<22} {'median ms':>10} {'GB/s':>7} {'vs raw MGET':>12}")
    for r in results:
        for name, row in r["rows"].items():
            print(f"{r['mac']:<12} {name:<22} {1e3 * row['median_s']:>10.1f} "
                  f"{row['gbps']:>7.2f} {row['ratio']:>11.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": platform.machine(),
                                               "results": results}, indent=2))


if __name__ == "__main__":
    main()
