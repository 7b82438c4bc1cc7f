"""What bounds a verified read: its steps, one at a time, against a plain copy in the same run.

    .venv/bin/python benchmarks/bench_read_floor.py [--tokens 256] [--repeat 7]
        [--json benchmarks/results/read_floor.json]

Blocks of the SmolLM2-135M shape (``--tokens`` per block; 256 = the engine's default chunk,
192 KiB) in a source larger than the CPU caches are copied, block by block, into ``[layers, 2,
tokens, heads, dim]`` destination buffers also larger than the caches, as ``Engine.get(out=)``
fills a caller's buffers. Per block, medians of ``--repeat`` passes:

* ``copy``: the copy alone (what raw LMDB's reader does: the baseline);
* ``hash, then copy``: xxh3_128 of the source (the python xxhash library), then the copy: the
  least a read that verifies the end-to-end checksum before handing the data out does;
* ``copy, then hash the destination``: the other order (the data would be handed out before it
  is known to be right, so rkv does not do it; here for the floor it would give);
* ``fast check``: ``rkv.codec.fastcheck.FastCheck.copy`` on real records (header compares, header
  seal, checksum, copy): what the engine runs per clean block, without the LMDB lookup.

Every figure is also given as the ratio copy / figure: the best fraction of raw LMDB's
read-and-copy that a read doing that work can reach.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import xxhash

from rkv.codec.fastcheck import FastCheck
from rkv.format.model import ModelSpec
from rkv.format.record import RecordHeader, decode_record, encode_array_record, framing_sizes

SPEC = ModelSpec("bench/smollm2", n_layers=30, n_kv_heads=3, head_dim=64)
SOURCE_BYTES = 256 << 20       # well past the last-level cache


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    n = args.tokens
    shape = SPEC.block_shape(n)
    rng = np.random.default_rng(0)
    block = np.empty(shape, np.float16)
    nbytes = block.nbytes
    count = max(64, SOURCE_BYTES // nbytes)
    key, fp = bytes(range(32)), SPEC.fingerprint()
    records, payloads = [], []
    for i in range(count):
        layer = i % SPEC.n_layers
        block[...] = rng.standard_normal(shape, dtype=np.float32)
        h = RecordHeader(key=key, layer=layer, fingerprint=fp, shape=shape, dtype="float16",
                         data_len=0, payload_len=0, written_ns=1)
        rec = memoryview(encode_array_record(h, block).tobytes())
        records.append((rec, layer))
        off, _ = framing_sizes(decode_record(rec).header)
        payloads.append(np.frombuffer(rec, np.float16, block.size, off).reshape(shape))
    chunks = count // SPEC.n_layers
    outs = [np.empty((SPEC.n_layers, 2, n * chunks // 4 + n, SPEC.n_kv_heads, SPEC.head_dim),
                     np.float16) for _ in range(4)]
    dests = [outs[c % 4][i % SPEC.n_layers, :, (c // 4) * n:(c // 4 + 1) * n]
             for c in range(chunks) for i in range(SPEC.n_layers)]
    check = FastCheck(key, fp, SPEC, n)

    def copy(i: int) -> None:
        dests[i][...] = payloads[i]

    def hash_copy(i: int) -> None:
        xxhash.xxh3_128_digest(payloads[i])
        dests[i][...] = payloads[i]

    def copy_hash(i: int) -> None:
        d = dests[i]
        d[...] = payloads[i]
        h = xxhash.xxh3_128()
        h.update(d[0])
        h.update(d[1])
        h.digest()

    def fast(i: int) -> None:
        rec, layer = records[i]
        assert check.copy(rec, layer, len(rec), dests[i])

    steps: dict[str, Callable[[int], None]] = {
        "copy": copy, "hash, then copy": hash_copy,
        "copy, then hash the destination": copy_hash, "fast check": fast}
    times: dict[str, list[float]] = {k: [] for k in steps}
    m = len(dests)
    for _ in range(args.repeat + 1):
        for name, fn in steps.items():
            t0 = time.perf_counter()
            for i in range(m):
                fn(i)
            times[name].append((time.perf_counter() - t0) / m)
    med = {k: statistics.median(v[1:]) for k, v in times.items()}    # the first is warm-up
    print(f"\n{m} blocks of {nbytes // 1024} KiB ({n} tokens), median of {args.repeat}\n")
    print("| step | us per block | GB/s | copy / step |")
    print("|---|---|---|---|")
    for k, v in med.items():
        print(f"| {k} | {v * 1e6:.1f} | {nbytes / v / 1e9:.1f} | {med['copy'] / v:.2f} |")
    load = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else []
    print(f"\nload average at the end: {' '.join(load)}")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"args": vars(args), "block_bytes": nbytes, "loadavg_end": load,
             "us_per_block": {k: v * 1e6 for k, v in med.items()},
             "ratio_to_copy": {k: med["copy"] / v for k, v in med.items()}}, indent=2))


if __name__ == "__main__":
    main()
