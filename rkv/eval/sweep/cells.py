"""One sweep cell: a pure function of its config (:func:`run_cell`).

* **reliability**: a fault campaign through the real read path
  (:func:`rkv.eval.faults.campaign.run_campaign`, run by :mod:`rkv.eval.sweep.cell_campaign`):
  per-block outcome rates with 95 % Wilson intervals next to the analytic P(DUE) and P(SDC)
  of the same settings;
* **quality**: SmolLM2-135M (weights 4-bit Q4_1) scores ``scored`` tokens after a
  ``prefix`` whose KV went through rkv with the cell's bits, code and faults
  (:class:`rkv.eval.quality.RkvRoundTrip`): perplexity, KL and top-1 agreement against the untouched
  cache, mean and 95 % t interval over the windows;
* **cost**: stored bytes per token of a SmolLM2-shaped fp16 put (30 layers x 3 KV heads x 64
  dims) and its put and get throughput.

Everything random is seeded from the cell's ``seed``, so a cell run twice (or on another
executor) gives the same row except ``timings``, ``version`` and the measured throughputs.
The model, its tokenizer, the windows and the reference scores are cached per process (a
worker loads SmolLM2 once, not per cell).
"""

from __future__ import annotations

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
from rkv.eval.sweep.spec import campaign_kwargs, effective_code

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
    from rkv.eval.quality import RkvRoundTrip, raw_model_faults

    if cell["placement"] is not None:
        return PlannedRoundTrip(cell)

    fm = {"preset": cell["preset"], **cell["params"]}
    chunk = cell["layout"]["chunk_tokens"]
    if cell["code"] == "raw":
        return raw_model_faults(fm, cell["hours"], seed=cell["seed"],
                                ber_multiplier=cell["ber_multiplier"], chunk_tokens=chunk)
    quant = "none" if cell["bits"] >= 16 else f"kivi(bits={cell['bits']})"
    return RkvRoundTrip(quant=quant, ecc=effective_code(cell["code"], cell["layout"]),
                        fault_model=fm, hours=cell["hours"], seed=cell["seed"],
                        chunk_tokens=chunk, ber_multiplier=cell["ber_multiplier"])


def quality(cell: Mapping[str, Any]) -> dict[str, Any]:
    """Perplexity, KL and top-1 of SmolLM2-135M (Q4_1 weights) over the windows, each a mean
    with its 95 % t interval; ``delta_ppl`` is the paired perplexity change against the
    untouched cache (window by window: tighter than comparing two means)."""
    q = cell["settings"]["quality"]
    threads, prefix = q["threads"], q["prefix"]
    model, _ = smollm2(threads)
    wins = [list(w) for w in _windows(tuple(q["text"]), q["windows"], prefix + q["scored"],
                                      threads)]
    transform = _transform(cell)
    res = measure(model, wins, transform, prefix)
    ci = res.ci()
    plan = getattr(transform, "classes", None)
    extra = {} if plan is None else {"plan": [{"bits": b, "code": c, "blocks": n}
                                              for (b, c), n in sorted(plan.items())]}
    return extra | {
        "windows": len(wins), "text": ",".join(q["text"]), "ppl": interval(ci["perplexity"]),
        "ppl_ref": finite(statistics.fmean(w["ref_perplexity"] for w in res.per_window)),
        "delta_ppl": interval(ci["delta_perplexity"]), "kl": interval(ci["kl"]),
        "top1": interval(ci["top1"]), "due_blocks": int(res.report.get("due_blocks", 0)),
        "recomputed_tokens": int(res.recomputed_tokens)}


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
