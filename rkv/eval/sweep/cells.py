"""One sweep cell: a pure function of its config (:func:`run_cell`).

* **reliability**: a fault campaign through the real read path
  (:func:`rkv.eval.faults.campaign.run_campaign`, run by :mod:`rkv.eval.sweep.cell_campaign`):
  per-block outcome rates with 95 % Wilson intervals next to the analytic P(DUE) and P(SDC)
  of the same settings;
* **quality**: SmolLM2-135M (weights 4-bit Q4_1) scores ``scored`` tokens after a
  ``prefix`` whose KV went through rkv (:class:`rkv.eval.quality.RkvRoundTrip`) or raw
  storage (code ``raw``: :func:`rkv.eval.quality.raw_model_faults`, nothing verified) with
  the cell's bits, code and faults at its quality multiplier: perplexity, KL and top-1
  agreement against the untouched cache, mean and 95 % t interval over the finite windows;
  broken windows (non-finite scores), windows that met faults, recomputed windows and
  tokens, and windows whose KV came back wrong, counted;
* **cost**: stored bytes per token of a SmolLM2-shaped fp16 put (30 layers x 3 KV heads x 64
  dims) and its put and get throughput.

Everything random is seeded from the cell's ``seed``, so a cell run twice (or on another
executor) gives the same row except ``timings``, ``version`` and the measured throughputs.
The model, its tokenizer, the windows and the reference scores are cached per process (a
worker loads SmolLM2 once, not per cell).
"""

from __future__ import annotations

import math
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from rkv.eval.sweep.cell_campaign import finite, reliability, sub_seed
from rkv.eval.sweep.planned import PlannedRoundTrip, engine_config, smollm2_fp16
from rkv.eval.sweep.planned import reliability as planned_reliability
from rkv.eval.sweep.spec import campaign_kwargs, effective_code, quality_multiplier

# SmolLM2-135M's KV shape: what cost cells store.
SMOLLM2_SHAPE = {"n_layers": 30, "n_kv_heads": 3, "head_dim": 64}
RAW_BYTES_PER_TOKEN = 2 * 30 * 3 * 64 * 2      # K and V, fp16


def interval(ci: Any) -> dict[str, float | None]:
    """A :class:`rkv.eval.quality.MeanCI` as the row's ``{"mean", "lo", "hi"}``."""
    return {"mean": finite(ci.mean), "lo": finite(ci.low), "hi": finite(ci.high)}


@cache
def code_version() -> str:
    """rkv's version, plus ``+g<commit>`` when run from a git checkout."""
    import rkv

    root = Path(rkv.__file__).resolve().parents[1]
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"],
                                capture_output=True, text=True, timeout=10, check=True
                                ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return rkv.__version__
    return f"{rkv.__version__}+g{commit}" if commit else rkv.__version__


# -- quality ---------------------------------------------------------------------------------
_MODEL: dict[int, tuple[Any, Any]] = {}


def smollm2(threads: int) -> tuple[Any, Any]:
    """(model, tokenizer), loaded once per process (per thread count)."""
    if threads not in _MODEL:
        import contextlib
        import io

        import torch

        from rkv.eval.quality import load_smollm2

        _MODEL.clear()
        with contextlib.redirect_stderr(io.StringIO()):   # the GGUF loader's progress bar
            _MODEL[threads] = load_smollm2(threads=threads)
        torch.set_num_threads(threads)
    return _MODEL[threads]


@cache
def _windows(texts: tuple[str, ...], n: int, length: int, threads: int
             ) -> tuple[tuple[int, ...], ...]:
    from rkv.eval.sweep.texts import windows

    _, tok = smollm2(threads)
    return tuple(tuple(w) for w in windows(tok, list(texts), n, length))


@cache
def _evaluate_kwargs() -> dict[str, Any]:
    import inspect

    from rkv.eval.quality import evaluate

    # The attention-output error is the slowest part on a CPU and not a sweep metric.
    return {"attention": False} if "attention" in inspect.signature(evaluate).parameters else {}


def measure(model: Any, windows: list[list[int]], transform: Any, prefix: int) -> Any:
    """The one call into :func:`rkv.eval.quality.evaluate` (a
    :class:`rkv.eval.quality.Quality`, with per-window figures and their intervals)."""
    from rkv.eval.quality import evaluate

    return evaluate(model, windows, transform, prefix=prefix, **_evaluate_kwargs())


def _transform(cell: Mapping[str, Any]) -> Callable[..., Any]:
    """What the cell's quality windows' KV goes through, with faults injected at the cell's
    quality multiplier (:func:`rkv.eval.sweep.spec.quality_multiplier`)."""
    from rkv.eval.quality import RkvRoundTrip, raw_model_faults

    mult = quality_multiplier(cell)
    if cell["placement"] is not None:
        return PlannedRoundTrip(cell, ber_multiplier=mult)

    fm = {"preset": cell["preset"], **cell["params"]}
    chunk = cell["layout"]["chunk_tokens"]
    if cell["code"] == "raw":
        return raw_model_faults(fm, cell["hours"], seed=cell["seed"], ber_multiplier=mult,
                                chunk_tokens=chunk)
    quant = "none" if cell["bits"] >= 16 else f"kivi(bits={cell['bits']})"
    return RkvRoundTrip(quant=quant, ecc=effective_code(cell["code"], cell["layout"]),
                        fault_model=fm, hours=cell["hours"], seed=cell["seed"],
                        chunk_tokens=chunk, ber_multiplier=mult)


class WindowLog:
    """A quality transform that keeps, per window, the read's report and whether the KV it
    returned differs from the KV that was stored (``exact``: cells that store the values
    as computed, so that any difference is a wrong value the read did not flag)."""

    def __init__(self, inner: Callable[..., Any], exact: bool) -> None:
        self.inner = inner
        self.exact = exact
        self.reports: list[dict[str, int]] = []
        self.wrong: list[bool] = []

    def __call__(self, kv: np.ndarray, tokens: list[int]) -> tuple[np.ndarray | None,
                                                                    dict[str, int]]:
        out, report = self.inner(kv, tokens)
        self.reports.append(dict(report))
        n = 0 if out is None else int(out.shape[2])
        # NaN != NaN: a value turned into NaN counts as wrong, as it should.
        self.wrong.append(self.exact and out is not None and n > 0
                          and not np.array_equal(out, kv[:, :, :n]))
        return out, report


def wilson_count(k: int, n: int) -> dict[str, float | int]:
    """``k`` of ``n`` windows, with the rate's 95 % Wilson interval."""
    from rkv.eval.faults.campaign import wilson

    lo, hi = wilson(k, n)
    rate = k / n if n else 0.0
    return {"n": k, "total": n, "rate": rate, "lo": min(lo, rate), "hi": max(hi, rate)}


def _finite_ci(values: list[float], floor: float | None = None) -> dict[str, float | None]:
    """Mean and 95 % t interval of ``values`` (all null when there are none); ``floor``
    cuts the interval at a bound the quantity cannot cross (KL >= 0), which keeps its
    coverage."""
    from rkv.eval.quality import mean_ci

    if not values:                     # every window broken: no KL to report
        return {"mean": None, "lo": None, "hi": None}
    out = interval(mean_ci(values))
    if floor is not None and out["lo"] is not None:
        out["lo"] = max(out["lo"], floor)
    return out


def quality(cell: Mapping[str, Any]) -> dict[str, Any]:
    """SmolLM2-135M (Q4_1 weights) over the windows, with the cell's faults injected at its
    quality multiplier. A window whose scores are not finite (raw KV with flipped exponent
    bits gives NaN or inf logits) is *broken*: counted, with its 95 % Wilson interval, and
    left out of the means; perplexity, KL and top-1 are means with their 95 % t intervals
    over the finite windows (``delta_ppl``: the paired change against the untouched cache).
    A DUE is charged as its recompute (``recomputed_windows``, ``recomputed_tokens``): the
    window is scored on the cache the engine's caller rebuilds."""
    q = cell["settings"]["quality"]
    threads, prefix = q["threads"], q["prefix"]
    model, _ = smollm2(threads)
    wins = [list(w) for w in _windows(tuple(q["text"]), q["windows"], prefix + q["scored"],
                                      threads)]
    transform = _transform(cell)
    log = WindowLog(transform, exact=cell["placement"] is None and cell["bits"] >= 16)
    res = measure(model, wins, log, prefix)
    per = res.per_window
    ok = [math.isfinite(w["kl"]) and math.isfinite(w["perplexity"]) for w in per]
    good = [w for w, o in zip(per, ok, strict=True) if o]
    reps = log.reports
    plan = getattr(transform, "classes", None)
    extra = {} if plan is None else {"plan": [{"bits": b, "code": c, "blocks": n}
                                              for (b, c), n in sorted(plan.items())]}
    return extra | {
        "windows": len(wins), "text": ",".join(q["text"]),
        "ber_multiplier": quality_multiplier(cell),
        "ppl": _finite_ci([w["perplexity"] for w in good]),
        "ppl_ref": finite(statistics.fmean(w["ref_perplexity"] for w in per)),
        "delta_ppl": _finite_ci([w["perplexity"] - w["ref_perplexity"] for w in good]),
        "kl": _finite_ci([w["kl"] for w in good], floor=0.0),
        "top1": _finite_ci([w["top1"] for w in good]),
        "finite_windows": len(good), "broken": wilson_count(len(per) - len(good), len(per)),
        "faulted_windows": sum(bool(r.get("faulted_blocks")) for r in reps),
        "recomputed_windows": sum(bool(w["recomputed_tokens"]) for w in per),
        "corrected_windows": sum(bool(r.get("corrected_symbols") or r.get("corrected"))
                                 for r in reps),
        "degraded_blocks": sum(int(r.get("degraded", 0)) for r in reps),
        "wrong_kv_windows": sum(log.wrong) if log.exact else None,
        "due_blocks": int(res.report.get("due_blocks", 0)),
        "recomputed_tokens": int(res.recomputed_tokens),
        "per_window": [{"kl": finite(w["kl"]), "broken": not o,
                        "faulted_blocks": int(r.get("faulted_blocks", 0)),
                        "recomputed_tokens": int(w["recomputed_tokens"]), "wrong_kv": bad}
                       for w, o, r, bad in zip(per, ok, reps, log.wrong, strict=True)]}


# -- cost ------------------------------------------------------------------------------------
def cost(cell: Mapping[str, Any]) -> dict[str, Any]:
    """Stored bytes per token and put/get throughput (GB/s of fp16 KV, median of repeats)
    of a SmolLM2-shaped put in the cell's tier, bits and code."""
    from rkv.eval.faults.campaign import CampaignConfig
    from rkv.format.model import ModelSpec
    from rkv.store.config import EngineConfig
    from rkv.store.engine import Engine

    c = cell["settings"]["cost"]
    chunk = cell["layout"]["chunk_tokens"]
    n = c["chunks"] * chunk
    rng = np.random.default_rng(sub_seed(cell["seed"], 2))
    kv = rng.standard_normal((SMOLLM2_SHAPE["n_layers"], 2, n, 3, 64)).astype(np.float16)
    raw = kv.nbytes
    if cell["code"] == "raw":
        return {"bytes_per_token": float(RAW_BYTES_PER_TOKEN),
                "raw_bytes_per_token": float(RAW_BYTES_PER_TOKEN), "overhead": 0.0,
                "put_gbps": None, "get_gbps": None}
    root = Path(tempfile.mkdtemp(prefix="rkv-sweep-cost-"))
    if cell["placement"] is not None:
        cfg = engine_config(cell, root / "planned")
        spec = smollm2_fp16()              # the profile's model: its plan applies
    else:
        cfg = EngineConfig(chunk_tokens=chunk, repair=False,
                           tiers=(CampaignConfig(**campaign_kwargs(cell)).tier_config(),))
        spec = ModelSpec("sweep/cost", n_layers=SMOLLM2_SHAPE["n_layers"],
                         n_kv_heads=SMOLLM2_SHAPE["n_kv_heads"],
                         head_dim=SMOLLM2_SHAPE["head_dim"], dtype="float16")
    tier = cfg.tiers[0]
    puts: list[float] = []
    gets: list[float] = []
    try:
        with Engine.open(root / "store", cfg) as e:
            for r in range(c["repeats"]):
                tokens = list(range(r * n, (r + 1) * n))      # fresh keys: no dedup
                t0 = time.perf_counter()
                e.put(tokens, kv, model=spec)
                t1 = time.perf_counter()
                got = e.get(tokens, model=spec)
                t2 = time.perf_counter()
                if not got.ok:
                    raise RuntimeError(f"cost cell: a clean read failed: {got.counts}")
                puts.append(t1 - t0)
                gets.append(t2 - t1)
            stored = int(e.stats()["tiers"][tier.name]["bytes"])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    per_token = stored / (c["repeats"] * n)
    return {"bytes_per_token": per_token, "raw_bytes_per_token": float(RAW_BYTES_PER_TOKEN),
            "overhead": per_token / RAW_BYTES_PER_TOKEN - 1.0,
            "put_gbps": raw / statistics.median(puts) / 1e9,
            "get_gbps": raw / statistics.median(gets) / 1e9}


def _reliability(cell: Mapping[str, Any]) -> dict[str, Any]:
    if cell["placement"] is not None:
        return planned_reliability(cell)
    return reliability(cell)


METRIC_FNS: dict[str, Callable[[Mapping[str, Any]], dict[str, Any]]] = {
    "reliability": _reliability, "quality": quality, "cost": cost}


def run_cell(config: Mapping[str, Any]) -> dict[str, Any]:
    """The row of one cell, without its ``key`` and ``sweep`` (the runner adds them)."""
    row: dict[str, Any] = {"config": dict(config), "version": code_version(), "timings": {}}
    t_all = time.perf_counter()
    for metric in ("reliability", "quality", "cost"):
        if metric in config["metrics"]:
            t0 = time.perf_counter()
            row[metric] = METRIC_FNS[metric](config)
            row["timings"][f"{metric}_s"] = time.perf_counter() - t0
        else:
            row[metric] = None
            row["timings"][f"{metric}_s"] = 0.0
    row["timings"]["total_s"] = time.perf_counter() - t_all
    return row
