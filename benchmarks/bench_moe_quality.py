"""Quality of SmolLM2-135M as a mixture of experts (rkv.moe.model), against the dense model.

For E = 8 and 16 experts per layer and several top-k, on held-out windows (the part of
Python's ``pydoc_data.topics`` after the calibration text, and rkv's own docs, which the
model cannot have seen): perplexity, mean KL(dense || MoE) of the next-token distributions,
same-top-token rate, the hit rate of speculative routing (layer l+1's router on layer l's
MLP input: the share of a token's actual layer l+1 experts it predicts) and how evenly the
experts are used (normalized entropy of the per-layer usage counts). 95 % CIs: Student t
over windows. Also the fit's time (30 layers, 16 x 256 calibration tokens, 2 threads).

    .venv/bin/python benchmarks/bench_moe_quality.py            # ~20 min on 2 cores
    .venv/bin/python benchmarks/bench_moe_quality.py --quick    # ~2 min (fit cached)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rkv.eval.quality import SMOLLM2_ID, load_smollm2  # noqa: E402
from rkv.moe.model import MoEModel, heldout_text  # noqa: E402

T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
       9: 2.262, 10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131,
       19: 2.093, 23: 2.069, 31: 2.042}


def ci(values: list[float]) -> tuple[float, float, float]:
    """(mean, low, high): 95 % Student t interval over the values."""
    a = np.asarray(values, dtype=np.float64)
    m = float(a.mean())
    if len(a) < 2:
        return m, math.nan, math.nan
    df = len(a) - 1
    t = T95.get(df) or next((v for k, v in sorted(T95.items()) if k >= df), 1.96)
    h = t * float(a.std(ddof=1)) / math.sqrt(len(a))
    return m, m - h, m + h


def window_metrics(lp_ref: Any, lp: Any, ids: list[int]) -> tuple[float, float, float]:
    """(mean KL(ref || test), mean NLL of the next token, same-top-token rate)."""
    import torch

    kl = float((lp_ref.exp() * (lp_ref - lp)).sum(-1).mean())
    tgt = torch.tensor(ids[1:])[:, None]
    nll = float(-lp[:-1].gather(1, tgt).mean())
    top1 = float((lp.argmax(-1) == lp_ref.argmax(-1)).float().mean())
    return kl, nll, top1


def run_window(moe: MoEModel, ids: list[int]) -> tuple[Any, float, float]:
    """(log-probs, speculative hit rate, usage entropy) of one window through the MoE."""
    import torch

    inputs: dict[int, Any] = {}
    handles = [la.mlp.register_forward_pre_hook(
        lambda _m, a, i=i: inputs.__setitem__(i, a[0].reshape(-1, a[0].shape[-1])))
        for i, la in enumerate(moe.model.model.layers)]
    chosen: dict[int, Any] = {}
    moe._shared.recorder = lambda layer, _h, idx, _s: chosen.__setitem__(layer, idx)
    try:
        with torch.no_grad():
            lp = torch.log_softmax(moe(torch.tensor([ids]), use_cache=False).logits[0].float(),
                                   -1)
    finally:
        moe._shared.recorder = None
        for h in handles:
            h.remove()
    k, e, n_layers = moe.top_k, moe.n_experts, len(moe.experts)
    hits, ent = [], []
    for layer in range(n_layers):
        counts = np.bincount(chosen[layer].numpy().ravel(), minlength=e)
        p = counts / counts.sum()
        ent.append(float(-(p[p > 0] * np.log(p[p > 0])).sum() / math.log(e)) if e > 1 else 1.0)
        if layer + 1 < n_layers and k < e:
            w, b = moe._shared.routers[layer + 1]
            pred = (inputs[layer] @ w.T + b).topk(k, dim=-1).indices
            actual = chosen[layer + 1]
            same = (pred[:, :, None] == actual[:, None, :]).any(-1).float().sum(-1) / k
            hits.append(float(same.mean()))
    return lp, float(np.mean(hits)) if hits else 1.0, float(np.mean(ent))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="E=8 only, 2+2 windows")
    ap.add_argument("--windows", type=int, default=4, help="held-out windows per source")
    ap.add_argument("--length", type=int, default=256)
    ap.add_argument("--cache-dir", default=None, help="fit cache (default ~/.cache/rkv/moe)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "moe_quality.json"))
    args = ap.parse_args()
    import torch

    n = 2 if args.quick else args.windows
    plan = {8: [1, 2, 4, 8]} if args.quick else {8: [1, 2, 4, 6, 8], 16: [1, 2, 4, 8, 12, 16]}
    model, tok = load_smollm2(threads=args.threads)
    windows = heldout_text(tok, n, args.length) + heldout_text(tok, n, args.length, "docs")
    sources = ["topics"] * n + ["docs"] * n
    with torch.no_grad():
        ref = [torch.log_softmax(model(torch.tensor([w]), use_cache=False).logits[0].float(),
                                 -1) for w in windows]
    dense_nll = [window_metrics(r, r, w)[1] for r, w in zip(ref, windows, strict=True)]
    m, lo, hi = ci(dense_nll)
    out: dict[str, Any] = {
        "model": SMOLLM2_ID, "quick": args.quick, "length": args.length,
        "heldout": {"topics": n, "docs": n}, "threads": args.threads,
        "dense": {"ppl": math.exp(m), "ppl_ci": [math.exp(lo), math.exp(hi)]},
        "fit": {}, "results": []}
    print(f"dense: ppl {math.exp(m):.2f} [{math.exp(lo):.2f}, {math.exp(hi):.2f}]", flush=True)
    moe: MoEModel | None = None
    for e, ks in plan.items():
        if moe is not None:
            model = moe.restore()
        t0 = time.perf_counter()
        moe = MoEModel.build(model, e, 1, cache_dir=args.cache_dir, tokenizer=tok,
                             name=SMOLLM2_ID, log=lambda s: print(s, flush=True))
        out["fit"][str(e)] = {"fit_seconds": round(moe.fit.seconds, 1),
                              "build_seconds": round(time.perf_counter() - t0, 1),
                              "fingerprint": moe.fingerprint,
                              "expert_bytes_fp16": moe.spec.expert_bytes}
        for k in ks:
            moe.set_top_k(k)
            rows: dict[str, list[float]] = {"kl": [], "nll": [], "top1": [], "spec_hit": [],
                                            "usage_entropy": []}
            t0 = time.perf_counter()
            for w, r in zip(windows, ref, strict=True):
                lp, hit, ent = run_window(moe, w)
                kl, nll, top1 = window_metrics(r, lp, w)
                for key, v in zip(rows, (kl, nll, top1, hit, ent), strict=True):
                    rows[key].append(v)
            res: dict[str, Any] = {"experts": e, "top_k": k,
                                   "seconds": round(time.perf_counter() - t0, 1)}
            for key, vals in rows.items():
                mean, low, high = ci(vals)
                if key == "nll":
                    res["ppl"] = math.exp(mean)
                    res["ppl_ci"] = [math.exp(low), math.exp(high)]
                else:
                    res[key] = mean
                    res[f"{key}_ci"] = [low, high]
            for src in ("topics", "docs"):
                sel = [i for i, s in enumerate(sources) if s == src]
                res[f"kl_{src}"] = float(np.mean([rows["kl"][i] for i in sel]))
                res[f"ppl_{src}"] = math.exp(float(np.mean([rows["nll"][i] for i in sel])))
            out["results"].append(res)
            print(f"E={e:2d} k={k:2d}: KL {res['kl']:.3f} [{res['kl_ci'][0]:.3f}, "
                  f"{res['kl_ci'][1]:.3f}]  ppl {res['ppl']:.1f} [{res['ppl_ci'][0]:.1f}, "
                  f"{res['ppl_ci'][1]:.1f}]  top1 {res['top1']:.3f}  spec-hit "
                  f"{res['spec_hit']:.3f}  usage-H {res['usage_entropy']:.3f}", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
