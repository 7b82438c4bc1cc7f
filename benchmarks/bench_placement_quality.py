"""End-to-end placement on SmolLM2-135M: planned versus uniform, through the engine.

SmolLM2-135M-Instruct (**weights 4-bit Q4_1**, dequantized by transformers' GGUF loader; fp32
compute), KV of a 512-token prefix cast to fp16 and put into a real rkv ``Engine`` with a
``[placement]`` table, read back, and the model continues from it over the next 64 tokens.

(a) Byte budget 40 % of the fp16 records: the planner's mixed allocation (bits per layer and
    chunk; K and V share a record) at the smallest KL budget whose plan fits, against the
    uniform widths (2 bits fits; 4 bits is 44 % and does not). KL of the next-token
    distribution against the fp16 cache, perplexity, top-1 agreement, on held-out windows of
    ``pydoc_data.topics`` and of rkv's own docs; paired differences per window.
(b) Parity at P(DUE) <= 1e-9 per block-day on ``nvme-tlc`` (3000 P/E cycles): the codes the
    engine planned against the weakest uniform code meeting the target for every block.
(c) A campaign on a store written as planned (mixed bits and codes) under an accelerated
    ``nvme-tlc`` (latent-sector and silent-corruption rates x ``--accel``): observed DUE,
    SDC and corrected counts against the planner's per-block predictions summed.

    .venv/bin/python benchmarks/bench_placement_quality.py --quick
    .venv/bin/python benchmarks/bench_placement_quality.py \
        --json benchmarks/results/placement_quality.json
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rkv import Engine, EngineConfig, ModelSpec, TierConfig  # noqa: E402
from rkv.codec.stages import header_stages  # noqa: E402
from rkv.format.keys import as_token_array, block_key, chunk_keys  # noqa: E402
from rkv.format.record import decode_record  # noqa: E402
from rkv.placement import Planner  # noqa: E402
from rkv.placement.budget import min_kl_exact, plan_bytes, smallest_kl_budget  # noqa: E402
from rkv.placement.options import record_bytes  # noqa: E402
from rkv.store.plans import EnginePlacement  # noqa: E402

PREFIX, LENGTH, CHUNK = 512, 576, 256
PROFILE = "smollm2-135m"
PROFILE_COMMIT = "c73c88b"      # the commit that shipped the profile (its docs windows)
BITS = (16, 8, 4, 2)


def spec() -> ModelSpec:
    from rkv.eval.quality import SMOLLM2_ID

    return ModelSpec(SMOLLM2_ID, n_layers=30, n_kv_heads=3, head_dim=64, dtype="float16")


# -- windows held out from the profile ------------------------------------------------------
def _ngrams(ids: list[int], n: int = 16) -> set[tuple[int, ...]]:
    return {tuple(ids[i:i + n]) for i in range(0, len(ids) - n + 1)}


def _topics_text() -> str:
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics))


def calibration_ngrams(tok: Any) -> tuple[set[tuple[int, ...]], str]:
    """16-grams of every window of the profile's 24-window set (12 per source): topics as
    ``rkv calibrate`` cut them, docs as they were at the profile's commit."""
    cut: list[list[int]] = []
    ids = tok(_topics_text()[: 40 * LENGTH * 13]).input_ids
    step = len(ids) // 12
    cut += [ids[i * step:i * step + LENGTH] for i in range(12)]
    try:
        names = subprocess.run(["git", "ls-tree", "--name-only", PROFILE_COMMIT, "docs/"],
                               cwd=ROOT, capture_output=True, text=True, check=True).stdout
        files = sorted(n for n in names.split() if n.endswith(".md")
                       and not n.endswith("calibration.md"))
        text = "\n\n".join(subprocess.run(["git", "show", f"{PROFILE_COMMIT}:{f}"], cwd=ROOT,
                                          capture_output=True, text=True, check=True).stdout
                           for f in files)
        how = f"docs at {PROFILE_COMMIT} ({len(files)} files)"
    except (OSError, subprocess.CalledProcessError):
        from rkv.eval.calibrate_measure import docs_files

        text = "\n\n".join(p.read_text(encoding="utf-8") for p in docs_files())
        how = "current docs (git history unavailable)"
    ids = tok(text).input_ids
    step = len(ids) // 12
    cut += [ids[i * step:i * step + LENGTH] for i in range(12)]
    grams: set[tuple[int, ...]] = set()
    for w in cut:
        grams |= _ngrams(w)
    return grams, how


def heldout(tok: Any, per_source: int) -> tuple[list[tuple[str, list[int]]], dict[str, Any]]:
    """``per_source`` windows of topics and of rkv's docs (without calibration.md and this
    benchmark's own results page), none sharing a 16-token run with any calibration window,
    evenly spaced over what is left; alternating sources."""
    from rkv.eval.calibrate_measure import docs_files

    grams, how = calibration_ngrams(tok)
    docs = [p for p in docs_files() if p.name != "placement-results.md"]
    texts = {"topics": _topics_text(),
             "docs": "\n\n".join(p.read_text(encoding="utf-8") for p in docs)}
    per: dict[str, list[list[int]]] = {}
    info: dict[str, Any] = {"calibration_windows_from": how,
                            "docs_files": [p.name for p in docs]}
    for src, text in texts.items():
        ids = tok(text).input_ids
        cands = [ids[s:s + LENGTH] for s in range(0, len(ids) - LENGTH + 1, LENGTH)]
        free = [w for w in cands if not (_ngrams(w) & grams)]
        pick = np.linspace(0, len(free) - 1, per_source).round().astype(int)
        per[src] = [free[i] for i in sorted(set(pick.tolist()))]
        info[src] = {"tokens": len(ids), "candidates": len(cands), "held_out": len(free),
                     "used": len(per[src])}
    out = [(s, w) for i in range(per_source) for s in per if i < len(per[s])
           for w in [per[s][i]]]
    return out, info


# -- the model ------------------------------------------------------------------------------
def prefill(model: Any, ids: list[int]) -> tuple[Any, np.ndarray]:
    import torch

    from rkv.adapters.hf import kv_from_cache

    with torch.no_grad():
        pre = model(torch.tensor([ids[:PREFIX]]), use_cache=True)
    return pre.logits[0, -1:], kv_from_cache(pre.past_key_values)


def continue_from(model: Any, ids: list[int], first: Any, kv: np.ndarray) -> Any:
    """Log-probs (float64) of the 64 scored positions, continuing from the cache ``kv``."""
    import torch

    from rkv.adapters.hf import cache_from_kv

    with torch.no_grad():
        out = model(torch.tensor([ids[PREFIX:-1]]),
                    cache=cache_from_kv(kv.astype(np.float32), model.config), use_cache=True)
        logits = torch.cat([first, out.logits[0]], dim=0)
    return torch.log_softmax(logits.double(), dim=-1)


def metrics(ref: Any, lp: Any, targets: Any) -> dict[str, float]:
    kl = (ref.exp() * (ref - lp)).sum(dim=-1)
    return {"kl": float(kl.mean()), "nll": -float(lp.gather(1, targets[:, None]).sum()),
            "top1": float((ref.argmax(-1) == lp.argmax(-1)).double().mean())}


# -- engines --------------------------------------------------------------------------------
def engine_config(tier: TierConfig, placement: dict[str, Any] | None = None) -> EngineConfig:
    return EngineConfig(chunk_tokens=CHUNK, tiers=(tier,), placement=placement or {},
                        repair=False)


def stored(e: Engine, sp: ModelSpec, tokens: list[int]) -> list[dict[str, Any]]:
    """Per block of the stored prefix: chunk, layer, bits, code and record bytes."""
    keys = chunk_keys(as_token_array(tokens), sp.fingerprint(), CHUNK)
    out = []
    for c, k in enumerate(keys):
        for layer in range(sp.n_layers):
            name = next(iter(e.tiers))
            rec = e.tiers[name].get(block_key(k, layer))
            assert rec is not None
            quant, codec = header_stages(decode_record(rec).header)
            out.append({"chunk": c, "layer": layer, "bits": 16 if quant is None else quant.bits,
                        "code": "none" if codec is None else codec.spec, "bytes": len(rec)})
    return out


def bootstrap_ci(x: np.ndarray, n: int = 4000, seed: int = 0) -> list[float]:
    rng = np.random.default_rng(seed)
    m = x[rng.integers(0, len(x), size=(n, len(x)))].mean(axis=1)
    return [float(np.percentile(m, 2.5)), float(np.percentile(m, 97.5))]


def t_ci(x: np.ndarray) -> list[float]:
    """Mean +- t(0.975, n-1) x standard error."""
    n = len(x)
    if n < 2:
        return [math.nan, math.nan]
    t = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26,
         10: 2.23, 15: 2.13, 20: 2.09, 30: 2.04, 40: 2.02, 60: 2.00}
    q = t[max(k for k in t if k <= n - 1)]
    se = float(x.std(ddof=1)) / math.sqrt(n)
    return [float(x.mean()) - q * se, float(x.mean()) + q * se]


# -- (a) ------------------------------------------------------------------------------------
def part_a(model: Any, tok: Any, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    sp = spec()
    dram = TierConfig("dram", medium="memory", path=str(root / "dram"), capacity_bytes=1 << 34,
                      fault_model="dram-ddr5")
    base = {"max_p_due": 1.0, "max_p_sdc": 1.0, "bits": list(BITS), "codes": ["none"],
            "recompute_us_per_chunk": 0.0, "capacity_cost": {"dram": 1e9},
            "profile": PROFILE, "quality_budget_kl": 1.0}
    ep = EnginePlacement.for_engine(engine_config(dram, base))
    assert ep is not None
    planner = ep.planner(sp)
    blocks = ep.blocks(sp, [CHUNK, CHUNK], 2)
    tier = ep.tier_input("dram")
    prof = planner.profile
    assert prof is not None

    def plan_at(kl: float) -> Any:
        return Planner(replace(planner.config, quality_budget_kl=kl), prof,
                       planner.cache).plan(blocks, [tier])

    size = {b: sum(record_bytes(x, b, "none") for x in blocks) for b in BITS}
    fp16 = size[16]
    kl_opt = np.array([[prof.kl(x.layer, "kv", b) for b in BITS] for x in blocks])
    by_opt = np.array([[record_bytes(x, b, "none") for b in BITS] for x in blocks])
    budgets = {"40 %": 0.40 * fp16, "uniform 4-bit bytes": float(size[4])}
    plans: dict[str, Any] = {}
    for name, bb in budgets.items():
        s = smallest_kl_budget(plan_at, bb, float(kl_opt[:, -1].sum()) * 1.001, steps=30)
        assert s.plan is not None
        exact, _ = min_kl_exact(kl_opt, by_opt, bb)
        bits = [b.bits for b in s.plan.blocks]
        plans[name] = {"byte_budget": bb, "fraction_fp16": plan_bytes(s.plan) / fp16,
                       "kl_budget": s.kl_budget, "planned_kl_profile": s.plan.kl,
                       "exact_min_kl_profile": exact, "bisection_steps": len(s.steps),
                       "bits_count": {str(b): bits.count(b) for b in BITS},
                       "bits": {f"{b.chunk}:{b.layer}": b.bits for b in s.plan.blocks}}
    cases: dict[str, EngineConfig] = {
        "fp16 (16 bits)": engine_config(dram, {**base, "bits": [16]}),
        "planned 40 %": engine_config(dram, {**base, "quality_budget_kl":
                                             plans["40 %"]["kl_budget"]}),
        "uniform 2-bit": engine_config(replace(dram, quant="kivi(bits=2)")),
        "uniform 4-bit": engine_config(replace(dram, quant="kivi(bits=4)")),
        "planned at uniform 4-bit bytes": engine_config(dram, {
            **base, "quality_budget_kl": plans["uniform 4-bit bytes"]["kl_budget"]}),
    }
    engines = {n: Engine.open(root / f"a{i}", c) for i, (n, c) in enumerate(cases.items())}
    wins, info = heldout(tok, args.windows)
    res: dict[str, dict[str, list[float]]] = {n: {"kl": [], "nll": [], "top1": []}
                                              for n in cases}
    store: dict[str, Any] = {}
    t0 = time.perf_counter()
    try:
        for w, (src, ids) in enumerate(wins):
            first, kv = prefill(model, ids)
            kv16 = kv.astype(np.float16)
            ref = continue_from(model, ids, first, kv16)
            import torch

            targets = torch.tensor(ids[PREFIX:])
            for name, e in engines.items():
                e.put(ids[:PREFIX], kv16, model=sp)
                got = e.get(ids[:PREFIX], model=sp)
                assert got.ok and got.n_tokens == PREFIX, name
                if w == 0:
                    recs = stored(e, sp, ids[:PREFIX])
                    store[name] = {"bytes": sum(r["bytes"] for r in recs),
                                   "fraction_fp16": sum(r["bytes"] for r in recs) / fp16,
                                   "bits_count": {str(b): sum(r["bits"] == b for r in recs)
                                                  for b in BITS}}
                    if name.startswith("planned"):
                        key = "40 %" if "40" in name else "uniform 4-bit bytes"
                        want = plans[key]["bits"]
                        store[name]["bits_as_planned"] = all(
                            want[f"{r['chunk']}:{r['layer']}"] == r["bits"] for r in recs)
                m = metrics(ref, continue_from(model, ids, first, np.asarray(got.kv)),
                            targets)
                for k, v in m.items():
                    res[name][k].append(v)
                e.clear()
            print(f"(a) window {w + 1}/{len(wins)} {src} ({time.perf_counter() - t0:.0f} s)",
                  file=sys.stderr)
    finally:
        for e in engines.values():
            e.close()
    srcs = np.array([s for s, _ in wins])
    rows = {}
    for name in cases:
        kl = np.array(res[name]["kl"])
        row = {"kl_mean": float(kl.mean()), "kl_ci95": bootstrap_ci(kl),
               "kl_ci95_t": t_ci(kl),
               "ppl": float(np.exp(np.sum(res[name]["nll"]) / (len(kl) * (LENGTH - PREFIX)))),
               "top1": float(np.mean(res[name]["top1"])), **store[name]}
        for s in ("topics", "docs"):
            row[f"kl_mean_{s}"] = float(kl[srcs == s].mean())
        rows[name] = row
    diffs = {}
    for a_name, b_name in (("planned 40 %", "uniform 2-bit"), ("planned 40 %", "uniform 4-bit"),
                           ("planned at uniform 4-bit bytes", "uniform 4-bit")):
        d = np.array(res[a_name]["kl"]) - np.array(res[b_name]["kl"])
        ci = bootstrap_ci(d)
        diffs[f"{a_name} - {b_name}"] = {
            "mean": float(d.mean()), "ci95": ci, "ci95_t": t_ci(d),
            "windows_lower": int((d < 0).sum()), "windows": len(d),
            "noise": bool(ci[0] <= 0 <= ci[1]),
            **{f"mean_{s}": float(d[srcs == s].mean()) for s in ("topics", "docs")}}
    return {"fp16_bytes": fp16, "uniform_bytes": {str(b): size[b] for b in BITS},
            "uniform_fraction": {str(b): size[b] / fp16 for b in BITS}, "plans": plans,
            "windows": info, "cases": rows, "paired_differences": diffs,
            "per_window": res, "sources": srcs.tolist()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 windows per source, 200 trials")
    ap.add_argument("--windows", type=int, default=6, help="held-out windows per source")
    ap.add_argument("--trials", type=int, default=3000, help="campaign trials")
    ap.add_argument("--accel", type=float, default=3e7, help="fault-rate multiplier (c)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2, help="predict() processes")
    ap.add_argument("--parts", default="abc")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    if args.quick:
        args.windows, args.trials = 2, 200
    from bench_placement_reliability import part_b, part_c

    from rkv.eval.quality import load_smollm2

    t0 = time.perf_counter()
    out: dict[str, Any] = {"model": "SmolLM2-135M-Instruct", "weights": "Q4_1 (4-bit)",
                           "command": "benchmarks/bench_placement_quality.py "
                           + " ".join(sys.argv[1:]), "profile": PROFILE}
    with tempfile.TemporaryDirectory(prefix="rkv-pq-") as tmp:
        root = Path(tmp)
        model, tok = load_smollm2(args.threads)
        kl_budget = kl44 = None
        if "a" in args.parts:
            out["a"] = part_a(model, tok, args, root)
            kl_budget = out["a"]["plans"]["40 %"]["kl_budget"]
            kl44 = out["a"]["plans"]["uniform 4-bit bytes"]["kl_budget"]
            print(json.dumps({k: out["a"][k] for k in ("cases", "paired_differences")},
                             indent=1), file=sys.stderr)
        wins, _ = heldout(tok, 1)
        ids = wins[0][1]
        _, kv = prefill(model, ids)
        sample = (ids[:PREFIX], kv.astype(np.float16))
        if "b" in args.parts:
            out["b"] = part_b(sample, kl_budget, args, root, kl44)
            print(json.dumps(out["b"]["summary"], indent=1), file=sys.stderr)
        if "c" in args.parts:
            out["c"] = part_c(sample, kl_budget, args, root)
            print(json.dumps(out["c"]["summary"], indent=1), file=sys.stderr)
    out["seconds"] = round(time.perf_counter() - t0, 1)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
