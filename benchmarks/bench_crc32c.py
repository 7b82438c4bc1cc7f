"""CRC-32C: ``google_crc32c`` (hardware CRC32 instructions) against rkv's former numba kernel.

Usage::

    .venv/bin/python benchmarks/bench_crc32c.py [--repeat 9] [--json out.json]

Measured in one run, single thread, on random data:

* one buffer per call, 64 B .. 4 MiB: ``rkv.ecc.crc32c.crc32c`` (what the ``crc32c`` codec and
  ``shardrs(checksum=crc32c)`` call) against the numba slicing-by-8 kernel;
* the incremental API: a 4 MiB buffer CRC'd in 4 KiB pieces, each continuing the previous
  value (``google_crc32c.extend`` against the numba kernel's ``crc`` argument);
* many tiny buffers: a ``(rows, width)`` array with one CRC per row, as a Python loop over
  ``google_crc32c.value`` against one numba call that loops over the rows (the case where the
  library's per-call cost could lose to a compiled loop).

Every figure is the median of ``--repeat`` runs; each run calls the function enough times to
take about 20 ms. The ratio is google / numba speed, both measured here. Timings are never
used in pass/fail tests. The numba kernel lives in this file now (rkv no longer ships it).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from functools import cache, partial
from pathlib import Path
from typing import Any

import google_crc32c
import numba
import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rkv.buffers import as_u8
from rkv.ecc.crc32c import crc32c

POLY = 0x82F63B78  # CRC-32C, reflected
SIZES = (64, 512, 4 << 10, 64 << 10, 1 << 20, 4 << 20)


@cache
def tables() -> npt.NDArray[np.uint32]:
    """``(8, 256)`` slicing-by-8 tables: ``t[0]`` byte-wise, ``t[j]`` shifts j more bytes."""
    t = np.zeros((8, 256), dtype=np.uint32)
    for v in range(256):
        c = v
        for _ in range(8):
            c = (c >> 1) ^ (POLY if c & 1 else 0)
        t[0, v] = c
    for j in range(1, 8):
        t[j] = (t[j - 1] >> 8) ^ t[0][t[j - 1] & 0xFF]
    return t


@numba.njit(cache=True, nogil=True)
def _update(crc: int, data: Any, t: Any) -> int:  # pragma: no cover - compiled
    c = np.uint32(crc)
    n = data.shape[0]
    i = 0
    while i + 8 <= n:
        lo = (np.uint32(data[i]) | (np.uint32(data[i + 1]) << 8)
              | (np.uint32(data[i + 2]) << 16) | (np.uint32(data[i + 3]) << 24)) ^ c
        hi = (np.uint32(data[i + 4]) | (np.uint32(data[i + 5]) << 8)
              | (np.uint32(data[i + 6]) << 16) | (np.uint32(data[i + 7]) << 24))
        c = (t[7, lo & 0xFF] ^ t[6, (lo >> 8) & 0xFF] ^ t[5, (lo >> 16) & 0xFF] ^ t[4, lo >> 24]
             ^ t[3, hi & 0xFF] ^ t[2, (hi >> 8) & 0xFF] ^ t[1, (hi >> 16) & 0xFF]
             ^ t[0, hi >> 24])
        i += 8
    while i < n:
        c = t[0, (c ^ np.uint32(data[i])) & 0xFF] ^ (c >> 8)
        i += 1
    return int(c)


@numba.njit(cache=True, nogil=True)
def _rows(data: Any, t: Any, out: Any) -> None:  # pragma: no cover - compiled
    for r in range(data.shape[0]):
        out[r] = _update(0xFFFFFFFF, data[r], t) ^ 0xFFFFFFFF


def numba_crc(data: Any, crc: int = 0) -> int:
    """The slicing-by-8 kernel rkv used as its fallback (same value as google_crc32c)."""
    return _update(crc ^ 0xFFFFFFFF, data, tables()) ^ 0xFFFFFFFF


def numba_rows(data: Any) -> npt.NDArray[np.uint32]:
    out = np.empty(data.shape[0], np.uint32)
    _rows(data, tables(), out)
    return out


def google_rows(data: Any) -> list[int]:
    v = google_crc32c.value
    return [v(row) for row in data]


def per_second(fn: Callable[[], Any], repeat: int, budget: float = 0.02) -> tuple[float, int]:
    """Median seconds per call over ``repeat`` runs of ``n`` calls each (n fills ``budget``)."""
    fn()
    n, t0 = 1, time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-7)
    n = max(1, int(budget / one))
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        runs.append((time.perf_counter() - t0) / n)
    return statistics.median(runs), n


def google_extend(data: Any, crc: int) -> int:
    return int(google_crc32c.extend(crc, data))


def chained(crc_fn: Callable[[Any, int], int], pieces: list[Any]) -> int:
    c = 0
    for p in pieces:
        c = crc_fn(p, c)
    return c


def row(group: str, name: str, nbytes: int, g: float, nb: float) -> dict[str, Any]:
    return {"group": group, "case": name, "bytes": nbytes, "google_s": g, "numba_s": nb,
            "google_gbps": nbytes / g / 1e9, "numba_gbps": nbytes / nb / 1e9, "ratio": nb / g}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if google_crc32c.implementation != "c":
        print(f"google_crc32c implementation is {google_crc32c.implementation!r}, not 'c'")
    rng = np.random.default_rng(0)
    rows: list[dict[str, Any]] = []

    for size in SIZES:
        d = as_u8(rng.integers(0, 256, size, dtype=np.uint8))
        assert crc32c(d) == numba_crc(d) == google_crc32c.value(d.tobytes())
        g, _ = per_second(partial(crc32c, d), args.repeat)
        nb, _ = per_second(partial(numba_crc, d), args.repeat)
        rows.append(row("one buffer", f"{size} B", size, g, nb))

    big = as_u8(rng.integers(0, 256, 4 << 20, dtype=np.uint8))
    for piece in (4 << 10, 64 << 10):
        pieces = [big[i : i + piece] for i in range(0, big.shape[0], piece)]
        want = crc32c(big)
        assert chained(google_extend, pieces) == chained(numba_crc, pieces) == want
        g, _ = per_second(partial(chained, google_extend, pieces), args.repeat)
        nb, _ = per_second(partial(chained, numba_crc, pieces), args.repeat)
        rows.append(row("extend", f"4 MiB in {piece >> 10} KiB pieces", big.shape[0], g, nb))

    for nrows, width in ((4096, 16), (4096, 64), (1024, 512), (18, 64), (18, 12 << 10)):
        m = rng.integers(0, 256, (nrows, width), dtype=np.uint8)
        assert [int(x) for x in numba_rows(m)] == google_rows(m)
        g, _ = per_second(partial(google_rows, m), args.repeat)
        nb, _ = per_second(partial(numba_rows, m), args.repeat)
        rows.append(row("per row", f"{nrows} rows x {width} B", nrows * width, g, nb))

    print(f"CRC-32C, median of {args.repeat} runs, one thread; google_crc32c "
          f"{google_crc32c.implementation}, numba {numba.__version__}, {platform.machine()}")
    print(f"{'group':<11} {'case':<26} {'google GB/s':>11} {'numba GB/s':>10} {'google ns':>10}"
          f" {'numba ns':>10} {'ratio':>7}")
    for r in rows:
        print(f"{r['group']:<11} {r['case']:<26} {r['google_gbps']:>11.2f} {r['numba_gbps']:>10.2f}"
              f" {r['google_s'] * 1e9:>10.0f} {r['numba_s'] * 1e9:>10.0f} {r['ratio']:>6.2f}x")
    if args.json:
        meta = {"repeat": args.repeat, "implementation": google_crc32c.implementation,
                "numba": numba.__version__, "machine": platform.machine()}
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
