"""Throughput of the rkv.quant ``kivi`` quantizer against a plain torch implementation.

Usage::

    .venv/bin/python benchmarks/bench_quant.py [--size-mib 64] [--repeat 5] [--json out.json]
                                               [--bits 8 4 2] [--threads 1]

For each block shape (SmolLM2-135M ``[2, 256, 3, 64]`` and Llama-3-8B ``[2, 256, 8, 128]``,
float16) and each bit width, it quantizes and dequantizes ``--size-mib`` MiB of KV (as many
distinct blocks as that takes, one block per call, as the engine does) and reports GB/s of
float16 KV (input bytes for quantize, output bytes for dequantize), the median of
``--repeat`` runs. The torch baseline is the same math (KIVI min/max groups, round to nearest,
bit packing; scales and zeros kept as float16, without rkv's three checksummed copies) in
plain torch ops, block by block, measured in the same run with ``torch.set_num_threads``
``--threads``; ratio = rkv / torch. Timings are never used in pass/fail tests.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rkv.quant import KiviQuantizer

SHAPES = {
    "SmolLM2-135M": (2, 256, 3, 64),
    "Llama-3-8B": (2, 256, 8, 128),
}


@dataclass
class Row:
    model: str
    shape: list[int]
    bits: int
    op: str  # "quantize" | "dequantize"
    nbytes: int  # float16 KV bytes per run
    rkv_s: float
    torch_s: float
    compression: float  # float16 bytes / rkv encoded bytes
    rkv_runs: list[float] = field(default_factory=list)
    torch_runs: list[float] = field(default_factory=list)

    @property
    def rkv_gbps(self) -> float:
        return self.nbytes / self.rkv_s / 1e9

    @property
    def torch_gbps(self) -> float:
        return self.nbytes / self.torch_s / 1e9


def timeit(fn: Callable[[], Any], repeat: int) -> tuple[float, list[float]]:
    fn()  # warm-up (and numba compilation)
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs), runs


def kv_like(rng: np.random.Generator, n: int, shape: tuple[int, ...]) -> np.ndarray:
    """``n`` float16 blocks with KV-like statistics: keys with a few large channels, values
    roughly uniform in scale."""
    h, d = shape[2], shape[3]
    x = rng.standard_normal((n, *shape), dtype=np.float32)
    chan = np.where(rng.random((h, d)) < 0.05, 15.0, 1.0).astype(np.float32)
    x[:, 0] *= chan
    x[:, 0] += rng.standard_normal((h, d)).astype(np.float32)
    return x.astype(np.float16)


# ---------------------------------------------------------------------- torch baseline
class TorchKivi:
    """KIVI in plain torch ops: keys per channel, values per token, packed codes."""

    def __init__(self, bits: int, group: int) -> None:
        import torch

        self.torch = torch
        self.bits = bits
        self.group = group
        self.levels = (1 << bits) - 1

    def _quant(self, x: Any, lo: Any, hi: Any) -> tuple[Any, Any, Any]:
        torch = self.torch
        s = (hi - lo) / self.levels
        d = torch.where(s == 0, torch.ones_like(s), s)
        return s, lo, d

    def encode(self, block: Any) -> tuple[Any, ...]:
        torch = self.torch
        x = block.float()
        _, t, h, d = x.shape
        g = self.group
        nkt = -(-t // g)
        keys = x[0]
        if t % g:  # ragged last group: pad by repeating the last token
            keys = torch.cat([keys, keys[-1:].expand(nkt * g - t, h, d)])
        kg = keys.view(nkt, g, h, d)
        ks, kz, kd = self._quant(kg, kg.amin(dim=1, keepdim=True), kg.amax(dim=1, keepdim=True))
        kq = ((kg - kz) / kd).round_().clamp_(0, self.levels).to(torch.uint8)
        kq = kq.view(-1, h, d)[:t]
        gv = min(g, d)
        vals = x[1].view(t, h, d // gv, gv)
        vs, vz, vd = self._quant(vals, vals.amin(dim=3, keepdim=True),
                                 vals.amax(dim=3, keepdim=True))
        vq = ((vals - vz) / vd).round_().clamp_(0, self.levels).to(torch.uint8)
        codes = torch.cat([kq.reshape(-1), vq.reshape(-1)])
        per = 8 // self.bits
        if per > 1:
            c = codes.view(-1, per)
            packed = c[:, 0].clone()
            for j in range(1, per):
                packed |= c[:, j] << (j * self.bits)
            codes = packed
        return codes, ks.half(), kz.half(), vs.half(), vz.half()

    def decode(self, enc: tuple[Any, ...], shape: tuple[int, ...]) -> Any:
        torch = self.torch
        codes, ks, kz, vs, vz = enc
        _, t, h, d = shape
        per = 8 // self.bits
        if per > 1:
            mask = self.levels
            codes = torch.stack([(codes >> (j * self.bits)) & mask for j in range(per)],
                                dim=1).reshape(-1)
        n = t * h * d
        g = self.group
        nkt = -(-t // g)
        kq = codes[:n].view(t, h, d).float()
        if t % g:
            kq = torch.cat([kq, kq.new_zeros(nkt * g - t, h, d)])
        keys = (kz.float() + kq.view(nkt, g, h, d) * ks.float()).view(-1, h, d)[:t]
        gv = min(g, d)
        vq = codes[n:].view(t, h, d // gv, gv).float()
        vals = (vz.float() + vq * vs.float()).view(t, h, d)
        return torch.stack([keys, vals]).half()


# ---------------------------------------------------------------------- main
def bench_bits(model: str, shape: tuple[int, int, int, int], bits: int,
               blocks: list[np.ndarray], tblocks: list[Any], repeat: int) -> list[Row]:
    q = KiviQuantizer(bits, 32)
    tq = TorchKivi(bits, 32)
    block_bytes = blocks[0].nbytes
    nbytes = len(blocks) * block_bytes
    encs = [q.encode(b) for b in blocks]
    tencs = [tq.encode(b) for b in tblocks]
    ratio = block_bytes / len(encs[0])
    # sanity: both implementations agree to within a few quantization steps
    a = q.decode(encs[0], shape, "float16").astype(np.float32)
    b = tq.decode(tencs[0], shape).numpy().astype(np.float32)
    assert np.abs(a - b).max() <= np.abs(blocks[0]).max() / (1 << bits) * 4 + 0.01

    def rkv_quant() -> None:
        for blk in blocks:
            q.encode(blk)

    def rkv_dequant() -> None:
        for e in encs:
            q.decode(e, shape, "float16")

    def torch_quant() -> None:
        for blk in tblocks:
            tq.encode(blk)

    def torch_dequant() -> None:
        for e in tencs:
            tq.decode(e, shape)

    rows = []
    for op, f_rkv, f_t in (("quantize", rkv_quant, torch_quant),
                           ("dequantize", rkv_dequant, torch_dequant)):
        rs, rruns = timeit(f_rkv, repeat)
        ts, truns = timeit(f_t, repeat)
        row = Row(model, list(shape), bits, op, nbytes, rs, ts, ratio, rruns, truns)
        rows.append(row)
        print(f"  {model:13s} {bits} bit {op:10s} rkv {row.rkv_gbps:6.2f} GB/s   "
              f"torch {row.torch_gbps:6.2f} GB/s   x{row.rkv_gbps / row.torch_gbps:5.1f}",
              flush=True)
    return rows


def run(size_mib: int, repeat: int, bits_list: list[int], threads: int) -> list[Row]:
    import torch

    torch.set_num_threads(threads)
    rng = np.random.default_rng(2024)
    rows: list[Row] = []
    for model, shape in SHAPES.items():
        block_bytes = int(np.prod(shape)) * 2
        n = max(1, -(-size_mib * (1 << 20) // block_bytes))
        data = kv_like(rng, n, shape)
        blocks = [data[i] for i in range(n)]
        tblocks = [torch.from_numpy(b) for b in blocks]
        for bits in bits_list:
            rows += bench_bits(model, shape, bits, blocks, tblocks, repeat)
    return rows


def table(rows: list[Row]) -> str:
    out = ["| model | block shape | bits | op | rkv GB/s | torch GB/s | rkv / torch | "
           "compression |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(
            f"| {r.model} | {r.shape} | {r.bits} | {r.op} | {r.rkv_gbps:.2f} | "
            f"{r.torch_gbps:.2f} | {r.rkv_gbps / r.torch_gbps:.1f}x | {r.compression:.2f}x |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mib", type=int, default=64, help="MiB of float16 KV per run")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--bits", type=int, nargs="+", default=[8, 4, 2])
    ap.add_argument("--threads", type=int, default=1, help="torch threads (rkv uses one)")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args(argv)
    if args.size_mib < 64:
        print("note: --size-mib below 64 MiB; numbers are noisier", file=sys.stderr)
    import numba
    import torch

    env = {
        "python": platform.python_version(), "numpy": np.__version__,
        "numba": numba.__version__, "torch": torch.__version__,
        "machine": platform.machine(), "processor": platform.processor(),
        "cpus": os.cpu_count(), "torch_threads": args.threads,
    }
    print(f"rkv.quant benchmark: {args.size_mib} MiB per run, median of {args.repeat}, "
          f"float16 KV, group 32; {env}")
    rows = run(args.size_mib, args.repeat, args.bits, args.threads)
    print()
    print(table(rows))
    if args.json:
        data = {"env": env, "size_mib": args.size_mib, "repeat": args.repeat,
                "rows": [{**asdict(r), "rkv_gbps": r.rkv_gbps, "torch_gbps": r.torch_gbps,
                          "ratio": r.rkv_gbps / r.torch_gbps} for r in rows]}
        args.json.write_text(json.dumps(data, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
