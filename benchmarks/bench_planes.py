"""What unequal protection of byte planes buys on SmolLM2-135M: quality (KL of the next-token
distribution) and recompute rate versus parity bytes.

The model's KV (float16, as a serving engine stores it) goes through a real rkv engine whose
only tier uses each protection, with faults injected into every stored record; a block the
read reports uncorrectable makes the window a recompute (KL 0, but the prefill is paid again);
a ``degraded`` block (tolerant low plane failed, high plane exact) is used as read. Rows:

* ``raw``: what peers store (the same bit flips, nothing detected);
* single codes over the whole block: ``rs(255,247)``, ``rs(255,239)``, ``rs(255,223)``;
* planes: ``planes(high=rs(255,239),low=none)`` (about the parity of rs(255,247)),
  ``planes(high=rs(255,223),low=none)`` (about rs(255,239)'s), and
  ``planes(high=rs(255,223),low=rs(255,247))``.

Faults: independent bit flips at an accelerated raw BER (the tier presets give P(any error)
of about 1e-9 per block-day, which no measurement of this size would see), so the figures
say what each layout does *when* errors come; the analytic P(DUE) and P(degraded) per block
over 24 h under the shipped tier presets come from ``rkv.reliability.analytic.predict``.

KL per window against the model with the float32 cache untouched; 95 % bootstrap intervals
over windows, and paired differences against ``rs(255,239)``. Windows: Python's
``pydoc_data.topics`` and rkv's own docs (text the model cannot have seen), alternating.
The model's weights are 4-bit (Q4_1).

    .venv/bin/python benchmarks/bench_planes.py --json benchmarks/results/planes.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Any

import numpy as np

SINGLE = ["rs(255,247)", "rs(255,239)", "rs(255,223)"]
PLANES = ["planes(high=rs(255,239),low=none)", "planes(high=rs(255,223),low=none)",
          "planes(high=rs(255,223),low=rs(255,247))"]
BASE = "rs(255,239)"
PRESETS: list[tuple[str, Any]] = [("dram-ddr5", "dram-ddr5"), ("cxl", "cxl"),
                                  ("nvme-tlc 3000 P/E", {"preset": "nvme-tlc",
                                                         "pe_cycles": 3000})]
BLOCK = (2, 256, 3, 64)           # one layer's K and V for a 256-token chunk of SmolLM2


def parity_fraction(code: str) -> float:
    from rkv.codec.pipeline import Pipeline

    p = Pipeline.parse("none", code).for_block(BLOCK, "float16")
    data = p.data_bytes(BLOCK, "float16")
    return (p.payload_bytes(BLOCK, "float16") - data) / data


def predicted(code: str) -> dict[str, dict[str, float]]:
    import faultmodels
    from rkv.codec.pipeline import Pipeline
    from rkv.reliability.analytic import predict

    p = Pipeline.parse("none", code).for_block(BLOCK, "float16")
    data = p.data_bytes(BLOCK, "float16")
    out = {}
    for name, spec in PRESETS:
        q = predict(p, data, faultmodels.get_model(spec), 24.0)
        out[name] = {"p_due": q.p_due, "p_degraded": q.p_degraded}
    return out


def _transform(code: str, ber: float, seed: int) -> Any:
    from rkv.eval.quality import RkvRoundTrip, raw_flips

    inner = raw_flips(ber, seed) if code == "raw" else RkvRoundTrip(
        ecc=code, fault_model={"model": "raw-ber", "ber": ber}, hours=1.0, seed=seed)

    def transform(kv: np.ndarray, tokens: list[int]) -> tuple[np.ndarray | None,
                                                               dict[str, int]]:
        out, rep = inner(kv.astype(np.float16), tokens)
        return (None if out is None else out.astype(kv.dtype)), rep

    return transform


def interval(x: list[float], n: int = 4000, seed: int = 0) -> tuple[float, float, float]:
    """Mean and a 95 % percentile-bootstrap interval over windows."""
    a = np.asarray(x, dtype=np.float64)
    m = a[np.random.default_rng(seed).integers(0, a.size, size=(n, a.size))].mean(axis=1)
    return float(a.mean()), float(np.percentile(m, 2.5)), float(np.percentile(m, 97.5))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--ber", type=float, nargs="+", default=[3e-4])
    ap.add_argument("--quick", action="store_true", help="2 windows, one BER, fewer rows")
    ap.add_argument("--json", default="")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--codes", nargs="+", default=[], help="rows to run (default: all)")
    args = ap.parse_args(argv)
    from rkv.eval.calibrate_measure import heldout_windows
    from rkv.eval.quality import evaluate, load_smollm2

    codes = ["raw", *SINGLE, *PLANES]
    bers = args.ber
    n_win = args.windows
    if args.codes:
        codes = args.codes
    if args.quick:
        codes, bers, n_win = ["raw", "rs(255,247)", PLANES[0], BASE], bers[:1], 2
    t0 = time.perf_counter()
    model, tok = load_smollm2(args.threads or None)
    # Fresh windows (not those the shipped quality profile was measured on).
    windows = heldout_windows(tok, 24, n_win)
    rows: list[dict[str, Any]] = []
    preds = {c: predicted(c) for c in codes if c != "raw"}
    for ber in bers:
        per: dict[str, list[float]] = {}
        for code in codes:
            kls, rec, deg, blocks = [], 0, 0, 0
            for i, w in enumerate(windows):
                q = evaluate(model, [w], _transform(code, ber, seed=1000 + i), label=code)
                kls.append(q.kl)
                rec += q.recomputed
                deg += int(q.report.get("degraded", 0))
                blocks += sum(v for k, v in q.report.items()
                              if k in ("ok", "corrected", "degraded", "uncorrectable",
                                       "missing"))
            per[code] = kls
            finite = [k for k in kls if np.isfinite(k)]
            mean, lo, hi = interval(finite) if finite else (math.nan, math.nan, math.nan)
            row = {"ber": ber, "code": code,
                   "parity": 0.0 if code == "raw" else parity_fraction(code),
                   "kl": mean, "kl_ci": [lo, hi], "nonfinite": len(kls) - len(finite),
                   "recompute": rec / len(windows),
                   "degraded_blocks": deg / blocks if blocks else 0.0, "windows": len(windows),
                   "predicted_24h": preds.get(code, {})}
            rows.append(row)
            print(f"ber {ber:g} {code:<42} parity {row['parity']:6.2%}  KL {mean:.5f} "
                  f"[{lo:.5f}, {hi:.5f}]  recompute {row['recompute']:.0%}  degraded blocks "
                  f"{row['degraded_blocks']:.1%}  non-finite {row['nonfinite']}", flush=True)
        if BASE in per:
            for code, kls in per.items():
                diffs = [a - b for a, b in zip(kls, per[BASE], strict=True)
                         if np.isfinite(a - b)]
                if not diffs:
                    continue
                d, dlo, dhi = interval(diffs)
                for r in rows:
                    if r["ber"] == ber and r["code"] == code:
                        r["kl_minus_base"], r["kl_minus_base_ci"] = d, [dlo, dhi]
    out = {"model": "SmolLM2-135M-Instruct (weights 4-bit Q4_1)", "kv_dtype": "float16",
           "windows": n_win, "seconds": time.perf_counter() - t0, "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    print(f"{out['seconds']:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
