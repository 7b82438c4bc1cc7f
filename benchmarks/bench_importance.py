"""Importance sampling against direct (or conditional) sampling and the analytic model.

For a few (fault model, protection, block size, residency) points, runs the same campaign
through the real engine with plain sampling and with ``tilt = "auto"``, and prints P(DUE) per
block from each with its relative error, the analytic ``predict``, and the blocks used.

    .venv/bin/python benchmarks/bench_importance.py [--quick]

Writes benchmarks/results/importance.json.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

from rkv.eval.faults.campaign import CampaignConfig, run_campaign

SMALL: dict[str, int] = {"chunk_tokens": 64, "kv_heads": 1, "head_dim": 64}  # 16 KiB
FULL = {"chunk_tokens": 256, "kv_heads": 3, "head_dim": 64}      # 192 KiB blocks


def raw(ber: float) -> dict[str, Any]:
    return {"model": "raw-ber", "ber": ber}


#: DDR5 with only its word and row faults (SC12 rates), the faults that hit one device lane.
_OFF = {"fit_transient": 0.0, "fit_permanent": 0.0}
LANES = {"preset": "dram-ddr5", "modes": {
    "single-word": {"fit_transient": 1.4, "fit_permanent": 0.3},
    "single-row": {"fit_transient": 0.2, "fit_permanent": 8.2},
    "single-bank": _OFF, "multi-bank": _OFF, "multi-rank": _OFF}}

# (label, fault model, protection, hours, shape, plain sampling, plain trials, IS trials)
POINTS: list[tuple[str, Any, str, float, dict[str, int], str, int, int]] = [
    ("raw-ber 1e-3, 16 KiB", raw(1e-3), "rs(255,239)", 1.0, SMALL, "direct", 300, 40),
    ("raw-ber 4e-5, 16 KiB", raw(4e-5), "bch(m=13,t=2)", 1.0, SMALL, "direct", 300, 40),
    ("raw-ber 4e-7, 192 KiB", raw(4e-7), "rs(255,239)", 1.0, FULL, "conditional", 40, 40),
    ("raw-ber 5e-7, 192 KiB", raw(5e-7), "bch(m=13,t=8)", 1.0, FULL, "conditional", 40, 40),
    ("raw-ber 1e-9, 16 KiB", raw(1e-9), "rs(255,223)", 1.0, SMALL, "conditional", 40, 40),
    ("raw-ber 8e-5, 16 KiB", raw(8e-5), "shardrs(k=8,m=2)", 1.0, SMALL, "direct", 300, 40),
    ("raw-ber 1e-8, 16 KiB", raw(1e-8), "shardrs(k=8,m=2)", 1.0, SMALL, "conditional", 40, 40),
    ("raw-ber 1e-9, 192 KiB", raw(1e-9), "shardrs(k=16,m=2)", 1.0, FULL, "conditional", 40,
     40),
    # The NVMe loss: lost sectors are rebuilt as erasures, so what remains is one latent
    # sector error with two clustered neighbours in the record (three shards) and a run of
    # silently corrupted blocks over three shards (1e-5 of faulty blocks together); the
    # strata plant and the tilted silent class reach them.
    ("nvme-tlc 24 h, 192 KiB", "nvme-tlc", "shardrs(k=16,m=2)", 24.0, FULL, "conditional",
     600, 400),
    # DRAM lane faults (word and row faults: one device lane of every word they span)
    # against an interleaved code: aliasing of the lane stride with the interleave.
    ("dram-ddr5 words+rows 720 h, 192 KiB", LANES,
     "rs(255,239,interleave=16)", 720.0, FULL, "conditional", 40, 40),
]


def plain_due(s: Any) -> tuple[float, float]:
    """P(DUE) per block from a direct or conditional run, with its relative error."""
    n, k = s.blocks, s.counts["due"]
    scale = s.p_any_error if s.sampling == "conditional" else 1.0
    p = k / n
    rel = math.sqrt((1 - p) / k) if k else math.inf
    return scale * p, rel


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="a quarter of the trials")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/importance.json")
    args = ap.parse_args()
    rows = []
    print("| point | protection | plain | plain P(DUE) | rel.err | blocks | IS P(DUE) | "
          "rel.err | blocks | analytic | z(IS vs analytic) |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for label, fm, prot, hours, shape, sampling, n_plain, n_is in POINTS:
        div = 4 if args.quick else 1
        base: dict[str, Any] = dict(fault_model=fm, protection=prot, hours=hours, blocks=10,
                    workers=args.workers, **shape)
        t0 = time.perf_counter()
        plain = run_campaign(CampaignConfig(trials=max(2, n_plain // div), seed=1,
                                            sampling=sampling, **base))
        t1 = time.perf_counter()
        tilted = run_campaign(CampaignConfig(trials=max(2, n_is // div), seed=2, tilt="auto",
                                             **base))
        t2 = time.perf_counter()
        assert tilted.importance is not None
        pd, rel_d = plain_due(plain)
        e = tilted.importance["due"]
        a = tilted.prediction.p_due
        z = (e["estimate"] - a) / e["stderr"] if e["stderr"] > 0 else math.nan
        rows.append({"point": label, "protection": prot, "plain_sampling": sampling,
                     "plain_due": pd, "plain_rel_err": rel_d, "plain_blocks": plain.blocks,
                     "plain_due_blocks": plain.counts["due"], "plain_seconds": t1 - t0,
                     "is_due": e, "is_recovered": tilted.importance["recovered"],
                     "is_blocks": tilted.blocks, "is_seconds": t2 - t1,
                     "plan": tilted.importance["plan"]["note"], "analytic_due": a,
                     "analytic_corrected": tilted.prediction.p_corrected, "z": z})
        rd = f"{rel_d:.0%}" if math.isfinite(rel_d) else "-"
        print(f"| {label} | {prot} | {sampling} | {pd:.3g} | {rd} | {plain.blocks} | "
              f"{e['estimate']:.3g} | {e['rel_err']:.0%} | {tilted.blocks} | {a:.3g} | "
              f"{z:+.1f} |", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=1, default=str) + "\n")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
