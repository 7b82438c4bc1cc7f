"""Throughput of the rkv.ecc codecs against reedsolo, galois, bchlib and numpy memcpy.

Usage::

    .venv/bin/python benchmarks/bench_ecc.py [--size-mib 16] [--repeat 5] [--json out.json]
                                             [--no-compile]

Every number is the median of ``--repeat`` runs, single thread, on ``--size-mib`` MiB of random
data. The slow pure-Python / generic baselines run on a smaller slice (noted per row) and are
scaled to throughput; ratios compare numbers measured in the same run. The compile-cost table
times the first calls in fresh subprocesses: once with an empty numba cache (cold) and once with
that cache filled (warm). Timings are never used in pass/fail tests.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rkv.ecc import BCHCodec, RSCodec, ShardRSCodec, get_codec


@dataclass
class Row:
    group: str
    name: str
    nbytes: int  # data bytes processed per run
    seconds: float  # median
    baseline: str = ""
    ratio: float | None = None  # this row's speed / baseline speed
    target: str = ""
    met: bool | None = None
    note: str = ""
    runs: list[float] = field(default_factory=list)

    @property
    def gbps(self) -> float:
        return self.nbytes / self.seconds / 1e9


def timeit(fn: Callable[[], Any], repeat: int, warmup: int = 1) -> tuple[float, list[float]]:
    for _ in range(warmup):
        fn()
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs), runs


def flip_bits(buf: bytes, ber: float, rng: np.random.Generator, lo: int = 0,
              hi: int | None = None) -> bytes:
    """``buf`` with each bit in ``[lo, hi)`` bytes flipped with probability ``ber``."""
    arr = np.frombuffer(buf, dtype=np.uint8).copy()
    hi = len(arr) if hi is None else hi
    nbits = 8 * (hi - lo)
    k = rng.binomial(nbits, ber)
    bits = rng.choice(nbits, size=k, replace=False) + 8 * lo
    np.bitwise_xor.at(arr, bits // 8, (0x80 >> (bits % 8)).astype(np.uint8))
    return arr.tobytes()


def flip_per_chunk(buf: bytes, c: BCHCodec, size: int, nerr: int,
                   rng: np.random.Generator) -> bytes:
    """``nerr`` random bit errors in every chunk's data."""
    arr = np.frombuffer(buf, dtype=np.uint8).copy()
    cb = c.chunk_bytes
    for q in range(-(-size // cb)):
        n = min(cb, size - q * cb)
        bits = rng.choice(8 * n, size=min(nerr, 8 * n), replace=False)
        np.bitwise_xor.at(arr, q * cb + bits // 8, (0x80 >> (bits % 8)).astype(np.uint8))
    return arr.tobytes()


class Bench:
    def __init__(self, size: int, repeat: int) -> None:
        self.size = size
        self.repeat = repeat
        self.rng = np.random.default_rng(12345)
        self.data = self.rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        self.rows: list[Row] = []

    def add(self, group: str, name: str, nbytes: int, fn: Callable[[], Any],
            repeat: int | None = None, **kw: Any) -> Row:
        sec, runs = timeit(fn, repeat or self.repeat)
        row = Row(group, name, nbytes, sec, runs=runs, **kw)
        self.rows.append(row)
        print(f"  {group:10s} {name:58s} {row.gbps:8.3f} GB/s", flush=True)
        return row

    @staticmethod
    def compare(row: Row, base: Row, target: float | None = None) -> None:
        row.baseline = base.name
        row.ratio = row.gbps / base.gbps
        if target is not None:
            row.target = f">= {target:g}x {base.name.split(' ')[0]}"
            row.met = row.ratio >= target

    @staticmethod
    def floor(row: Row, gbps: float) -> None:
        row.target = (f">= {gbps:g} GB/s" if gbps >= 1 else f">= {gbps * 1000:g} MB/s")
        row.met = row.gbps >= gbps

    # ------------------------------------------------------------------ groups
    def baselines(self) -> None:
        arr = np.frombuffer(self.data, dtype=np.uint8)
        self.memcpy = self.add("baseline", "numpy memcpy (arr.copy())", self.size, arr.copy)
        self.add("baseline", "xxh3_64 of the data", self.size,
                 lambda: xxhash.xxh3_64_intdigest(self.data))

    def rs(self) -> None:
        import galois
        import reedsolo

        d = self.data
        c223 = get_codec("rs(255,223)")
        c239 = get_codec("rs(255,239)")
        assert isinstance(c223, RSCodec) and isinstance(c239, RSCodec)
        e223 = c223.encode(d)
        r = self.add("rs", "rs(255,223) encode", self.size, lambda: c223.encode(d))
        self.floor(r, 0.8)
        # galois on a 1 MiB slice, pre-built field array (its conversion is not timed)
        gl = galois.ReedSolomon(255, 223, c=0)
        nmsg = (1 << 20) // 223
        msgs = gl.field(np.frombuffer(d[: nmsg * 223], dtype=np.uint8).reshape(nmsg, 223))
        g = self.add("rs", "galois ReedSolomon(255,223,c=0).encode [1 MiB slice]", nmsg * 223,
                     lambda: gl.encode(msgs), repeat=max(3, self.repeat // 2))
        rsol = reedsolo.RSCodec(32, nsize=255)
        small = d[: 223 * 64]
        s = self.add("rs", "reedsolo RSCodec(32).encode [14 KiB slice]", len(small),
                     lambda: rsol.encode(small), repeat=3)
        r2 = Row("rs", "rs(255,223) encode vs galois", r.nbytes, r.seconds)
        self.compare(r2, g, 50)
        r3 = Row("rs", "rs(255,223) encode vs reedsolo", r.nbytes, r.seconds)
        self.compare(r3, s, 1000)
        self.rows += [r2, r3]
        r = self.add("rs", "rs(255,239) encode", self.size, lambda: c239.encode(d))
        self.floor(r, 1.5)
        c8 = get_codec("rs(255,223,interleave=8)")
        self.add("rs", "rs(255,223,interleave=8) encode", self.size, lambda: c8.encode(d))
        self.add("rs", "rs(255,223) decode, clean (full syndrome check)", self.size,
                 lambda: c223.decode(e223))
        r = self.add("rs", "rs(255,223) verified read: systematic_data + xxh3", self.size,
                     lambda: xxhash.xxh3_64_intdigest(c223.systematic_data(e223)))
        self.floor(r, 5.0)
        for c, name in ((c223, "rs(255,223)"), (c239, "rs(255,239)")):
            enc = c.encode(d)
            bad = flip_bits(enc, 1e-4, self.rng)
            res = c.decode(bad)
            assert res.data == d, res.status
            r = self.add("rs", f"{name} decode, BER 1e-4 ({res.n_corrected} bytes fixed)",
                         self.size, lambda c=c, bad=bad: c.decode(bad))  # type: ignore[misc]
            self.floor(r, 0.1)
        # reedsolo decoding the same kind of damage, on a slice
        bad_small = flip_bits(rsol.encode(small), 1e-3, self.rng)
        self.add("rs", "reedsolo RSCodec(32).decode, BER 1e-3 [14 KiB slice]", len(small),
                 lambda: rsol.decode(bad_small), repeat=3)

    def shardrs(self) -> None:
        d = self.data
        for spec, target in (("shardrs(k=16,m=2)", 4.0), ("shardrs(k=16,m=4)", None),
                             ("shardrs(k=16,m=2,checksum=crc32c)", None)):
            c = get_codec(spec)
            assert isinstance(c, ShardRSCodec)
            enc = c.encode(d)
            r = self.add("shardrs", f"{spec} encode", self.size, lambda c=c: c.encode(d))
            if target:
                self.floor(r, target)
            self.add("shardrs", f"{spec} decode, clean (shard checksums)", self.size,
                     lambda c=c, enc=enc: c.decode(enc))
            if spec.endswith("m=2)"):
                self.add("shardrs", f"{spec} verified read: systematic_data + xxh3",
                         self.size,
                         lambda c=c, enc=enc: xxhash.xxh3_64_intdigest(c.systematic_data(enc)))
            s = c.shard_size(len(d))
            arr = np.frombuffer(enc, dtype=np.uint8).copy()
            for j in range(c.m):  # lose m shards: data shard 0 .. m-1
                arr[j * s : (j + 1) * s] = self.rng.integers(0, 256, s, dtype=np.uint8)
            lost = arr.tobytes()
            assert c.decode(lost).data == d
            self.add("shardrs", f"{spec} decode, {c.m} shards lost", self.size,
                     lambda c=c, lost=lost: c.decode(lost))
            if spec == "shardrs(k=16,m=4)":
                bad = flip_bits(enc, 1e-6, self.rng, 0, c.n * s)
                assert c.decode(bad).data == d
                self.add("shardrs", f"{spec} decode, BER 1e-6 everywhere (column decoding)",
                         self.size, lambda c=c, bad=bad: c.decode(bad))

    def bch(self) -> None:
        import bchlib

        for m, t in ((13, 40), (14, 40), (13, 8)):
            c = get_codec({"id": "bch", "m": m, "t": t})
            assert isinstance(c, BCHCodec)
            cb = c.chunk_bytes
            size = self.size // cb * cb
            d = self.data[:size]
            chunks = [bytearray(d[i : i + cb]) for i in range(0, size, cb)]
            ref = bchlib.BCH(t, m=m)
            spec = f"bch(m={m},t={t}) [{cb} B chunks]"
            r = self.add("bch", f"{spec} encode", size, lambda c=c, d=d: c.encode(d))
            b = self.add("bch", f"bchlib BCH({t}, m={m}) encode", size,
                         lambda ref=ref, chunks=chunks: [ref.encode(x) for x in chunks])
            self.compare(r, b, 1.0)
            enc = c.encode(d)
            self.add("bch", f"{spec} decode, clean", size, lambda c=c, enc=enc: c.decode(enc))
            cases: list[tuple[str, bytes, int]] = [
                ("BER 1e-4", flip_bits(enc, 1e-4, self.rng, 0, size), size),
            ]
            if (m, t) == (13, 40):
                small = min(size, 1 << 21)
                enc_s = c.encode(d[:small])
                cases += [
                    (f"{t // 2} errors/chunk", flip_per_chunk(enc_s, c, small, t // 2, self.rng),
                     small),
                    (f"{t} errors/chunk", flip_per_chunk(enc_s, c, small, t, self.rng), small),
                ]
            for label, bad, n in cases:
                res = c.decode(bad)
                assert res.data == d[:n], (spec, label, res.status)
                eb = c.ecc_bytes
                pairs = [(bytearray(bad[i : i + cb]), bytearray(bad[n + q * eb : n + (q + 1) * eb]))
                         for q, i in enumerate(range(0, n, cb))]

                def ref_decode(ref: Any = ref, pairs: list[tuple[bytearray, bytearray]] = pairs
                               ) -> None:
                    for x, e in pairs:
                        xx, ee = bytearray(x), bytearray(e)
                        if ref.decode(xx, ee) > 0:
                            ref.correct(xx, ee)

                r = self.add("bch", f"{spec} decode, {label}", n,
                             lambda c=c, bad=bad: c.decode(bad))
                b = self.add("bch", f"bchlib BCH({t}, m={m}) decode+correct, {label}", n,
                             ref_decode, repeat=max(3, self.repeat // 2))
                self.compare(r, b, 0.5)

    def checksums(self) -> None:
        d = self.data
        for spec in ("crc32c", "xxh3"):
            c = get_codec(spec)
            enc = c.encode(d)
            self.add("checksum", f"{spec} encode", self.size, lambda c=c: c.encode(d))
            self.add("checksum", f"{spec} decode (verify + copy out)", self.size,
                     lambda c=c, enc=enc: c.decode(enc))


COMPILE_SNIPPET = r"""
import json, time
t0 = time.perf_counter()
import rkv.ecc as E
res = {"import rkv.ecc": time.perf_counter() - t0}
data = bytes(range(256)) * 64
for spec in ["rs(255,223)", "rs(255,239)", "bch(m=13,t=40)", "shardrs(k=16,m=2)",
             "shardrs(k=16,m=4)"]:
    c = E.get_codec(spec)
    t0 = time.perf_counter(); enc = c.encode(data); t1 = time.perf_counter()
    bad = bytearray(enc); bad[5] ^= 1; bad[len(bad) // 2] ^= 0x10
    if spec.startswith("shardrs"):
        s = c.shard_size(len(data)); bad[:s] = bytes(s)
    t2 = time.perf_counter(); r = c.decode(bytes(bad)); t3 = time.perf_counter()
    assert r.data == data
    res[spec + " first encode"] = t1 - t0
    res[spec + " first decode (with repairs)"] = t3 - t2
print(json.dumps(res))
"""


def compile_cost() -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    root = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, NUMBA_CACHE_DIR=tmp, PYTHONPATH=str(root))
        for label in ("cold", "warm"):
            t0 = time.perf_counter()
            proc = subprocess.run([sys.executable, "-c", COMPILE_SNIPPET], env=env, cwd=root,
                                  capture_output=True, text=True, check=True)
            res = json.loads(proc.stdout.strip().splitlines()[-1])
            res["whole process"] = time.perf_counter() - t0
            out[label] = res
    return out


def machine() -> dict[str, str]:
    import numba

    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "numba": numba.__version__,
        "platform": platform.platform(),
    }


def fmt_rate(gbps: float) -> str:
    return f"{gbps:.2f} GB/s" if gbps >= 0.1 else f"{gbps * 1000:.3g} MB/s"


def markdown(rows: list[Row], comp: dict[str, dict[str, float]] | None,
             info: dict[str, str], args: argparse.Namespace) -> str:
    lines = [
        f"Command: `.venv/bin/python benchmarks/bench_ecc.py --size-mib {args.size_mib} "
        f"--repeat {args.repeat}`  ",
        f"Machine: {info['cpu']}, {info['cores']} cores (shared), Python {info['python']}, "
        f"numpy {info['numpy']}, numba {info['numba']}; single thread, medians.",
        "",
        "| group | what | throughput | vs baseline | target | met |",
        "|---|---|---:|---:|---|:---:|",
    ]
    for r in rows:
        ratio = f"{r.ratio:.3g}x {r.baseline.split(' [')[0]}" if r.ratio is not None else ""
        met = "" if r.met is None else ("yes" if r.met else "**no**")
        lines.append(f"| {r.group} | {r.name} | {fmt_rate(r.gbps)} | {ratio} | {r.target} "
                     f"| {met} |")
    if comp:
        lines += ["", "Compile cost (first calls in a fresh process; seconds):", "",
                  "| step | cold cache | warm cache |", "|---|---:|---:|"]
        for key in comp["cold"]:
            lines.append(f"| {key} | {comp['cold'][key]:.2f} | {comp['warm'][key]:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mib", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--no-compile", action="store_true", help="skip the compile-cost runs")
    ap.add_argument("--only", default="", help="comma list of groups: rs,shardrs,bch,checksum")
    args = ap.parse_args(argv)
    info = machine()
    print(f"# rkv.ecc benchmark: {args.size_mib} MiB, median of {args.repeat}", flush=True)
    print(f"# {info}", flush=True)
    b = Bench(args.size_mib << 20, args.repeat)
    b.baselines()
    groups = [g for g in args.only.split(",") if g] or ["rs", "shardrs", "bch", "checksum"]
    for g in groups:
        getattr(b, {"checksum": "checksums"}.get(g, g))()
    comp = None if args.no_compile else compile_cost()
    md = markdown(b.rows, comp, info, args)
    print()
    print(md)
    if args.json:
        args.json.write_text(json.dumps({
            "machine": info, "size_bytes": b.size, "repeat": args.repeat,
            "rows": [dict(asdict(r), gbps=r.gbps) for r in b.rows],
            "compile_seconds": comp,
        }, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
