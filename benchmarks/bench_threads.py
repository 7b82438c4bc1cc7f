"""Codec and verified-read throughput on one thread against the codec thread pool, same run.

Usage::

    .venv/bin/python benchmarks/bench_threads.py [--mib 64] [--repeat 9] [--threads N]
        [--wait-idle 120] [--retries 3] [--json benchmarks/results/threads.json]

A 64 MiB prefix as 192 KiB blocks (float16 ``[2, 256, 3, 64]``, SmolLM2-135M's block) goes
through each stage with the pool set to one thread (everything inline) and to ``N`` threads
(default: the CPUs available), alternating per repeat so that both see the same machine, a
chunk of 30 blocks (one per layer) at a time as the engine goes; every figure is the median
of ``--repeat`` runs and the ratio compares the two medians. Stages: a compute-only kernel
(the ceiling: what N threads get on this machine now); RS(255,239) encode; RS(255,239)
decode with corrections (each encoded block hit at a byte error rate of 1e-4);
shardrs(k=16,m=2) encode; the end-to-end checksum (xxh3_128); records encoded as a put should
encode them (``encode_blocks`` with a ``RecordArena``); verified gets as the engine should run
them (the fast check of clean raw records, the header vote, ``read_blocks``: clean blocks on
the calling thread, decoding on the pool), and with threads forced for comparison; whole
``Engine.get`` calls of a 4-bit KIVI prefix and of a damaged RS(255,239) prefix.

The machine is shared: each row records the share of the cores that other processes used
while it ran (all CPU time in /proc/stat less this process's own); ``--wait-idle`` waits for
the cores to be free before each row and ``--retries`` measures a row again when others
took 10 % or more. The 1-minute load average before and after is recorded too. glibc's
malloc is told to keep freed memory (``keep_freed_memory``; ``--malloc-default`` not to), so
that rows measure the codecs rather than page faults on fresh memory.
"""

from __future__ import annotations

import argparse
import atexit
import ctypes
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numba
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rkv import Engine, EngineConfig, TierConfig, parallel
from rkv.codec.blockcodec import (
    BlockToEncode,
    BlockToRead,
    RecordArena,
    encode_blocks,
    read_block,
    read_blocks,
)
from rkv.codec.fastcheck import FastCheck
from rkv.codec.pipeline import Pipeline
from rkv.ecc import get_codec
from rkv.ecc.base import Codec
from rkv.format.model import ModelSpec
from rkv.format.record import RecordHeader, data_checksum, decode_record

SHAPE = (2, 256, 3, 64)       # 192 KiB of float16
CHUNK_BLOCKS = 30             # SmolLM2-135M's layers: one chunk's blocks at a time


@dataclass
class Row:
    stage: str
    nbytes: int
    serial_s: float
    threaded_s: float
    runs_serial: list[float] = field(default_factory=list)
    runs_threaded: list[float] = field(default_factory=list)
    others_share: float = 0.0     # of the cores, used by other processes during this row

    @property
    def serial_gbps(self) -> float:
        return self.nbytes / self.serial_s / 1e9

    @property
    def threaded_gbps(self) -> float:
        return self.nbytes / self.threaded_s / 1e9

    @property
    def speedup(self) -> float:
        return self.serial_s / self.threaded_s


def blocks(mib: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    nbytes = int(np.prod(SHAPE)) * 2
    n = (mib << 20) // nbytes
    flat = rng.standard_normal(n * nbytes // 2, dtype=np.float32).astype(np.float16)
    return list(flat.reshape(n, *SHAPE))


def damage(buf: bytes, ber: float, rng: np.random.Generator) -> bytes:
    """``buf`` with each byte replaced by a different random value with probability ``ber``."""
    b = np.frombuffer(buf, dtype=np.uint8).copy()
    hit = np.flatnonzero(rng.random(b.size) < ber)
    b[hit] ^= rng.integers(1, 256, hit.size, dtype=np.uint8)
    return b.tobytes()


SPEC = ModelSpec(model_id="bench", n_layers=30, n_kv_heads=SHAPE[2], head_dim=SHAPE[3])
FP = SPEC.fingerprint()


def key(i: int) -> bytes:
    return (i // SPEC.n_layers).to_bytes(32, "little")


def header(i: int) -> RecordHeader:
    return RecordHeader(key=key(i), layer=i % SPEC.n_layers, fingerprint=FP, shape=SHAPE,
                        dtype="float16", data_len=0, payload_len=0, written_ns=1)


def stages(data: list[np.ndarray]) -> dict[str, tuple[Callable[[], Any], int]]:
    """Each stage as a callable over the whole prefix, with its data bytes."""
    rs: Codec = get_codec("rs(255,239)")
    sh: Codec = get_codec("shardrs(k=16,m=2)")
    raw = [d.view(np.uint8).reshape(-1) for d in data]
    total = sum(r.nbytes for r in raw)
    rng = np.random.default_rng(1)
    rs_bad = [damage(rs.encode(r), 1e-4, rng) for r in raw]
    assert all(rs.decode(b).status == "corrected" for b in rs_bad)
    recs = {name: [bytes(r) for r in encode_blocks(
        [BlockToEncode(header(i), d, Pipeline(None, codec)) for i, d in enumerate(data)])]
        for name, codec in (("raw", None), ("rs", rs))}
    rs_damaged = []
    for rec in recs["rs"]:
        dec = decode_record(rec)
        start = dec.header_bytes
        body = damage(rec[start:start + dec.header.payload_len], 1e-4, rng)
        rs_damaged.append(rec[:start] + body + rec[start + dec.header.payload_len:])
    out = np.empty((len(data), *SHAPE), dtype=np.float16)

    def verify(i: int, rec: bytes) -> Any:
        # What the read path does per block once LMDB hands it the record: the header
        # vote and identity check, then the checks and the copy (rkv.codec.blockcodec.read_block).
        dec = decode_record(rec, expect_key=key(i), expect_layer=i % SPEC.n_layers,
                            expect_fingerprint=FP)
        return read_block(dec, out[i])

    checks = [FastCheck(key(i), FP, SPEC, SHAPE[1]) for i in range(len(data))]
    sizes = [len(r) for r in recs["raw"]]   # rs records are longer: the fast check declines

    def fast(i: int, rec: bytes) -> Any:
        # The engine's read of a clean raw record (rkv.codec.fastcheck), the full decode otherwise.
        if checks[i].copy(rec, i % SPEC.n_layers, sizes[i], out[i]):
            return None
        return verify(i, rec)

    def verified(which: list[bytes], fn: Callable[[int, bytes], Any] = verify
                 ) -> Callable[[], Any]:
        return chunked(lambda j: fn(*j), list(enumerate(which)))

    def engine_get(which: list[bytes]) -> Callable[[], Any]:
        """A get as the engine should run it: per chunk, the clean raw records through the
        fast check, then the header vote of the others and rkv.codec.blockcodec.read_blocks
        (clean ones on this thread, decoding on the pool)."""
        def run() -> None:
            for g in range(0, len(which), CHUNK_BLOCKS):
                ids = range(g, min(g + CHUNK_BLOCKS, len(which)))
                rest = [i for i in ids
                        if not checks[i].copy(which[i], i % SPEC.n_layers, sizes[i], out[i])]
                jobs = [BlockToRead(decode_record(which[i], expect_key=key(i),
                                                  expect_layer=i % SPEC.n_layers,
                                                  expect_fingerprint=FP), out[i])
                        for i in rest]
                res = read_blocks(jobs)
                assert not any(isinstance(x, BaseException) for x in res)
        return run

    put_raw = [BlockToEncode(header(i), d, Pipeline()) for i, d in enumerate(data)]
    put_rs = [BlockToEncode(header(i), d, Pipeline(None, rs)) for i, d in enumerate(data)]
    return {
        "ceiling: compute-only kernel, ~100 us a block": (chunked(_spin, raw), total),
        "rs(255,239) encode": (chunked(rs.encode, raw), total),
        "rs(255,239) decode, BER 1e-4 (corrections)": (chunked(rs.decode, rs_bad), total),
        "shardrs(k=16,m=2) encode": (chunked(sh.encode, raw), total),
        "checksum xxh3_128": (chunked(data_checksum, raw), total),
        "put encode: raw records (encode_blocks, arena; inline: memory speed)": (batched(
            partial(encode_blocks, arena=RecordArena()), put_raw), total),
        "put encode: raw records (encode_blocks, arena, threads forced)": (batched(
            partial(encode_blocks, arena=RecordArena(), threads=True), put_raw), total),
        "put encode: rs(255,239) records (encode_blocks, arena)": (batched(
            partial(encode_blocks, arena=RecordArena()), put_rs), total),
        "verified get: raw records (fast check + read_blocks)": (engine_get(recs["raw"]),
                                                                 total),
        "verified get: raw records (fast check, threads forced)": (
            verified(recs["raw"], fast), total),
        "verified get: rs(255,239) records, clean (read_blocks)": (engine_get(recs["rs"]),
                                                                   total),
        "verified get: rs(255,239) clean, threads forced": (verified(recs["rs"]), total),
        "verified get: rs(255,239) records, BER 1e-4 (read_blocks)": (
            engine_get(rs_damaged), total),
    }


def engine_stages(mib: int, tmp: Path) -> dict[str, tuple[Callable[[], Any], int]]:
    """Whole ``Engine.get`` calls of a ``mib`` prefix (30 layers, 256-token chunks) from one
    memory tier whose blocks need computing on every read: 4-bit KIVI (dequantizing), and
    RS(255,239) records hit at a byte error rate of 1e-4 (corrections; ``repair`` off, so
    every get decodes them again)."""
    spec = ModelSpec("bench/threads", n_layers=CHUNK_BLOCKS, n_kv_heads=SHAPE[2],
                     head_dim=SHAPE[3], dtype="float16")
    chunk_bytes = CHUNK_BLOCKS * int(np.prod(SHAPE)) * 2
    n_tokens = max(1, (mib << 20) // chunk_bytes) * SHAPE[1]
    rng = np.random.default_rng(2)
    kv = rng.standard_normal((CHUNK_BLOCKS, 2, n_tokens, SHAPE[2], SHAPE[3])).astype(
        np.float16)
    toks = [int(t) for t in rng.integers(0, 30000, n_tokens)]
    out: dict[str, tuple[Callable[[], Any], int]] = {}
    for name, ecc, quant, ber in (("kivi(bits=4)", "none", "kivi(bits=4)", 0.0),
                                  ("rs(255,239), BER 1e-4", "rs(255,239)", "none", 1e-4)):
        root = tmp / name.split(",")[0].replace("(", "").replace(")", "").replace("=", "")
        tier = TierConfig("mem", medium="memory", path=str(root / "mem"),
                          capacity_bytes=8 << 30, ecc=ecc, quant=quant)
        e = Engine.open(root / "s", EngineConfig(chunk_tokens=SHAPE[1], tiers=(tier,),
                                                 repair=False, promote="never"))
        e.put(toks, kv, model=spec)
        if ber:
            t = e.tiers["mem"]
            for k in list(t.iter_keys()):
                if len(k) == 34:          # block keys (the tier also keeps its id)
                    t.put(k, damage(t.get(k) or b"", ber, rng))
        buf = np.empty_like(kv)

        def get(e: Engine = e, buf: np.ndarray = buf) -> None:
            got = e.get(toks, model=spec, out=buf)
            assert got.n_tokens == n_tokens, got.counts

        out[f"engine get: {name} prefix (Engine.get, out=)"] = (get, kv.nbytes)
    return out


@numba.njit(nogil=True, cache=True)
def _spin_kernel(n: int) -> int:
    s = 0
    for _ in range(n):
        s = (s * 1103515245 + 12345) & 0xFFFFFFFF
    return s


def _spin(_: Any) -> int:
    return int(_spin_kernel(150_000))


def batched(fn: Callable[[list[Any]], Any], items: list[Any]) -> Callable[[], None]:
    """``fn`` (a batch API such as encode_blocks) called on each chunk's blocks."""
    groups = [items[i:i + CHUNK_BLOCKS] for i in range(0, len(items), CHUNK_BLOCKS)]

    def run() -> None:
        for g in groups:
            fn(g)
    return run


def chunked(fn: Callable[[Any], Any], items: list[Any]) -> Callable[[], None]:
    """The prefix a chunk (``CHUNK_BLOCKS`` blocks, one per layer) at a time, as the engine
    goes: each chunk's blocks mapped over the pool, its results dropped before the next
    (records go to LMDB, decoded data to the caller's array). Holding a whole prefix of
    fresh results would measure page faults, which do not scale with threads."""
    groups = [items[i:i + CHUNK_BLOCKS] for i in range(0, len(items), CHUNK_BLOCKS)]

    def run() -> None:
        for g in groups:
            res = parallel.pmap(fn, g, nbytes=1 << 30, capture=True)
            for r in res:
                if isinstance(r, BaseException):
                    raise r
            del res
    return run


def cpu_seconds() -> tuple[float, float]:
    """(CPU seconds all processes used, CPU seconds this one used) so far: their difference
    over a stretch is what other processes took from the cores meanwhile."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    busy = sum(ticks) - ticks[3] - (ticks[4] if len(ticks) > 4 else 0)   # minus idle, iowait
    me = os.times()
    return busy / os.sysconf("SC_CLK_TCK"), me.user + me.system


def wait_idle(limit_s: float, quiet: float = 0.1) -> float:
    """Wait (up to ``limit_s``) until other processes use under ``quiet`` of the cores over a
    second; returns the share they used in the last second."""
    end = time.monotonic() + limit_s
    while True:
        a = cpu_seconds()
        time.sleep(1.0)
        b = cpu_seconds()
        share = ((b[0] - a[0]) - (b[1] - a[1])) / os.cpu_count()  # type: ignore[operator]
        if share < quiet or time.monotonic() >= end:
            return max(0.0, share)


def measure(fn: Callable[[], Any], n: int, repeat: int
            ) -> tuple[list[float], list[float], float]:
    """Runs on one thread and on ``n``, alternating; and the share of the cores that other
    processes used meanwhile."""
    serial: list[float] = []
    threaded: list[float] = []
    a = cpu_seconds()
    t0 = time.perf_counter()
    for _ in range(repeat):
        for setting, runs in ((1, serial), (n, threaded)):
            parallel.configure(setting)
            t = time.perf_counter()
            fn()
            runs.append(time.perf_counter() - t)
    wall = time.perf_counter() - t0
    b = cpu_seconds()
    others = ((b[0] - a[0]) - (b[1] - a[1])) / (wall * (os.cpu_count() or 1))
    return serial, threaded, max(0.0, others)


def keep_freed_memory() -> bool:
    """Ask glibc's malloc to serve large blocks from its heap and keep freed memory (as a
    long-running server's allocator does once warm). By default every 192 KiB result (an
    encoded block as ``bytes``) is fresh memory from mmap: ~50 page faults a block, which
    cost more than the RS encode itself here and serialize threads on the kernel's memory
    map lock. True when glibc accepted it."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(libc.mallopt(m_mmap_threshold, 256 << 20)
                and libc.mallopt(m_trim_threshold, 1 << 30))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="0: the CPUs available")
    ap.add_argument("--only", default="", help="run the stages whose name contains this")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--wait-idle", type=float, default=0.0, metavar="S",
                    help="before each row, wait up to S seconds for the other processes "
                         "to leave the cores (under 10%% busy over a second)")
    ap.add_argument("--malloc-default", action="store_true",
                    help="leave glibc's malloc as it is (see keep_freed_memory)")
    ap.add_argument("--retries", type=int, default=0,
                    help="measure a row again (up to this many times) when other processes "
                         "used 10%% of the cores or more meanwhile")
    args = ap.parse_args(argv)
    kept = False if args.malloc_default else keep_freed_memory()
    n = args.threads or parallel.available_cpus()
    data = blocks(args.mib)
    tmp = Path(tempfile.mkdtemp(prefix="rkv-bench-threads-"))
    atexit.register(shutil.rmtree, tmp, True)
    every = {**stages(data), **engine_stages(args.mib, tmp)}
    todo = {k: v for k, v in every.items() if args.only in k}
    for fn, _ in todo.values():       # compile and warm every stage in both modes
        measure(fn, n, 1)
    load0 = os.getloadavg()
    rows = []
    for name, (fn, nbytes) in todo.items():
        for attempt in range(1 + args.retries):
            if args.wait_idle:
                wait_idle(args.wait_idle)
            s, t, others = measure(fn, n, args.repeat)
            if others < 0.1:
                break
            print(f"  ({name}: other processes used {100 * others:.0f}% of the cores; "
                  f"{'again' if attempt < args.retries else 'kept'})", flush=True)
        rows.append(Row(name, nbytes, statistics.median(s), statistics.median(t), s, t,
                        others))
        r = rows[-1]
        print(f"{name:56s} 1 thread {r.serial_gbps:6.2f} GB/s  {n} threads "
              f"{r.threaded_gbps:6.2f} GB/s  x{r.speedup:.2f}  (others used "
              f"{100 * others:.0f}% of the cores)", flush=True)
    load1 = os.getloadavg()
    print(f"load average (1, 5, 15 min) before {load0}, after {load1}; "
          f"{len(data)} blocks of {data[0].nbytes >> 10} KiB; malloc keeps freed memory: {kept}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "command": "benchmarks/bench_threads.py " + " ".join(argv or sys.argv[1:]),
            "machine": {"cpus_available": parallel.available_cpus(),
                        "python": platform.python_version(),
                        "processor": platform.processor() or platform.machine()},
            "threads": n, "blocks": len(data), "block_bytes": data[0].nbytes,
            "repeat": args.repeat, "loadavg_before": load0, "loadavg_after": load1,
            "malloc_keeps_freed_memory": kept,
            "rows": [{**asdict(r), "serial_gbps": r.serial_gbps,
                      "threaded_gbps": r.threaded_gbps, "speedup": r.speedup}
                     for r in rows],
        }, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
