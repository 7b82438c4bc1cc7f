"""One worker's campaign trials: put real blocks through the engine, inject each block's
pattern at the tier boundary, read back through the real read path, classify. The storing,
injecting, reading and classifying are :mod:`rkv.eval.faults.harness`'s (shared with quality
runs and sweeps); this module draws a trial's blocks and keeps its rows.

:class:`_Bench` is reused across a worker's trials; :func:`_worker` runs a batch of trials in
a fresh store (in a worker process or in the caller's).
"""

from __future__ import annotations

import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rkv.eval.faults.campaign_types import CampaignConfig
from rkv.eval.faults.harness import OUTCOMES, Harness
from rkv.format.dtypes import numpy_dtype
from rkv.format.keys import as_token_array, block_key, chunk_keys
from rkv.reliability.protection import RAW

__all__ = ["OUTCOMES", "TrialResult"]


@dataclass
class TrialResult:
    trial: int
    seed: int
    outcomes: list[str]
    faults: list[dict[str, Any]]
    corrected_symbols: int = 0

    def row(self) -> dict[str, Any]:
        c = Counter(self.outcomes)
        return {"trial": self.trial, "seed": self.seed,
                **{o: c.get(o, 0) for o in OUTCOMES},
                "corrected_symbols": self.corrected_symbols, "blocks": self.faults}


# -- one worker's store --------------------------------------------------------------------
class _Bench:
    """A campaign's trials on one :class:`~rkv.eval.faults.harness.Harness`, reused across a
    worker's trials: blocks in, one pattern per record, read back, classified."""

    def __init__(self, cfg: CampaignConfig, root: Path) -> None:
        self.cfg = cfg
        self.model = cfg.model()
        self.spec = cfg.model_spec()
        self.harness = Harness(root, cfg.tier_config(), chunk_tokens=cfg.chunk_tokens,
                               raw=cfg.effective_protection() == RAW)
        self._samplers: dict[int, Any] = {}

    def close(self) -> None:
        self.harness.close()

    def run(self, trial: int, seed: int, conditional: bool,
            plan: dict[str, Any] | None = None) -> TrialResult:
        cfg, spec, h = self.cfg, self.spec, self.harness
        rng = np.random.default_rng(seed)
        h.rng = np.random.default_rng(rng.integers(1 << 63))
        dtype = numpy_dtype(cfg.dtype)
        shape = (1, 2, cfg.chunk_tokens, cfg.kv_heads, cfg.head_dim)
        fp = spec.fingerprint()
        items = []
        for _ in range(cfg.blocks):
            tokens = rng.integers(0, 1 << 31, cfg.chunk_tokens)
            kv = rng.standard_normal(shape, dtype=np.float32).astype(dtype)
            key = block_key(chunk_keys(as_token_array(tokens), fp, cfg.chunk_tokens)[0], 0)
            items.append((tokens, kv, key))
        if h.engine is not None:
            for tokens, kv, _ in items:
                h.put(tokens, kv, spec)
        else:
            h.put_raw([(key, kv[0]) for _, kv, key in items])
        # Outcomes compare with the fault-free decode: for quantized blocks, the dequantized
        # values, not the values that went in.
        items = [(tokens, h.reference(kv[0])[None], key) for tokens, kv, key in items]
        outcomes: list[str] = []
        faults: list[dict[str, Any]] = []
        corrected_total = 0
        for tokens, ref, key in items:
            nbytes = h.record_bytes(key)
            sampler = None if plan is None else self._sampler(nbytes, plan)
            pattern, log_w = h.draw(self.model, nbytes, cfg.hours, rng,
                                    conditional=conditional, sampler=sampler)
            inj = h.inject(key, pattern)
            outcome, corrected = h.classify(tokens, spec, ref, inj)
            faults.append({"outcome": outcome, "bytes": nbytes, "flips": int(inj.flips.size),
                           "erasures": [list(e) for e in inj.erasures], "lost": inj.lost,
                           "corrected": corrected})
            if log_w is not None:
                faults[-1]["log_weight"] = log_w
            outcomes.append(outcome)
            corrected_total += corrected
        h.clear()
        return TrialResult(trial, seed, outcomes, faults, corrected_total)

    def _sampler(self, nbytes: int, plan: dict[str, Any]) -> Any:
        from rkv.eval.faults.importance import Sampler, TiltPlan

        got = self._samplers
        if nbytes not in got:
            got[nbytes] = Sampler(self.model, nbytes, self.cfg.hours, TiltPlan.from_dict(plan))
        return got[nbytes]


def _worker(cfg_dict: dict[str, Any], trials: list[tuple[int, int]], conditional: bool,
            plan: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    cfg = CampaignConfig.from_dict(cfg_dict)
    root = Path(tempfile.mkdtemp(prefix="rkv-campaign-"))
    bench = _Bench(cfg, root)
    try:
        return [bench.run(t, s, conditional, plan).row() for t, s in trials]
    finally:
        bench.close()
        shutil.rmtree(root, ignore_errors=True)
