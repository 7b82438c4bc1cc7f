"""Per-expert tier, bits and code for SmolLM2-135M-MoE (E = 8, k = 6; the model's weights are
4-bit Q4_1): the placement planner against uniform bit-widths placed by use, and re-placement
learned from the loads an adapter sees.

Part 1 (plans). Expert use = activation rate per token on calibration text; tiers = rkv's
default dram/cxl/nvme (bandwidth, latency, fault models, codes) with dram and cxl each holding
25 % of the fp16 experts' bytes. For each plan: the predicted KL (expert profile), the
**measured** KL against the float16 MoE on held-out windows (4 of pydoc_data.topics after the
calibration text, 4 of rkv's docs; 95 % Student t CI over windows, and the measured/predicted
ratio), the expected read time per token if every activation loads its expert from its tier
(held-out activation rates), bytes per tier and the mix. Uniform plans are placed the way
``RkvExperts.create(usage=...)`` places them (most used first, tiers' own codes).

Part 2 (re-placement). A real store (``RkvExperts``, default tiers, dram and cxl 25 % each)
created without usage (layer order), a device cache of 25 % (LRU). The first half of a
routing trace is replayed through it (``experts(layer, ids)`` per token and layer), then
``replan`` moves records by the loads it observed; the second half is replayed through the
re-placed store and through an untouched copy. Reported: tier reads and bytes per token and
the modeled load time per token (latency + bytes / bandwidth, per tier) on the second half.

    .venv/bin/python benchmarks/bench_moe_plan.py --json benchmarks/results/moe_plan.json
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rkv.adapters.moe import RkvExperts  # noqa: E402
from rkv.cli.moe_run import cast_experts  # noqa: E402
from rkv.moe.expert_plans import ExpertInput, plan_experts  # noqa: E402
from rkv.moe.experts import ResidentExperts  # noqa: E402
from rkv.moe.fit import default_cache_dir  # noqa: E402
from rkv.moe.model import calibration_text, heldout_text, load_moe_smollm2  # noqa: E402
from rkv.moe.profile import ExpertProfile, cached_profile, quantized  # noqa: E402
from rkv.moe.store import pack, pipeline_for, place  # noqa: E402
from rkv.placement.config import TierInput  # noqa: E402
from rkv.store.config import default_tiers  # noqa: E402

T95 = {3: 3.182, 7: 2.365, 15: 2.131}


def ci(values: list[float]) -> dict[str, float]:
    a = np.asarray(values, np.float64)
    m = float(a.mean())
    h = T95.get(len(a) - 1, 1.96) * float(a.std(ddof=1)) / math.sqrt(len(a))
    return {"mean": m, "lo": m - h, "hi": m + h}


def activation(moe: Any, windows: list[list[int]]) -> tuple[np.ndarray, list[np.ndarray]]:
    """(activations per token [L, E], per-window routes [T, L, k])."""
    counts = np.zeros((len(moe.experts), moe.n_experts))
    routes, tokens = [], 0
    for w in windows:
        r = moe.route(w).experts
        routes.append(r)
        tokens += r.shape[0]
        for li in range(r.shape[1]):
            counts[li] += np.bincount(r[:, li].ravel(), minlength=moe.n_experts)
    return counts / tokens, routes


def log_probs(moe: Any, experts: Any, windows: list[list[int]]) -> list[Any]:
    import torch

    moe.set_provider(ResidentExperts(experts))
    out = []
    with torch.no_grad():
        for w in windows:
            out.append(torch.log_softmax(moe(torch.tensor([w]), use_cache=False)
                                         .logits[0].double(), -1))
    return out


def kl(ref: Any, lp: Any) -> float:
    return float((ref.exp() * (ref - lp)).sum(-1).mean())


def tier_inputs(total: int) -> list[TierInput]:
    out = []
    for t in default_tiers():
        cap = total // 4 if t.name in ("dram", "cxl") else int(t.capacity_bytes)
        out.append(TierInput(t.name, t.fault_model, cap, t.read_gbps, t.latency_us))
    return out


def uniform_plan(layers: Any, tiers: list[TierInput], use: np.ndarray, bits: int
                 ) -> dict[tuple[int, int], tuple[str, int, str]]:
    """Where RkvExperts.create(usage=...) puts every expert at ``bits`` (tiers' own codes)."""
    cfgs = [replace(t, capacity_bytes=ti.free_bytes) for t, ti in zip(default_tiers(), tiers,
                                                                      strict=True)]
    meta, sizes = {}, {}
    for li, layer in enumerate(layers):
        for ei, w in enumerate(layer):
            shape = tuple(pack(w).shape)
            meta[(li, ei)] = {}
            for t in cfgs:
                sizes[(t.name, (li, ei))] = pipeline_for(bits, t.ecc).for_block(
                    shape, "float16").record_bytes(shape, "float16")
    usage = {(li, ei): float(use[li, ei]) for li, ei in meta}
    where = place(meta, cfgs, usage, None, sizes, {})
    ecc = {t.name: t.ecc for t in cfgs}
    return {k: (v[0], bits, ecc[v[0]]) for k, v in where.items()}


def describe(assign: dict[tuple[int, int], tuple[str, int, str]], layers: Any,
             tiers: list[TierInput], use: np.ndarray, prof: ExpertProfile) -> dict[str, Any]:
    t_of = {t.name: t for t in tiers}
    read_us, pred, by_tier, mix = 0.0, 0.0, {t.name: 0 for t in tiers}, {}
    for (li, ei), (tier, bits, code) in assign.items():
        shape = tuple(pack(layers[li][ei]).shape)
        rec = pipeline_for(bits, code).for_block(shape, "float16").record_bytes(shape, "float16")
        t = t_of[tier]
        read_us += use[li, ei] * (t.latency_us + rec / (t.read_gbps * 1e3))
        pred += prof.kl(li, ei, bits)
        by_tier[tier] += rec
        k = f"{tier} {bits} {code}"
        mix[k] = mix.get(k, 0) + 1
    return {"read_us_per_token": read_us, "predicted_kl": pred,
            "tier_mib": {k: v / 2**20 for k, v in by_tier.items()},
            "mix": dict(sorted(mix.items(), key=lambda kv: -kv[1]))}


def part1(moe: Any, prof: ExpertProfile, cal: list[list[int]], held: list[list[int]],
          hours: float) -> list[dict[str, Any]]:
    layers = cast_experts(moe.experts, "float16")
    use_train, _ = activation(moe, cal)
    use_test, _ = activation(moe, held)
    total = sum(pack(w).nbytes for layer in layers for w in layer)
    tiers = tier_inputs(total)
    exact = [[quantized(w, 16) for w in layer] for layer in moe.experts]
    ref = log_probs(moe, exact, held)
    plans: list[tuple[str, dict[tuple[int, int], tuple[str, int, str]]]] = [
        (f"uniform {b}-bit, by use", uniform_plan(layers, tiers, use_train, b))
        for b in (16, 8, 4)]
    inputs = [ExpertInput(li, ei, int(w.gate.shape[0]), int(w.gate.shape[1]), "float16",
                          float(use_train[li, ei]))
              for li, layer in enumerate(layers) for ei, w in enumerate(layer)]
    k8 = float(prof.all_kl[prof.bits.index(8)])
    for name, budget in (("planned, KL budget 0", 0.0), ("planned, KL budget = 8-bit / 2",
                                                         k8 / 2),
                         ("planned, KL budget = uniform 8-bit", k8)):
        t0 = time.perf_counter()
        p = plan_experts(inputs, tiers, {"residency_hours": hours}, prof, kl_budget=budget)
        print(f"{name}: planned in {time.perf_counter() - t0:.2f} s", file=sys.stderr)
        plans.append((name, p.assignments()))
    rows = []
    for name, assign in plans:
        row = {"plan": name, **describe(assign, layers, tiers, use_test, prof)}
        experts = [[quantized(w, assign[(li, ei)][1]) for ei, w in enumerate(layer)]
                   for li, layer in enumerate(moe.experts)]
        kls = [kl(r, lp) for r, lp in zip(ref, log_probs(moe, experts, held), strict=True)]
        row["measured_kl"] = ci(kls)
        row["measured_over_predicted"] = (row["measured_kl"]["mean"] / row["predicted_kl"]
                                          if row["predicted_kl"] > 0 else None)
        rows.append(row)
        print(f"{name}: read {row['read_us_per_token']:.0f} us/token, KL predicted "
              f"{row['predicted_kl']:.3f} measured {row['measured_kl']['mean']:.3f} "
              f"[{row['measured_kl']['lo']:.3f}, {row['measured_kl']['hi']:.3f}]",
              file=sys.stderr)
    return rows


def replay(rx: RkvExperts, routes: list[list[tuple[int, ...]]]) -> dict[str, float]:
    before = {t: dict(v) for t, v in rx.stats()["tiers"].items()}
    for tok in routes:
        for li, ids in enumerate(tok):
            rx.experts(li, list(ids))
    after = rx.stats()["tiers"]
    t_of = {t.name: t for t in rx.tier_configs}
    n = len(routes)
    out: dict[str, float] = {"tokens": n, "load_us_per_token": 0.0}
    for t, v in after.items():
        reads = v["reads"] - before[t]["reads"]
        nbytes = v["bytes_read"] - before[t]["bytes_read"]
        out[f"{t}_reads_per_token"] = reads / n
        out[f"{t}_mib_per_token"] = nbytes / n / 2**20
        out["load_us_per_token"] += (reads * t_of[t].latency_us
                                     + nbytes / (t_of[t].read_gbps * 1e3)) / n
    return out


def part2(trace_path: Path, hours: float, tokens: int, budget: float, test_tokens: int
          ) -> dict[str, Any]:
    """Learned re-placement on a real routing trace (E = 16, k = 4), with random float16
    experts of the trace model's shape (only the record sizes matter to the loads)."""
    from rkv.moe.experts import ExpertWeights
    from rkv.moe.replay_trace import read_trace

    tr = read_trace(trace_path, limit=tokens + test_tokens)
    n = 1536 // tr.experts
    rng = np.random.default_rng(0)
    layers = [[ExpertWeights(*(rng.standard_normal(s).astype(np.float16)
                               for s in ((n, 576), (n, 576), (576, n))))
               for _ in range(tr.experts)] for _ in range(tr.layers)]
    total = sum(pack(w).nbytes for layer in layers for w in layer)
    cfgs = tuple(replace(t, capacity_bytes=total // 4) if t.name in ("dram", "cxl") else t
                 for t in default_tiers())
    train, test = tr.routes[:tokens], tr.routes[tokens:tokens + test_tokens]
    tmp = Path(tempfile.mkdtemp(prefix="rkv-moe-plan-"))
    opts: dict[str, Any] = {"device_budget_bytes": int(total * budget), "eviction": "lru",
                            "per_layer": True, "prefetch": None}
    try:
        rx = RkvExperts.create(tmp / "a", layers, fingerprint="bench", tiers=cfgs, **opts)
        base = RkvExperts.create(tmp / "b", layers, fingerprint="bench", tiers=cfgs, **opts)
        first = replay(rx, train)
        replay(base, train)
        report = rx.replan({"residency_hours": hours, "bits": [16]})
        print(f"replan: {report.to_dict()}", file=sys.stderr)
        out = {"trace": str(trace_path.name), "experts": tr.experts, "top_k": tr.top_k,
               "device_budget": budget, "train": first, "replan": report.to_dict(),
               "test_replanned": replay(rx, test), "test_untouched": replay(base, test)}
        rx.close()
        base.close()
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default=str(ROOT / "rkv/profiles/moe/smollm2-135m-e8k6.json"),
                    help="an expert profile JSON (another model's: measured on 6 windows, "
                         "cached)")
    ap.add_argument("--windows", type=int, default=4, help="held-out windows per source")
    ap.add_argument("--hours", type=float, default=24.0, help="residency for reliability")
    ap.add_argument("--replay-tokens", type=int, default=768, help="tokens learned from")
    ap.add_argument("--test-tokens", type=int, default=256, help="tokens measured after")
    ap.add_argument("--trace", default=str(ROOT / "benchmarks/results/"
                                           "moe_trace_e16k4_topics.jsonl"))
    ap.add_argument("--budget", type=float, default=0.25, help="device cache share (part 2)")
    ap.add_argument("--part", choices=["1", "2", "both"], default="both")
    ap.add_argument("--reliability-cache", default=str(ROOT / "benchmarks/results/"
                                                           "moe_plan_reliability.json"))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    moe, tok = load_moe_smollm2(8, 6, threads=args.threads, log=log)
    cal = [w[:256] for w in calibration_text(tok)[:6]]
    prof = ExpertProfile.load(args.profile) if args.profile else None
    if prof is None or prof.model != moe.fingerprint:
        if prof is not None:
            log(f"{args.profile} is another model's profile: measuring")
        prof = cached_profile(moe, cal, default_cache_dir(), log=log)
    held = [w[:256] for src in ("topics", "docs") for w in heldout_text(tok, args.windows,
                                                                           source=src)]
    from rkv.placement.options import DEFAULT_CACHE

    saved = Path(args.reliability_cache)
    if saved.exists():       # predict's answers of an earlier run (minutes to recompute)
        DEFAULT_CACHE.add(json.loads(saved.read_text()))
    t0 = time.perf_counter()
    rows = part1(moe, prof, cal, held, args.hours) if args.part != "2" else []
    if rows:
        saved.write_text(json.dumps(DEFAULT_CACHE.entries()))
    learned = (part2(Path(args.trace), args.hours, args.replay_tokens, args.budget,
                     args.test_tokens)
               if args.part != "1" else {})
    res = {"model": "SmolLM2-135M-Instruct (weights 4-bit Q4_1) MoEfied, E=8, k=6",
           "windows": len(held), "window_tokens": 256, "hours": args.hours,
           "profile": {"windows": prof.windows, "all_kl": prof.all_kl.tolist(),
                       "additive_sum": prof.layer_kl.sum(0).tolist()},
           "plans": rows, "replan": learned, "seconds": time.perf_counter() - t0}
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    print(json.dumps(learned, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
