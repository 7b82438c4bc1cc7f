"""Check the quality profile's additive estimate against measured mixed plans.

SmolLM2-135M-Instruct (weights 4-bit Q4_1, fp32 compute). For each plan (bits per layer's K
and V), every layer's prefix KV is quantized per the plan at once with rkv's KIVI quantizer,
the model continues from that cache (its own forward, as ``rkv quality`` does), and the mean
KL of the next-token distributions against the exact cache is compared with
``QualityProfile.additive(plan)``, the sum of the single-block KLs.

Two sets of windows:

* ``calibration``: the profile's own windows (read from the calibration cache), paired: per
  window, the additive sum of that window's single-block KLs. ratio = sum of measured / sum
  of additive; 95 % CI by bootstrap over windows.
* ``held-out``: fresh windows half a step after the calibration windows; additive = the
  profile's means. ratio = mean measured / additive; the CI bootstraps the measured side.

    .venv/bin/python benchmarks/bench_calibrate.py --cache ~/.cache/rkv/calibrate-....jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rkv.eval.calibrate_measure import (  # noqa: E402
    block_bits,
    heldout_windows,
    hf_case,
    quantize_plan,
    reference,
    run_cases,
)
from rkv.profiles import KINDS, QualityProfile, load_profile  # noqa: E402

N_LAYERS = 30
Plan = dict[tuple[int, str], int]


def fraction(plan: Plan) -> float:
    """Stored bytes of the plan as a fraction of fp16 KV (metadata included)."""
    return sum(block_bits(b) for b in plan.values()) / (16.0 * len(plan))


def uniform(k: int, v: int) -> Plan:
    return {(i, kind): (k if kind == "k" else v) for i in range(N_LAYERS) for kind in KINDS}


def random_plan(seed: int, low: float = 0.38, high: float = 0.42) -> Plan:
    rng = np.random.default_rng(seed)
    while True:
        plan = {(i, kind): int(rng.choice([2, 4, 8], p=[0.55, 0.3, 0.15]))
                for i in range(N_LAYERS) for kind in KINDS}
        if low <= fraction(plan) <= high:
            return plan


def greedy_plan(profile: QualityProfile, budget: float = 0.40) -> Plan:
    """Start at 2 bits everywhere; upgrade the block with the best KL saved per byte added
    while the plan fits the budget (what a profile is for)."""
    plan = uniform(2, 2)
    nxt = {2: 4, 4: 8}
    while True:
        best = None
        for key, b in plan.items():
            if b not in nxt:
                continue
            gain = profile.kl(*key, b) - profile.kl(*key, nxt[b])
            cost = block_bits(nxt[b]) - block_bits(b)
            trial = {**plan, key: nxt[b]}
            if fraction(trial) <= budget and (best is None or gain / cost > best[0]):
                best = (gain / cost, key)
        if best is None:
            return plan
        plan[best[1]] = nxt[plan[best[1]]]


def plans(profile: QualityProfile) -> list[tuple[str, Plan]]:
    early = {(i, k): 8 if i < 4 else 2 for i in range(N_LAYERS) for k in KINDS}
    top = sorted(((profile.kl(i, k, 2), (i, k)) for i in range(N_LAYERS) for k in KINDS),
                 reverse=True)[:8]
    sens = {**uniform(2, 2), **{key: 8 for _, key in top}}
    return [("uniform 4-bit", uniform(4, 4)),
            ("uniform 2-bit", uniform(2, 2)),
            ("K 4-bit, V 2-bit", uniform(4, 2)),
            ("K 2-bit, V 4-bit", uniform(2, 4)),
            ("layers 0-3 at 8 bits, rest 2", early),
            ("8 most sensitive blocks at 8, rest 2", sens),
            ("random ~40 % (seed 1)", random_plan(1)),
            ("random ~40 % (seed 2)", random_plan(2)),
            ("random ~40 % (seed 3)", random_plan(3)),
            ("profile-greedy at 40 %", greedy_plan(profile))]


def bootstrap(meas: np.ndarray, add: np.ndarray | float, n: int = 4000, seed: int = 0
              ) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(meas), size=(n, len(meas)))
    num = meas[idx].sum(axis=1)
    den = add[idx].sum(axis=1) if isinstance(add, np.ndarray) else add * len(meas)
    r = num / den
    return float(np.percentile(r, 2.5)), float(np.percentile(r, 97.5))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profile", default="smollm2-135m")
    ap.add_argument("--cache", default=None, help="the calibration cache (JSON Lines): "
                    "paired comparison on the calibration windows")
    ap.add_argument("--heldout", type=int, default=8, help="fresh windows (0: none)")
    ap.add_argument("--paired", type=int, default=None, help="use only the first N "
                    "calibration windows of the cache")
    ap.add_argument("--spacing", type=int, default=24, help="the calibration set's window "
                    "count (held-out windows sit between its windows)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "calibrate.json"))
    args = ap.parse_args()
    from rkv.eval.quality import load_smollm2

    t0 = time.perf_counter()
    profile = load_profile(args.profile)
    model, tok = load_smollm2(args.threads)
    todo = plans(profile)
    sets: dict[str, list[tuple[list[int], dict[str, float] | None]]] = {}
    if args.cache:
        lines = Path(args.cache).read_text().splitlines()
        header = json.loads(lines[0])
        rows = {int(r["i"]): r for r in map(json.loads, lines[1:])}
        sets["calibration"] = [(ids, rows[i]["kl"]) for i, ids in enumerate(header["windows"])
                               if i in rows][:args.paired]
    if args.heldout:
        sets["held-out"] = [(ids, None) for ids in
                            heldout_windows(tok, args.spacing, args.heldout)]
    results: dict[str, Any] = {
        "model": profile.model, "weights": "Q4_1", "fingerprint": profile.fingerprint,
        "profile_windows": profile.windows, "command": "benchmarks/bench_calibrate.py "
        + " ".join(sys.argv[1:]), "plans": []}
    meas: dict[str, dict[str, list[float]]] = {s: {n: [] for n, _ in todo} for s in sets}
    nll: dict[str, dict[str, list[float]]] = {s: {n: [] for n, _ in todo} for s in sets}
    paired: dict[str, list[float]] = {n: [] for n, _ in todo}
    worst = 0.0
    for sname, wins in sets.items():
        for w, (ids, per) in enumerate(wins):
            ref = reference(model, ids)
            kvs = [quantize_plan(ref.kv, plan) for _, plan in todo]
            cases = [{(i, k): kv2[i, j] for i in range(N_LAYERS) for j, k in enumerate(KINDS)}
                     for kv2 in kvs]
            got = run_cases(model, ref, 0, cases)      # all plans in one batch, from layer 0
            # the model's own forward on one plan: the fast path must agree
            check = hf_case(model, ids, ref, kvs[1])
            worst = max(worst, abs(check[0] - got[1][0]) / check[0])
            for (name, plan), (kl, n) in zip(todo, got, strict=True):
                meas[sname][name].append(kl)
                nll[sname][name].append(n)
                if per is not None:
                    paired[name].append(sum(per[f"{i}:{k}:{b}"] for (i, k), b in plan.items()
                                            if b != 16))
            print(f"{sname} window {w + 1}/{len(wins)} ({time.perf_counter() - t0:.0f} s)",
                  file=sys.stderr)
    scored = len(next(iter(sets.values()))[0][0]) - 512
    for name, plan in todo:
        row: dict[str, Any] = {"plan": name, "fraction_fp16": round(fraction(plan), 4),
                               "additive": profile.additive(plan),
                               "bits": {f"{i}:{k}": b for (i, k), b in sorted(plan.items())}}
        for sname in sets:
            m = np.array(meas[sname][name])
            add: np.ndarray | float = (np.array(paired[name]) if sname == "calibration"
                                       else profile.additive(plan))
            ratio = float(m.sum() / (add.sum() if isinstance(add, np.ndarray)
                                     else add * len(m)))
            lo, hi = bootstrap(m, add)
            row[sname] = {"windows": len(m), "measured": float(m.mean()),
                          "measured_se": float(m.std(ddof=1) / np.sqrt(len(m))),
                          "ratio": ratio, "ratio_ci95": [lo, hi],
                          "ppl": float(np.exp(np.sum(nll[sname][name]) / (len(m) * scored)))}
        results["plans"].append(row)
    results["fast_vs_model_max_rel_diff"] = worst
    results["seconds"] = round(time.perf_counter() - t0, 1)
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    print(f"{'plan':<38} {'bytes':>6} {'additive':>9} " + " ".join(
        f"{s + ' measured':>20} {'ratio [95% CI]':>22}" for s in sets))
    for row in results["plans"]:
        cells = " ".join(f"{row[s]['measured']:>20.4g} {row[s]['ratio']:>6.2f} "
                         f"[{row[s]['ratio_ci95'][0]:.2f}, {row[s]['ratio_ci95'][1]:.2f}]"
                         for s in sets)
        print(f"{row['plan']:<38} {row['fraction_fp16']:>6.1%} {row['additive']:>9.4g} "
              f"{cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
