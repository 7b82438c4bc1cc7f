"""The record framing's share of P(DUE), against a first-principles formula, and the NVMe
shard point with and without exact event counts.

    .venv/bin/python benchmarks/bench_framing.py [--json benchmarks/results/framing.json]

**Bit errors** (``raw-ber``, 192 KiB blocks, 1 h): a block is lost to its framing when all
three copies of the header (or of the prelude) hold an error and two of them share a wrong
bit, which the decoder cannot outvote and no copy alone verifies (docs/format.md). To
leading order, for copies of ``n`` bytes at bit error rate ``p``::

    3 * (1 - (1 - p^2)^(8n)) * (1 - (1 - p)^(8n))

summed over the header (``n = L``) and the prelude (``n = 8``). This formula is written here,
independently of :mod:`rkv.faults.fatality`; ``predict`` must agree with it where the framing
dominates (the payload's code is far stronger) and exceed it where the payload fails first.

**The NVMe point** (``nvme-tlc``, 24 h, 192 KiB, ``shardrs(k=16,m=2)``): ``predict`` by its
default sampled draws and with ``exact_counts=True`` (every number of lost sectors at its
exact probability). With the spread framing (record format v3) no two lost sectors lose a
block, so the two agree; with the old framing the exact count was 4.8e-13 and the default
1.7e-14 (docs/reliability.md).
"""

from __future__ import annotations

import argparse
import json
import math
import time

import faultmodels
from rkv.faults.fatality import layout_for
from rkv.faults.reliability import predict

BLOCK = 196608
POINTS = (("rs(255,239)", 4e-7), ("bch(m=13,t=8)", 5e-7), ("rs(255,223)", 1e-9),
          ("rs(255,251)", 1e-12))


def framing_term(nbytes: int, p: float) -> float:
    """Leading-order P(three copies of ``nbytes`` bytes are lost): see the module docstring."""
    bits = 8 * nbytes
    hit = -math.expm1(bits * math.log1p(-p))
    share = -math.expm1(bits * math.log1p(-p * p))
    return 3 * share * hit


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = []
    print("| code | BER | header copy (bytes) | predict P(DUE) | framing, first principles "
          "| ratio |")
    print("|---|---|---|---|---|---|")
    for code, ber in POINTS:
        model = faultmodels.get_model({"model": "raw-ber", "ber": ber})
        hlen = layout_for(code, BLOCK).hlen
        fp = framing_term(hlen, ber) + framing_term(8, ber)
        got = predict(code, BLOCK, model, 1.0).p_due
        rows.append({"code": code, "ber": ber, "hlen": hlen, "predict": got, "framing": fp})
        print(f"| {code} | {ber:g} | {hlen} | {got:.4g} | {fp:.4g} | {got / fp:.4g} |")
    nvme = faultmodels.get_model("nvme-tlc")
    for exact in (False, True):
        t = time.perf_counter()
        p = predict("shardrs(k=16,m=2)", BLOCK, nvme, 24.0, exact_counts=exact).p_due
        s = time.perf_counter() - t
        rows.append({"nvme_exact_counts": exact, "p_due": p, "seconds": s})
        print(f"nvme-tlc 24 h shardrs(k=16,m=2), exact_counts={exact}: {p:.4g} ({s:.1f} s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
