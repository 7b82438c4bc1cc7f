"""``rkv moe run`` measured: SmolLM2-135M-MoE (E=8; k=2 for speed, k=6 for quality: k=2 is
unusable, ppl ~3e4) generating with its experts streamed from an rkv expert store against the
same model with every expert resident, and its quality against the dense model when the
experts are stored at 16, 8 or 4 bits. SmolLM2's weights are GGUF Q4_1 (4-bit), dequantized.

Speed: greedy decoding of a fixed chat prompt, float16 experts, the engine's default tiers
(every record lands in ``dram``, no ECC), budgets of 10/25/50/100 % of all experts' bytes,
policies LRU per layer and activation (one global cache), prefetch none or speculative
routing hints loaded by a worker thread. Each round runs the resident model, every
configuration once with a cold cache (a fresh open), and the resident model again; medians over the
rounds with min-max, the ratio streamed / resident of the medians. The generated tokens of
every streamed run must equal the resident ones (asserted). Decode tokens/s excludes the
prompt's forward; hit ratio and bytes moved per token are of the decode steps.

Quality: held-out windows (pydoc topics after the calibration text, and rkv's docs):
perplexity and mean KL(dense || MoE) with 95 % t CIs over windows, for the fitted float32
experts (resident), the store at 16 (float16), 8 and 4 bits (rowq; full budget, one forward
per window), and a 16-bit store with a 4-bit low-bit copy served on every miss
(``low_bit_on_miss``, 50 % global LRU budget), evaluated teacher-forced one token at a
time so that misses happen as in decoding, on the first ``--forced-tokens`` (32) positions
of each window only (a 4-bit copy decodes in ~8 ms; full windows take over 30 minutes).

    .venv/bin/python benchmarks/bench_moe_run.py            # ~10 min on 2 cores
    .venv/bin/python benchmarks/bench_moe_run.py --quick    # ~3 min
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_moe_quality import ci, window_metrics  # noqa: E402

from rkv.cli import moe_run as R  # noqa: E402
from rkv.eval.quality import SMOLLM2_ID, load_smollm2  # noqa: E402
from rkv.moe.experts import ResidentExperts  # noqa: E402
from rkv.moe.model import MoEModel, heldout_text  # noqa: E402

POLICIES = [("lru", True), ("activation", False)]     # (eviction, per layer)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def med(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def speed(moe: MoEModel, layers: Any, spec: R.StoreSpec, ids: list[int], n: int,
          budgets: list[float], repeats: int) -> dict[str, Any]:
    total = R.expert_bytes(layers)
    resident = ResidentExperts(layers)
    configs = [(b, pol, pl, pf) for b in budgets for pol, pl in POLICIES
               for pf in ("none", "hints")]
    runs: dict[Any, list[dict[str, Any]]] = {c: [] for c in [None, *configs]}
    want: list[int] | None = None
    for r in range(repeats):
        moe.set_provider(resident)
        g = R.greedy(moe, ids, n)
        runs[None].append(R.summary(g))
        want = want or g.tokens
        assert g.tokens == want, "resident generation is not deterministic"
        for c in [*configs, None]:
            if c is None:                                # resident again, closing the round
                moe.set_provider(resident)
                g = R.greedy(moe, ids, n)
                runs[None].append(R.summary(g))
                assert g.tokens == want
                continue
            b, pol, pl, pf = c
            kw = R.open_options(int(b * total), pol, pl, pf)
            with R.open_store(spec, lambda: layers, **kw) as p:
                moe.set_provider(p)
                moe.set_hint(R.PREFETCH[pf][2])
                g = R.greedy(moe, ids, n, provider=p)
                p.settle()
                g.stats_end = p.stats()
            moe.set_provider(None)
            s = R.summary(g)
            s["identical"] = g.tokens == want
            assert s["identical"], f"streamed tokens differ from resident: {c}"
            runs[c].append(s)
        log(f"round {r + 1}/{repeats}: resident {runs[None][-1]['decode_tokens_per_s']:.1f} "
            "tokens/s")
    res_tps = med([s["decode_tokens_per_s"] for s in runs[None]])
    rows = []
    for c in configs:
        ss = runs[c]
        tps = med([s["decode_tokens_per_s"] for s in ss])
        rec: dict[str, Any] = {
            "budget": b_text(c[0]), "policy": c[1], "per_layer": c[2], "prefetch": c[3],
            "decode_tokens_per_s": tps, "ratio": tps["median"] / res_tps["median"],
            "hit_ratio": med([s["hit_ratio"] for s in ss]),
            "bytes_per_token": med([s["bytes_per_token"] for s in ss]),
            "prefill_s": med([s["prefill_s"] for s in ss]),
            "prefetch_issued": med([s["prefetch_issued"] for s in ss]),
            "prefetch_used": med([s["prefetch_used"] for s in ss]),
            "identical": all(s["identical"] for s in ss)}
        rows.append(rec)
        log(f"{rec['budget']:>5} {c[1]}{'/layer' if c[2] else ''} {c[3]}: "
            f"{tps['median']:.1f} tokens/s (x{rec['ratio']:.2f}), hit "
            f"{rec['hit_ratio']['median']:.2f}")
    return {"tokens": n, "prompt_tokens": len(ids), "repeats": repeats,
            "resident": {"decode_tokens_per_s": res_tps,
                         "prefill_s": med([s["prefill_s"] for s in runs[None]])},
            "tokens_identical": all(r["identical"] for r in rows), "rows": rows,
            "text": want}


def b_text(b: float) -> str:
    return f"{round(100 * b)}%"


def forced(moe: MoEModel, ids: list[int]) -> Any:
    """Log-probs of every next token, one token per forward with a KV cache."""
    import torch

    out, rows = None, []
    with torch.no_grad():
        for t in ids:
            kw: dict[str, Any] = {} if out is None else {"cache": getattr(out, "cache", None)
                                         or out.past_key_values}
            out = moe(torch.tensor([[t]]), use_cache=True, **kw)
            rows.append(out.logits[0, -1].float())
    return torch.log_softmax(torch.stack(rows), -1)


def full(moe: MoEModel, ids: list[int]) -> Any:
    import torch

    with torch.no_grad():
        return torch.log_softmax(moe(torch.tensor([ids]), use_cache=False).logits[0].float(),
                                 -1)


def row(name: str, ref: list[Any], lps: list[Any], windows: list[list[int]],
        extra: dict[str, Any]) -> dict[str, Any]:
    kls, nlls = [], []
    for r, lp, w in zip(ref, lps, windows, strict=True):
        kl, nll, _ = window_metrics(r, lp, w)
        kls.append(kl)
        nlls.append(nll)
    kl_m, kl_lo, kl_hi = ci(kls)
    n_m, n_lo, n_hi = ci(nlls)
    out = {"config": name, "kl": kl_m, "kl_ci": [kl_lo, kl_hi], "ppl": math.exp(n_m),
           "ppl_ci": [math.exp(n_lo), math.exp(n_hi)], **extra}
    log(f"{name}: KL {kl_m:.3f} [{kl_lo:.3f}, {kl_hi:.3f}]  ppl {out['ppl']:.1f} "
        f"[{out['ppl_ci'][0]:.1f}, {out['ppl_ci'][1]:.1f}]")
    return out


def quality(moe: MoEModel, layers: Any, specs: dict[int, R.StoreSpec], ref: list[Any],
            windows: list[list[int]], dense_nll: list[float], k: int, low_budget: float,
            forced_tokens: int) -> dict[str, Any]:
    moe.set_top_k(k)
    m, lo, hi = ci(dense_nll)
    out: dict[str, Any] = {"dense": {"ppl": math.exp(m), "ppl_ci": [math.exp(lo),
                                                                     math.exp(hi)]}}
    moe.set_hint(False)
    moe.set_provider(None)                               # the fitted float32 experts
    rows = [row("resident float32", ref, [full(moe, w) for w in windows], windows,
                {"bits": 32})]
    total = R.expert_bytes(layers)
    for bits, spec in specs.items():
        with R.open_store(spec, lambda: layers, **R.open_options(total, "lru", False,
                                                                 "none")) as p:
            moe.set_provider(p)
            rows.append(row(f"store {bits}-bit", ref, [full(moe, w) for w in windows],
                            windows, {"bits": bits}))
            moe.set_provider(None)
    kw = R.open_options(int(low_budget * total), "lru", False, "none", low_bit_on_miss=True)
    short = [w[:forced_tokens] for w in windows]   # a 4-bit decode takes ~8 ms: keep it short
    with R.open_store(specs[16], lambda: layers, **kw) as p:
        moe.set_provider(p)
        t0 = time.perf_counter()
        lps = []
        for i, w in enumerate(short):
            lps.append(forced(moe, w))
            log(f"low-bit on miss: window {i + 1}/{len(short)}")
        p.settle()
        s = p.stats()
        moe.set_provider(None)
    looked = s["hits"] + s["misses"]
    name = f"16-bit, 4-bit copy on every miss ({b_text(low_budget)} LRU, decode)"
    rows.append(row(name, [r[:len(w)] for r, w in zip(ref, short, strict=True)], lps, short,
                    {"bits": 16, "low_bit_on_miss": 4, "approximate": s["approximate"],
                     "expert_requests": looked, "approximate_share": s["approximate"] / looked,
                     "positions": forced_tokens, "seconds": time.perf_counter() - t0}))
    out["rows"] = rows
    out["top_k"] = k
    out["low_bit_on_miss_budget"] = b_text(low_budget)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="budgets 25/100 %%, 16 tokens, 2+2 windows of 128")
    ap.add_argument("--tokens", type=int, default=None, help="generated tokens (default 48)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--windows", type=int, default=None, help="held-out windows per source")
    ap.add_argument("--length", type=int, default=None, help="tokens per window")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quality-k", type=int, default=6,
                    help="top-k of the quality part (k=2 of 8 is unusable: ppl ~3e4)")
    ap.add_argument("--forced-tokens", type=int, default=32,
                    help="positions per window of the low-bit-on-miss row (one forward each)")
    ap.add_argument("--low-budget", type=float, default=0.5,
                    help="cache budget (share) of the low-bit-on-miss quality row")
    ap.add_argument("--cache-dir", default=None, help="fit cache (default ~/.cache/rkv/moe)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "moe_run.json"))
    args = ap.parse_args()
    import torch

    n_tok = args.tokens or (16 if args.quick else 48)
    n_win = args.windows or (2 if args.quick else 4)
    length = args.length or (128 if args.quick else 256)
    budgets = [0.25, 1.0] if args.quick else [0.1, 0.25, 0.5, 1.0]
    model, tok = load_smollm2(threads=args.threads)
    windows = heldout_text(tok, n_win, length) + heldout_text(tok, n_win, length, "docs")
    with torch.no_grad():
        ref = [full(model, w) for w in windows]
    dense_nll = [window_metrics(r, r, w)[1] for r, w in zip(ref, windows, strict=True)]
    moe = MoEModel.build(model, 8, 2, cache_dir=args.cache_dir, tokenizer=tok,
                         name=SMOLLM2_ID, log=log)
    layers = R.cast_experts(moe.experts, "float16")
    fp = R.store_fingerprint(moe.fingerprint, "float16")
    ids = R.prompt_ids(tok, R.DEFAULT_PROMPT)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="rkv-moe-run-") as d:
        specs = {b: R.StoreSpec(Path(d) / f"b{b}", fp, b, 4 if b == 16 else None)
                 for b in (16, 8, 4)}
        for spec in specs.values():                      # write once, outside the timing
            R.open_store(spec, lambda: layers, log=log,
                         **R.open_options(0, "lru", False, "none")).close()
        out: dict[str, Any] = {
            "model": SMOLLM2_ID, "weights": "GGUF Q4_1 (4-bit), dequantized to float32",
            "experts": 8, "top_k": 2, "quick": args.quick, "threads": args.threads,
            "expert_dtype": "float16", "expert_bytes_total": R.expert_bytes(layers),
            "tiers": "engine defaults (dram/cxl/nvme; every record in dram, no ECC)",
            "speed": speed(moe, layers, specs[16], ids, n_tok, budgets, args.repeats)}
        out["speed"]["text"] = tok.decode(out["speed"]["text"], skip_special_tokens=True)
        out["quality"] = quality(moe, layers, specs, ref, windows, dense_nll,
                                 args.quality_k, args.low_budget, args.forced_tokens)
        out["quality"].update({"windows": {"topics": n_win, "docs": n_win},
                               "length": length})
    out["seconds"] = round(time.perf_counter() - t0, 1)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print_tables(out)
    print(f"wrote {args.out}")
    return 0


def print_tables(out: dict[str, Any]) -> None:
    sp = out["speed"]
    r = sp["resident"]["decode_tokens_per_s"]
    print(f"resident: {r['median']:.1f} tokens/s [{r['min']:.1f}-{r['max']:.1f}]; "
          f"tokens identical in every streamed run: {sp['tokens_identical']}")
    print("| budget | policy | prefetch | tokens/s (min-max) | streamed/resident | hit ratio | "
          "MiB/token | prefetch used/issued |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for x in sp["rows"]:
        t = x["decode_tokens_per_s"]
        print(f"| {x['budget']} | {x['policy']}{' per layer' if x['per_layer'] else ''} | "
              f"{x['prefetch']} | {t['median']:.1f} ({t['min']:.1f}-{t['max']:.1f}) | "
              f"{x['ratio']:.2f} | {x['hit_ratio']['median']:.3f} | "
              f"{x['bytes_per_token']['median'] / 2**20:.1f} | "
              f"{x['prefetch_used']['median']:.0f}/{x['prefetch_issued']['median']:.0f} |")
    q = out["quality"]
    print(f"\ndense ppl {q['dense']['ppl']:.2f} [{q['dense']['ppl_ci'][0]:.2f}, "
          f"{q['dense']['ppl_ci'][1]:.2f}]")
    print(f"| experts (E=8, k={q['top_k']}) | ppl (95 % CI) | KL vs dense (95 % CI) | "
          "approximate |")
    print("|---|---:|---:|---:|")
    for x in q["rows"]:
        a = f"{100 * x['approximate_share']:.1f} %" if "approximate_share" in x else "0"
        print(f"| {x['config']} | {x['ppl']:.1f} [{x['ppl_ci'][0]:.1f}, {x['ppl_ci'][1]:.1f}] "
              f"| {x['kl']:.3f} [{x['kl_ci'][0]:.3f}, {x['kl_ci'][1]:.3f}] | {a} |")


if __name__ == "__main__":
    sys.exit(main())
