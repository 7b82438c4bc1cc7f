"""Calibration: how much each layer's K and V lose at 8, 4 and 2 bits, per model.

``rkv calibrate`` measures, on text windows, the KL divergence of the next-token
distributions (nats per scored token) and the perplexity when only one layer's prefix K (or
V) goes through rkv's KIVI quantizer and everything else stays exact
(:mod:`rkv.eval.calibrate_measure`). The result is a measured quality profile keyed by the
model fingerprint: a :class:`rkv.profiles.QualityProfile` with the mean KL, its standard
error and the perplexity per (layer, kind, bits), written as JSON by
:func:`rkv.profiles.write_profile` (the file format, its loaders and the shipped SmolLM2-135M
profile live in :mod:`rkv.profiles`)::

    prof = calibrate(24, cache="calibrate.jsonl")   # resumable: finished windows are cached
    write_profile(prof, "smollm2-135m.json")
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any

from rkv.format.model import ModelSpec
from rkv.profiles import BITS, KINDS, QualityProfile, write_profile
from rkv.ui.progress import Progress

log = logging.getLogger(__name__)


def smollm2_spec() -> ModelSpec:
    """The rkv model spec of SmolLM2-135M-Instruct (Q4_1) as ``rkv.adapters.hf.model_spec``
    gives it: fp32 KV, 30 layers, 3 KV heads of 64."""
    from rkv.eval.quality import SMOLLM2_ID

    return ModelSpec(SMOLLM2_ID, n_layers=30, n_kv_heads=3, head_dim=64, dtype="float32",
                     layout="hf-dynamic-cache")


# -- the calibration run ---------------------------------------------------------------------
def calibrate(n_windows: int = 24, *, cache: str | Path | None = None,
              sources: tuple[str, ...] = ("topics", "docs"), threads: int = 2,
              quiet: bool = False, model_tok: tuple[Any, Any] | None = None,
              layers: list[int] | None = None, limit: int | None = None) -> QualityProfile:
    """Measure the SmolLM2 profile on ``n_windows`` windows (only the first ``limit`` of
    them when given: a run that stops early, resumable up to all ``n_windows``). ``cache``
    (JSON Lines): every finished window is appended, and a rerun with the same settings
    resumes from it."""
    from rkv.eval.calibrate_measure import LENGTH, PREFIX, calibration_windows, window_cases
    from rkv.eval.quality import load_smollm2

    t0 = time.perf_counter()
    model, tok = model_tok or load_smollm2(threads)
    spec = smollm2_spec()
    windows, text = calibration_windows(tok, n_windows, sources)
    use = n_windows if limit is None else max(1, min(limit, n_windows))
    if use < n_windows:
        text = [f"the first {use} of {n_windows} windows, alternating:", *text]
    header = {"fingerprint": spec.fingerprint().hex(), "windows": windows, "prefix": PREFIX,
              "length": LENGTH, "bits": list(BITS), "quant": "kivi(group=32), 256-token blocks",
              "layers": layers}
    done: dict[int, dict[str, Any]] = {}
    cpath = Path(cache) if cache else None
    if cpath is not None and cpath.exists():
        from rkv.inputs import MAX_RESULTS_BYTES, read_text

        lines = read_text(cpath, "calibration cache", limit=MAX_RESULTS_BYTES).splitlines()
        try:
            if lines and json.loads(lines[0]) == header:
                for line in lines[1:]:
                    row = json.loads(line)
                    done[int(row["i"])] = row
            else:
                lines = []
        except (ValueError, KeyError, TypeError):
            lines, done = [], {}     # a torn or foreign cache: start again
        if not lines:
            cpath.write_text(json.dumps(header) + "\n")
    elif cpath is not None:
        cpath.parent.mkdir(parents=True, exist_ok=True)
        cpath.write_text(json.dumps(header) + "\n")
    n_l = len(layers) if layers is not None else spec.n_layers
    cached = sum(1 for i in done if i < use)
    with Progress("calibrate", use * n_l, unit="layer", quiet=quiet,
                  initial=cached * n_l) as bar:
        if cached:
            bar.write(f"calibrate: resuming, {cached} of {use} windows cached")
        for i, ids in enumerate(windows[:use]):
            if i in done:
                continue
            tw = time.perf_counter()
            kl, nll, nll_ref, floor = window_cases(model, ids, layers)
            row = {"i": i, "kl": kl, "nll": nll, "nll_ref": nll_ref, "floor": floor,
                   "seconds": time.perf_counter() - tw}
            done[i] = row
            if cpath is not None:
                with cpath.open("a") as f:
                    f.write(json.dumps(row) + "\n")
            log.info("calibrate: window %d of %d in %.1f s", i + 1, use, row["seconds"])
            bar.update(n_l)
    return summarize([done[i] for i in range(use)], text, spec,
                     seconds=time.perf_counter() - t0, threads=threads,
                     scored=len(windows[0]) - PREFIX)


def summarize(rows: list[dict[str, Any]], text: list[str], spec: ModelSpec, *,
              seconds: float, threads: int, scored: int) -> QualityProfile:
    """The profile from per-window rows (``kl``, ``nll``, ``nll_ref``, ``floor``)."""
    from rkv.eval.calibrate_measure import PREFIX
    from rkv.eval.quality import SMOLLM2_ID

    n = len(rows)
    keys = sorted(rows[0]["kl"])
    kl, se, ppl = {}, {}, {}
    for k in keys:
        xs = [max(float(r["kl"][k]), 0.0) for r in rows]
        m = sum(xs) / n
        kl[k] = m
        se[k] = (math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1) / n) if n > 1 else 0.0)
        ppl[k] = math.exp(sum(float(r["nll"][k]) for r in rows) / (n * scored))
    meta = {"prefix": PREFIX, "scored": scored,
            "quant": "kivi(bits, group=32) per 256-token block; only the named layer's prefix "
                     "K or V quantized, all else exact; fp32 KV",
            "ppl_ref": math.exp(sum(float(r["nll_ref"]) for r in rows) / (n * scored)),
            "kl_floor": max(float(r["floor"]) for r in rows),
            "seconds": round(seconds, 1), "threads": threads, "version": 1}
    return QualityProfile(kl, SMOLLM2_ID if spec.model_id == SMOLLM2_ID else spec.model_id,
                          fingerprint=spec.fingerprint().hex(), weights="Q4_1", windows=n,
                          text=text, kl_se=se, ppl=ppl, meta=meta)


def cmd_calibrate(args: Any) -> int:
    """``rkv calibrate``: measure the SmolLM2 profile and write it (JSON)."""
    import os

    cache = args.cache or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "rkv",
        f"calibrate-{smollm2_spec().fingerprint().hex()[:12]}-{args.windows}.jsonl")
    prof = calibrate(args.windows, cache=cache, sources=tuple(args.text.split(",")),
                     threads=args.threads, quiet=args.quiet, limit=args.limit)
    write_profile(prof, args.out)
    print(f"wrote {args.out}: {prof.windows} windows, {prof.meta['seconds']:.0f} s "
          f"(cache {cache})")
    for kind in KINDS:
        print(f"  {kind.upper()}: mean KL " + ", ".join(
            f"{b} bits {prof.mean_kl(kind, b):.3g}" for b in BITS))
    return 0
