"""Plan time inside the engine on the enlarged option space: split K/V widths and tiers.

The engine path of ``bench_planner.py`` (b): an engine with a ``[placement]`` table (the
shipped SmolLM2-135M profile, weights 4-bit Q4_1; ``max_p_due`` 1e-5, KL budget 0.02, bits
{16, 8, 4, 2}, the default codes) puts 2048 tokens (8 chunks of 256, 240 ``kv`` blocks),
fresh tokens each put, ``--repeat`` times per case, the cases interleaved put by put so that
load changes hit them alike. Per put: the planning part (``EnginePlacement.timing``: from the
put's blocks to its pipelines) against the whole put. Cases: equal widths only
(``kv_bits = []``, the option space before split widths), the default pairs (neighbouring
widths both ways: 8 widths), all six pairs (10 widths), and ``place_tiers`` with
``layer_compute_us`` over the default tiers (DRAM, CXL, NVMe: 3 tiers x 8 widths x codes,
the streamed-stall search). ``predict`` is warmed first (``--workers`` processes).

    .venv/bin/python benchmarks/bench_plan_time.py --predict-cache /tmp/rkv-predict.json \
        --json benchmarks/results/plan_time.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT.parent))

from bench_planner import CHUNK_TOKENS, CHUNKS, DIM, ENGINE_PLACEMENT, HEADS, LAYERS, model  # noqa: E402

from rkv import Engine, EngineConfig  # noqa: E402

PAIRS = [[8, 4], [4, 8], [4, 2], [2, 4], [8, 2], [2, 8]]
CASES: dict[str, dict[str, Any]] = {
    "equal widths (kv_bits = [])": {**ENGINE_PLACEMENT, "kv_bits": []},
    "default pairs (8 widths)": dict(ENGINE_PLACEMENT),
    "all pairs (10 widths)": {**ENGINE_PLACEMENT, "kv_bits": PAIRS},
    "place_tiers, 3 tiers, streamed": {**ENGINE_PLACEMENT, "place_tiers": True,
                                       "layer_compute_us": 120.0,
                                       "capacity_cost": {"dram": 4000.0, "cxl": 400.0,
                                                         "nvme": 30.0}},
}


def quartiles(x: list[float]) -> list[float]:
    q = statistics.quantiles(x, n=4)
    return [q[0], statistics.median(x), q[2]]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--predict-cache", type=Path, default=None,
                    help="keep predict() answers in this JSON file between runs")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    from rkv.placement.options import DEFAULT_CACHE

    if args.predict_cache is not None and args.predict_cache.exists():
        DEFAULT_CACHE.add(json.loads(args.predict_cache.read_text()))
    spec = model()
    n = CHUNKS * CHUNK_TOKENS
    kv = np.random.default_rng(0).standard_normal((LAYERS, 2, n, HEADS, DIM)).astype(
        np.float16)
    out: dict[str, Any] = {"command": "benchmarks/bench_plan_time.py "
                           + " ".join(sys.argv[1:]), "load": os.getloadavg(),
                           "model": "SmolLM2-135M shape (profile measured with 4-bit Q4_1 "
                                    "weights)", "cases": {}}
    with tempfile.TemporaryDirectory() as d:
        engines = {}
        t0 = time.perf_counter()
        for i, (name, pl) in enumerate(CASES.items()):
            e = Engine.open(Path(d) / f"s{i}", EngineConfig(chunk_tokens=CHUNK_TOKENS,
                                                              placement=pl))
            ep = e.core.placement
            assert ep is not None
            names = list(e.core.tiers) if ep.cfg.place_tiers else ["dram"]
            ep.planner(spec).warm(ep.blocks(spec, [CHUNK_TOKENS] * CHUNKS, CHUNKS),
                                  [ep.tier_input(t) for t in names], workers=args.workers)
            engines[name] = e
        out["predict_warm_s"] = time.perf_counter() - t0
        if args.predict_cache is not None:
            args.predict_cache.write_text(json.dumps(DEFAULT_CACHE.entries()))
        res: dict[str, dict[str, list[float]]] = {k: {"put": [], "plan": []} for k in CASES}
        first: dict[str, Any] = {}
        try:
            for r in range(args.repeat + 1):
                tokens = [(r * n + i) % 49000 + 1 for i in range(n)]
                for name, e in engines.items():
                    ep = e.core.placement
                    assert ep is not None
                    t = time.perf_counter()
                    e.put(tokens, kv, model=spec)
                    took = 1e3 * (time.perf_counter() - t)
                    plan_ms = ep.timing["last_plan_us"] / 1e3
                    if r == 0:
                        first[name] = {"put_ms": took, "plan_ms": plan_ms}
                    else:
                        res[name]["put"].append(took)
                        res[name]["plan"].append(plan_ms)
            for name, e in engines.items():
                mix = e.stats()["tiers"]
                out["cases"][name] = {"stored": {t: {k: v["blocks"] for k, v in
                                                     m.get("mix", {}).items()}
                                                 for t, m in mix.items()}}
        finally:
            for e in engines.values():
                e.close()
    for name, r in res.items():
        share = [p / q for p, q in zip(r["plan"], r["put"], strict=True)]
        out["cases"][name].update({
            "put_ms": quartiles(r["put"]), "plan_ms": quartiles(r["plan"]),
            "plan_share": quartiles(share), "first": first[name]})
    out["load_after"] = os.getloadavg()
    print(json.dumps({k: {kk: v[kk] for kk in ("put_ms", "plan_ms", "plan_share")}
                      for k, v in out["cases"].items()}, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
