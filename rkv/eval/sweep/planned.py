"""Planned sweep cells: the engine's placement planner chooses each block's bits and code.

A planned cell (one entry of the ``placement`` axis) stores SmolLM2-135M-shaped fp16 KV
(16 bits = fp16, the quality profile's reference) in one memory tier whose fault model is the
cell's preset with its parameters, accelerated by its ``ber_multiplier``
(:func:`faultmodels.accelerate`): the planner sees the same rates the cell injects. The
``[placement]`` table is the engine's (docs/placement.md); the sweep fills ``profile``
(``smollm2-135m``), ``estimate = false`` and ``residency_hours`` (the cell's ``hours``) when
the table leaves them out (:func:`rkv.eval.sweep.spec.placement_table`), so the cell's key
names everything its plan depends on.

* **reliability**: a put of ``reliability.chunks`` chunks is planned and written by the engine;
  its records are grouped by their (bits, code) as stored (read from the record headers); each
  group runs the ordinary cell campaign of that (bits, code) through the real read path
  (:mod:`rkv.eval.sweep.cell_campaign`), and the store's per-block rates are the
  block-weighted mixture. Intervals combine the groups' Wilson intervals by MOVER (Zou &
  Donner 2008, "Construction of confidence limits about effect measures"), which reduces to
  the Wilson interval for one group.
* **quality**: every window's prefix is put through a planned engine (the real write path:
  the plan of that put) and read back under the cell's faults at its quality multiplier
  (:class:`PlannedRoundTrip`).
* **cost**: the cost put of :func:`rkv.eval.sweep.cells.cost` with the planned engine.
"""

from __future__ import annotations

import math
import shutil
import tempfile
import zlib
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rkv.eval.sweep.cell_campaign import finite, sub_seed
from rkv.eval.sweep.cell_campaign import reliability as class_reliability
from rkv.format.model import ModelSpec
from rkv.store.config import EngineConfig, TierConfig

OUTCOMES = ("clean", "masked", "corrected", "degraded", "due", "sdc")


def smollm2_fp16() -> ModelSpec:
    """The spec planned cells store under: SmolLM2-135M's KV shape, fp16."""
    from rkv.eval.quality import SMOLLM2_ID

    return ModelSpec(SMOLLM2_ID, n_layers=30, n_kv_heads=3, head_dim=64, dtype="float16")


def fault_model(cell: Mapping[str, Any]) -> Any:
    """The cell's fault model, accelerated by its multiplier."""
    import faultmodels

    base = faultmodels.get_model({"preset": cell["preset"], **cell["params"]})
    return faultmodels.accelerate(base, cell["ber_multiplier"])


def engine_config(cell: Mapping[str, Any], root: Path) -> EngineConfig:
    """One memory tier under ``root`` whose fault model (written to a TOML file there, since
    a tier names its model by preset or path) is the cell's; the cell's placement table."""
    import faultmodels

    root.mkdir(parents=True, exist_ok=True)
    path = root / "fault-model.toml"
    faultmodels.dump(fault_model(cell), path)
    tier = TierConfig("t0", medium="memory", path=str(root / "t0"), capacity_bytes=1 << 40,
                      fault_model=str(path))
    return EngineConfig(chunk_tokens=cell["layout"]["chunk_tokens"], tiers=(tier,),
                        repair=False, placement=dict(cell["placement"]))


def stored_classes(engine: Any, spec: ModelSpec, tokens: list[int], chunk_tokens: int
                   ) -> Counter[tuple[int, str]]:
    """(bits, code spec) of every stored block of ``tokens``, as its record header says."""
    from rkv.codec.stages import header_stages
    from rkv.format.keys import as_token_array, block_key, chunk_keys
    from rkv.format.record import decode_record

    tier = next(iter(engine.tiers.values()))
    out: Counter[tuple[int, str]] = Counter()
    for key in chunk_keys(as_token_array(tokens), spec.fingerprint(), chunk_tokens):
        for layer in range(spec.n_layers):
            rec = tier.get(block_key(key, layer))
            if rec is None:
                raise RuntimeError(f"planned cell: layer {layer} of a chunk was not stored")
            quant, codec = header_stages(decode_record(bytes(rec)).header)
            out[(16 if quant is None else int(quant.bits),
                 "none" if codec is None else str(codec.spec))] += 1
    return out


def synthetic_kv(spec: ModelSpec, n_tokens: int, seed: int) -> np.ndarray:
    """Gaussian fp16 KV of the spec's shape (plans do not depend on the values)."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((spec.n_layers, 2, n_tokens, spec.n_kv_heads, spec.head_dim)
                               ).astype(np.float16)


def plan_classes(cell: Mapping[str, Any], chunks: int, seed: int) -> Counter[tuple[int, str]]:
    """The (bits, code) mix the engine writes for a put of ``chunks`` chunks."""
    from rkv.store.engine import Engine

    spec = smollm2_fp16()
    n = chunks * cell["layout"]["chunk_tokens"]
    root = Path(tempfile.mkdtemp(prefix="rkv-sweep-plan-"))
    try:
        with Engine.open(root / "store", engine_config(cell, root)) as e:
            tokens = list(range(n))
            e.put(tokens, synthetic_kv(spec, n, seed), model=spec)
            return stored_classes(e, spec, tokens, cell["layout"]["chunk_tokens"])
    finally:
        shutil.rmtree(root, ignore_errors=True)


def mover(parts: list[tuple[float, float, float, float]]) -> tuple[float, float, float]:
    """The weighted sum of independent rates, each ``(weight, rate, lo, hi)``, with its MOVER
    interval: ``r -+ sqrt(sum w^2 (r_i - lo_i)^2)`` / ``sqrt(sum w^2 (hi_i - r_i)^2)``."""
    r = math.fsum(w * x for w, x, _, _ in parts)
    lo = r - math.sqrt(math.fsum((w * (x - a)) ** 2 for w, x, a, _ in parts))
    hi = r + math.sqrt(math.fsum((w * (b - x)) ** 2 for w, x, _, b in parts))
    return r, max(0.0, lo), hi


def reliability(cell: Mapping[str, Any]) -> dict[str, Any]:
    """The planned store's per-block outcome rates (see the module docstring)."""
    rel = cell["settings"]["reliability"]
    classes = plan_classes(cell, rel["chunks"], sub_seed(cell["seed"], 3))
    total = sum(classes.values())
    rows = []
    for i, ((bits, code), n) in enumerate(sorted(classes.items())):
        sub = {**cell, "bits": bits, "code": code, "placement": None,
               "layout": {**cell["layout"], "planes": None},
               "seed": sub_seed(cell["seed"], 4, i)}
        rows.append((n / total, bits, code, n, class_reliability(sub)))
    rates = {}
    for o in OUTCOMES:
        got = [(w, r["rates"][o]) for w, *_, r in rows if o in r["rates"]]
        if got:
            rate, lo, hi = mover([(w, x["rate"], x["lo"], x["hi"]) for w, x in got])
            rates[o] = {"n": sum(int(x["n"]) for _, x in got), "rate": rate,
                        "lo": min(lo, rate), "hi": max(hi, rate)}
    analytic: dict[str, float | None] = {}
    for k in ("p_due", "p_sdc", "p_corrected", "p_degraded"):
        vals = [(w, r["analytic"][k]) for w, *_, r in rows]
        analytic[k] = (None if any(v is None for _, v in vals)
                       else finite(math.fsum(w * float(v) for w, v in vals)))
    first = rows[0][4]
    return {"blocks": sum(r["blocks"] for *_, r in rows), "trials": first["trials"],
            "sampling": ",".join(sorted({r["sampling"] for *_, r in rows})),
            "p_any_error": finite(math.fsum(w * r["p_any_error"] for w, *_, r in rows)),
            "rates": rates, "analytic": analytic,
            "plan": [{"bits": b, "code": c, "blocks": n, "fraction": w}
                     for w, b, c, n, _ in rows]}


class PlannedRoundTrip:
    """A quality transform: each window's KV (cast to fp16) put through a planned engine
    (planned for the cell's accelerated model), corrupted by the cell's model over its hours
    at ``ber_multiplier`` (default: the cell's), read back verified, cast back. Seeded by the
    cell's seed and the window's tokens, as :class:`rkv.eval.quality.RkvRoundTrip`. ``stats``
    adds up the reports (``faulted_blocks``: blocks that met a fault) and the stored (bits,
    code) mix."""

    def __init__(self, cell: Mapping[str, Any], ber_multiplier: float | None = None) -> None:
        import faultmodels

        self.cell = dict(cell)
        # The plan is made for the cell's own rates (as its reliability and cost are); the
        # quality windows may inject at another multiplier (quality.ber_multiplier).
        self.model = fault_model(cell) if ber_multiplier is None else faultmodels.accelerate(
            faultmodels.get_model({"preset": cell["preset"], **cell["params"]}),
            ber_multiplier)
        self.spec = smollm2_fp16()
        self.stats: dict[str, int] = {}
        self.classes: Counter[tuple[int, str]] = Counter()

    def __call__(self, kv: np.ndarray, tokens: list[int]) -> tuple[np.ndarray | None,
                                                                    dict[str, int]]:
        from rkv.eval.faults.harness import Harness

        chunk = self.cell["layout"]["chunk_tokens"]
        root = Path(tempfile.mkdtemp(prefix="rkv-sweep-planned-"))
        try:
            cfg = engine_config(self.cell, root)
            with Harness(root, cfg.tiers[0], chunk_tokens=chunk, seed=self.cell["seed"],
                         placement=cfg.placement) as h:
                h.put(tokens, kv.astype(np.float16), self.spec)
                assert h.engine is not None
                self.classes.update(stored_classes(h.engine, self.spec, tokens, chunk))
                digest = zlib.crc32(np.asarray(tokens, dtype=np.uint32).tobytes())
                injected = h.inject_model(self.model, self.cell["hours"],
                                          np.random.default_rng([self.cell["seed"], digest]))
                got = h.read(tokens, self.spec)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        report = {k: v for k, v in got.report().items() if v}
        faulted = sum(not i.empty for i in injected)
        if faulted:
            report["faulted_blocks"] = faulted
        for k, v in report.items():
            self.stats[k] = self.stats.get(k, 0) + v
        return (got.kv.astype(kv.dtype) if got.n_tokens else None), report
