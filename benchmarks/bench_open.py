"""What opening a store costs, and what the LMDB structure check (run before a tier's first
write or scan, and on the index at every open) would add.

    .venv/bin/python benchmarks/bench_open.py [--gib 1] [--repeat 5] [--json PATH]

Builds a store of about ``--gib`` GiB on disk (one tier, Llama-3-8B-shaped blocks of 1 MiB and
SmolLM2-shaped blocks of 192 KiB), closes it, then times in the same run:
* raw open: ``lmdb.open`` of the index and tier environments and one read transaction each
  (the least any LMDB user pays);
* structure check alone: py-lmdb's offline verifier over the same files;
* ``Engine.open`` + ``close`` (read-write: reconcile, structure checks, index commit) and
  ``Engine.open(readonly=True)``.
Medians over ``--repeat`` opens; the page cache is warm (the files were just written), so this
is the CPU cost of the walk, not disk I/O. Timings are never asserted anywhere.
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
import lmdb.verify as lmdb_verify
import numpy as np

from rkv import Engine, EngineConfig, ModelSpec, TierConfig

MODELS = {
    "smollm2-135m": ModelSpec("bench/smollm2", n_layers=30, n_kv_heads=3, head_dim=64),
    "llama3-8b": ModelSpec("bench/llama3-8b", n_layers=32, n_kv_heads=8, head_dim=128),
}


def _median(fn: Any, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def build(root: Path, spec: ModelSpec, gib: float) -> tuple[int, list[Path]]:
    cfg = EngineConfig(chunk_tokens=256, tiers=(
        TierConfig("nvme", medium="disk", capacity_bytes=int(gib * 2 * (1 << 30))),))
    per_token = spec.n_layers * 2 * spec.n_kv_heads * spec.head_dim * 2
    n_seqs = max(1, int(gib * (1 << 30) / (per_token * 2048)))
    rng = np.random.default_rng(0)
    with Engine.open(root, cfg) as e:
        for _ in range(n_seqs):
            kv = rng.standard_normal((spec.n_layers, 2, 2048, spec.n_kv_heads, spec.head_dim),
                                     dtype=np.float32).astype(np.float16)
            e.put(rng.integers(0, 32000, 2048), kv, model=spec)
        blocks = e.stats()["tiers"]["nvme"]["blocks"]
    return blocks, [root / "index", root / "tiers" / "nvme"]


def raw_open(envs: list[Path]) -> None:
    for p in envs:
        env = lmdb.open(str(p), max_dbs=8, readonly=True, lock=False)
        with env.begin() as txn:
            txn.stat(env.open_db(b"blocks" if p.name != "index" else b"chunks", txn=txn))
        env.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = []
    for name, spec in MODELS.items():
        tmp = Path(tempfile.mkdtemp(prefix="rkv-bench-open-"))
        try:
            blocks, envs = build(tmp / "store", spec, args.gib)
            raw = _median(lambda envs=envs: raw_open(envs), args.repeat)
            check = _median(lambda envs=envs: [lmdb_verify.verify(str(p)) for p in envs],
                            args.repeat)
            rw = _median(lambda tmp=tmp: Engine.open(tmp / "store").close(), args.repeat)
            ro = _median(lambda tmp=tmp: Engine.open(tmp / "store", readonly=True).close(),
                         args.repeat)
            file_bytes = sum((p / "data.mdb").stat().st_size for p in envs)
            rows.append({"model": name, "blocks": blocks, "file_bytes": file_bytes,
                         "raw_open_s": raw, "check_s": check, "open_s": rw,
                         "open_readonly_s": ro, "open_over_raw_s": rw - raw})
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"\nstore of ~{args.gib} GiB on disk, median of {args.repeat} (milliseconds)\n")
    print("| model | blocks | file | raw lmdb open | structure check | Engine.open | "
          "Engine.open(readonly) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['blocks']} | {r['file_bytes'] / (1 << 30):.2f} GiB | "
              f"{r['raw_open_s'] * 1e3:.1f} | {r['check_s'] * 1e3:.0f} | "
              f"{r['open_s'] * 1e3:.0f} | {r['open_readonly_s'] * 1e3:.0f} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
