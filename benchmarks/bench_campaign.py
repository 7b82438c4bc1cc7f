"""Campaign throughput: blocks per second through the full put / inject / get path.

    .venv/bin/python benchmarks/bench_campaign.py [--trials 50] [--blocks 8] [--repeat 3]

Baseline, measured in the same run: the same blocks through Engine.put and Engine.get with no
injection and no classification, so the ratio is what fault injection and bookkeeping cost.
Block: one SmolLM2-135M block (256 tokens x 3 KV heads x 64 dims, fp16: 192 KiB) by default.
Reports medians over --repeat runs.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from rkv import Engine, EngineConfig, ModelSpec
from rkv.eval.faults.campaign import CampaignConfig, run_campaign

CASES = [
    ("nvme-tlc, shardrs(k=16,m=2)", {"tier": "nvme"}),
    ("cxl, rs(255,247)", {"tier": "cxl"}),
    ("raw-ber 1e-5, rs(255,239)", {"fault_model": {"model": "raw-ber", "ber": 1e-5},
                                   "protection": "rs(255,239)", "sampling": "direct"}),
    ("raw-ber 1e-5, none", {"fault_model": {"model": "raw-ber", "ber": 1e-5},
                            "protection": "none", "sampling": "direct"}),
    ("raw-ber 1e-5, raw (peer)", {"fault_model": {"model": "raw-ber", "ber": 1e-5},
                                  "protection": "raw", "sampling": "direct"}),
]


def baseline(cfg: CampaignConfig) -> float:
    """Blocks/s of plain put + get of the same number of fresh blocks."""
    spec = ModelSpec("bench", 1, cfg.kv_heads, cfg.head_dim)
    root = Path(tempfile.mkdtemp(prefix="rkv-bench-"))
    tier = cfg.tier_config()
    rng = np.random.default_rng(0)
    n = cfg.trials * cfg.blocks
    try:
        with Engine.open(root, EngineConfig(chunk_tokens=cfg.chunk_tokens, tiers=(tier,))) as e:
            t0 = time.perf_counter()
            for _ in range(n):
                toks = rng.integers(0, 1 << 31, cfg.chunk_tokens)
                kv = rng.standard_normal((1, 2, cfg.chunk_tokens, cfg.kv_heads, cfg.head_dim),
                                         dtype=np.float32).astype(np.float16)
                e.put(toks, kv, model=spec)
                e.get(toks, model=spec)
            return n / (time.perf_counter() - t0)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--trials", type=int, default=50)
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = []
    for name, over in CASES:
        cfg = CampaignConfig(trials=args.trials, blocks=args.blocks, seed=1, **over)  # type: ignore[arg-type]
        camp, base = [], []
        for _ in range(args.repeat):
            s = run_campaign(cfg)
            camp.append(s.blocks / s.seconds)
            base.append(baseline(cfg))
        c, b = statistics.median(camp), statistics.median(base)
        rows.append({"case": name, "campaign_blocks_per_s": c, "baseline_blocks_per_s": b,
                     "ratio": c / b, "sampling": s.sampling})
    print(f"\n{args.trials} trials x {args.blocks} blocks of 192 KiB, median of {args.repeat}\n")
    print("| case | sampling | campaign blocks/s | put+get blocks/s | ratio |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['case']} | {r['sampling']} | {r['campaign_blocks_per_s']:.0f} | "
              f"{r['baseline_blocks_per_s']:.0f} | {r['ratio']:.2f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
