"""What quantized planes buy on SmolLM2-135M: a KIVI 4-bit block's metadata strict, its packed
codes tolerant, against strict codes over the whole quantized block.

The model's KV (float16, quantized by ``kivi(bits=4)``) goes through a real rkv engine whose
only tier uses each protection, with faults injected into every stored record; a block the
read reports uncorrectable makes the window a recompute (KL 0 for its tokens, the prefill is
paid again); a ``degraded`` block (the codes failed their code, the metadata verified) is
dequantized as read and used. Rows (all after ``kivi(bits=4)``):

* ``clean``: no faults (the quantization's own KL);
* strict codes over the whole quantized block: ``rs(255,239)``, ``rs(255,223)``;
* quantized planes (the ``planes`` spec on a quantized tier): ``planes(high=rs(255,223),
  low=none)`` (about rs(255,239)'s parity: the metadata is 43 % of a 256-token block),
  ``planes(high=rs(255,239),low=none)`` and ``planes(high=rs(255,223),low=rs(255,247))``.

Faults: independent bit flips at an accelerated raw BER (a measurement of this size would
see nothing at the presets' rates); the analytic P(DUE) and P(degraded) per block over 24 h
under the shipped presets come from ``rkv.reliability.analytic.predict``. KL per window
against the model with the float32 cache untouched; 95 % bootstrap intervals over windows and
paired differences against ``rs(255,239)`` in the same run. Held-out windows as in
``bench_planes.py``. The model's weights are 4-bit (Q4_1).

    .venv/bin/python benchmarks/bench_qplanes.py --windows 12 --ber 1e-3 3e-4 \
        --json benchmarks/results/qplanes.json
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_planes import PRESETS, interval

QUANT = "kivi(bits=4)"
SINGLE = ["rs(255,239)", "rs(255,223)"]
QPLANES = ["planes(high=rs(255,223),low=none)", "planes(high=rs(255,239),low=none)",
           "planes(high=rs(255,223),low=rs(255,247))"]
BASE = "rs(255,239)"
BLOCK = (2, 256, 3, 64)           # one layer's K and V for a 256-token chunk of SmolLM2


def _pipe(code: str) -> Any:
    from rkv.codec.pipeline import Pipeline

    return Pipeline.parse(QUANT, code).for_block(BLOCK, "float16")


def parity_fraction(code: str) -> float:
    """Parity bytes over the quantized data bytes."""
    p = _pipe(code)
    data = p.data_bytes(BLOCK, "float16")
    return (p.payload_bytes(BLOCK, "float16") - data) / data


def predicted(code: str) -> dict[str, dict[str, float]]:
    import faultmodels
    from rkv.reliability.analytic import predict

    p = _pipe(code)
    data = p.data_bytes(BLOCK, "float16")
    return {name: {"p_due": q.p_due, "p_degraded": q.p_degraded}
            for name, spec in PRESETS
            for q in [predict(p, data, faultmodels.get_model(spec), 24.0)]}


def _transform(code: str, ber: float, seed: int) -> Any:
    from rkv.eval.quality import RkvRoundTrip

    inner = RkvRoundTrip(quant=QUANT, ecc="none" if code == "clean" else code,
                         fault_model=None if code == "clean" else
                         {"model": "raw-ber", "ber": ber}, hours=1.0, seed=seed)

    def transform(kv: np.ndarray, tokens: list[int]) -> tuple[np.ndarray | None,
                                                               dict[str, int]]:
        out, rep = inner(kv.astype(np.float16), tokens)
        return (None if out is None else out.astype(kv.dtype)), rep

    return transform


def _row(code: str, ber: float, windows: list[Any], model: Any) -> tuple[dict[str, Any],
                                                                         list[float]]:
    from rkv.eval.quality import evaluate

    kls, rec, deg, blocks = [], 0, 0, 0
    for i, w in enumerate(windows):
        q = evaluate(model, [w], _transform(code, ber, seed=1000 + i), label=code)
        kls.append(q.kl)
        rec += q.recomputed
        deg += int(q.report.get("degraded", 0))
        blocks += sum(v for k, v in q.report.items()
                      if k in ("ok", "corrected", "degraded", "uncorrectable", "missing"))
    finite = [k for k in kls if np.isfinite(k)]
    mean, lo, hi = interval(finite) if finite else (math.nan, math.nan, math.nan)
    return {"ber": 0.0 if code == "clean" else ber, "code": code, "quant": QUANT,
            "parity": 0.0 if code == "clean" else parity_fraction(code),
            "kl": mean, "kl_ci": [lo, hi], "nonfinite": len(kls) - len(finite),
            "recompute": rec / len(windows), "degraded_blocks": deg / blocks if blocks else 0.0,
            "degraded_count": deg, "blocks": blocks, "windows": len(windows),
            "predicted_24h": {} if code == "clean" else predicted(code)}, kls


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--windows", type=int, default=12)
    ap.add_argument("--ber", type=float, nargs="+", default=[1e-3])
    ap.add_argument("--json", default="")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--codes", nargs="+", default=[], help="rows to run (default: all)")
    args = ap.parse_args(argv)
    from rkv.eval.calibrate_measure import heldout_windows
    from rkv.eval.quality import load_smollm2

    codes = args.codes or [*SINGLE, *QPLANES]
    t0 = time.perf_counter()
    model, tok = load_smollm2(args.threads or None)
    windows = heldout_windows(tok, 24, args.windows)
    rows: list[dict[str, Any]] = []

    def show(row: dict[str, Any]) -> None:
        print(f"ber {row['ber']:g} {row['code']:<42} parity {row['parity']:6.2%}  KL "
              f"{row['kl']:.5f} [{row['kl_ci'][0]:.5f}, {row['kl_ci'][1]:.5f}]  recompute "
              f"{row['recompute']:.0%}  degraded blocks {row['degraded_count']}/{row['blocks']}"
              f"  non-finite {row['nonfinite']}", flush=True)

    clean, _ = _row("clean", 0.0, windows, model)
    rows.append(clean)
    show(clean)
    for ber in args.ber:
        per: dict[str, list[float]] = {}
        for code in codes:
            row, per[code] = _row(code, ber, windows, model)
            rows.append(row)
            show(row)
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
                        print(f"  {code:<42} KL - {BASE}: {d:+.5f} [{dlo:+.5f}, {dhi:+.5f}]")
    out = {"model": "SmolLM2-135M-Instruct (weights 4-bit Q4_1)", "kv_dtype": "float16",
           "quant": QUANT, "windows": args.windows, "seconds": time.perf_counter() - t0,
           "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    print(f"{out['seconds']:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
