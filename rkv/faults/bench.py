"""One worker's store for a campaign: put real blocks through the engine, inject each
block's pattern at the tier boundary, read back through the real read path, classify.

:class:`_Bench` is reused across a worker's trials; :func:`_worker` runs a batch of trials in
a fresh store (in a worker process or in the caller's).
"""

from __future__ import annotations

import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rkv.config import EngineConfig
from rkv.engine import Engine
from rkv.errors import RkvError
from rkv.faults.injection import FaultyTier, Injection
from rkv.faults.reliability import RAW
from rkv.keys import as_token_array, block_key, chunk_keys
from rkv.tensors import numpy_dtype
from rkv.tiers import LmdbTier, TierSpec

if TYPE_CHECKING:
    from rkv.faults.campaign import CampaignConfig

OUTCOMES = ("clean", "masked", "corrected", "degraded", "due", "sdc")


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
    """A store with one fault-injecting tier, reused across a worker's trials."""

    def __init__(self, cfg: CampaignConfig, root: Path) -> None:
        self.cfg = cfg
        self.model = cfg.model()
        self.spec = cfg.model_spec()
        self.protection = cfg.effective_protection()
        self.raw = self.protection == RAW
        from rkv.blockcodec import quantizer_for

        self.quant = quantizer_for(cfg.quant_spec())
        tier = cfg.tier_config()
        self.root = root
        self._samplers: dict[int, Any] = {}
        if self.raw:
            self.tier = FaultyTier(LmdbTier(
                TierSpec(tier.name, tier.capacity_bytes, tier.map_bytes, tier.sync), root / "raw"))
            self.engine: Engine | None = None
        else:
            ecfg = EngineConfig(chunk_tokens=cfg.chunk_tokens, tiers=(tier,), repair=False)
            self.engine = Engine.open(root / "store", ecfg)
            faulty = self.engine.wrap_tier(tier.name, lambda t: FaultyTier(t))
            assert isinstance(faulty, FaultyTier)
            self.tier = faulty

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
        else:
            self.tier.close()

    def run(self, trial: int, seed: int, conditional: bool,
            plan: dict[str, Any] | None = None) -> TrialResult:
        cfg, spec, model = self.cfg, self.spec, self.model
        rng = np.random.default_rng(seed)
        self.tier.rng = np.random.default_rng(rng.integers(1 << 63))
        dtype = numpy_dtype(cfg.dtype)
        shape = (1, 2, cfg.chunk_tokens, cfg.kv_heads, cfg.head_dim)
        fp = spec.fingerprint()
        items = []
        for _ in range(cfg.blocks):
            tokens = rng.integers(0, 1 << 31, cfg.chunk_tokens)
            kv = rng.standard_normal(shape, dtype=np.float32).astype(dtype)
            key = block_key(chunk_keys(as_token_array(tokens), fp, cfg.chunk_tokens)[0], 0)
            items.append((tokens, kv, key))
        if self.engine is not None:
            for tokens, kv, _ in items:
                self.engine.put(tokens, kv, model=spec)
        else:
            self.tier.put_many([(key, self._stored_bytes(kv)) for _, kv, key in items])
        # Outcomes compare with the fault-free decode: for quantized blocks, the dequantized
        # values, not the values that went in.
        items = [(tokens, self._reference(kv), key) for tokens, kv, key in items]
        outcomes: list[str] = []
        faults: list[dict[str, Any]] = []
        corrected_total = 0
        for tokens, kv, key in items:
            nbytes = len(self.tier.inner.get(key) or b"")
            log_w = None
            if plan is not None:
                pattern, log_w = self._sampler(nbytes, plan).draw(rng)
            else:
                pattern = (model.sample_given_error(nbytes, cfg.hours, rng) if conditional
                           else model.sample(nbytes, cfg.hours, rng))
            if pattern.transient and not pattern.is_empty:
                # A link error corrupts this read only; the stored record stays intact.
                self.tier.inject_transient(key, pattern)   # logged when the read applies it
                inj = Injection(key, nbytes, np.asarray(pattern.flips, dtype=np.int64),
                                tuple(pattern.erasures), False, True)
            else:
                inj = self.tier.inject(key, pattern)
            outcome, corrected = self._read(tokens, kv, key, inj.empty, bool(inj.erasures))
            faults.append({"outcome": outcome, "bytes": nbytes, "flips": int(inj.flips.size),
                           "erasures": [list(e) for e in inj.erasures], "lost": inj.lost,
                           "corrected": corrected})
            if log_w is not None:
                faults[-1]["log_weight"] = log_w
            outcomes.append(outcome)
            corrected_total += corrected
        if self.engine is not None:
            self.engine.clear()
        else:
            self.tier.clear()
        return TrialResult(trial, seed, outcomes, faults, corrected_total)

    def _sampler(self, nbytes: int, plan: dict[str, Any]) -> Any:
        from rkv.faults.importance import Sampler, TiltPlan

        got = self._samplers
        if nbytes not in got:
            got[nbytes] = Sampler(self.model, nbytes, self.cfg.hours, TiltPlan.from_dict(plan))
        return got[nbytes]

    def _stored_bytes(self, kv: np.ndarray) -> np.ndarray:
        """What raw storage keeps for a block: its values, quantized if the campaign says so."""
        if self.quant is None:
            return kv.view(np.uint8).reshape(-1)
        return np.frombuffer(self.quant.encode(kv[0]), dtype=np.uint8)

    def _reference(self, kv: np.ndarray) -> np.ndarray:
        if self.quant is None:
            return kv
        return self.quant.decode(self.quant.encode(kv[0]), kv.shape[1:], kv.dtype.name)[None]

    def _read(self, tokens: np.ndarray, kv: np.ndarray, key: bytes, clean: bool,
              erased: bool) -> tuple[str, int]:
        if self.engine is None:
            # What a peer does: read the bytes back, trust them unless the medium complains.
            if key in self.tier.lost or erased:
                return "due", 0
            with self.tier.reader() as r:
                view = r.get(key)
                data = None if view is None else bytes(view)
            if data is None:
                return "due", 0
            if self.quant is None:
                same = data == kv.view(np.uint8).tobytes()
            else:
                try:
                    values = self.quant.decode(data, kv.shape[1:], kv.dtype.name)
                except RkvError:
                    return "due", 0
                same = bool(np.array_equal(values.view(np.uint8), kv[0].view(np.uint8)))
            if same:
                return ("clean" if clean else "masked"), 0
            return "sdc", 0
        got = self.engine.get(tokens, model=self.spec)
        if got.n_tokens != len(tokens):
            return "due", 0
        st = got.blocks[0]
        if st.status == "degraded":
            # Bounded noise is the promise: the high half of every value must be exact.
            w = kv.dtype.itemsize
            hi = slice(w - w // 2, w)
            same_high = np.array_equal(got.kv.view(np.uint8).reshape(-1, w)[:, hi],
                                       kv.view(np.uint8).reshape(-1, w)[:, hi])
            return ("degraded", 0) if same_high else ("sdc", 0)
        if not np.array_equal(got.kv.view(np.uint8), kv.view(np.uint8)):
            return "sdc", 0
        if st.status == "corrected":
            return "corrected", st.corrected
        return ("clean" if clean else "masked"), 0


def _worker(cfg_dict: dict[str, Any], trials: list[tuple[int, int]], conditional: bool,
            plan: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    from rkv.faults.campaign import CampaignConfig

    cfg = CampaignConfig.from_dict(cfg_dict)
    root = Path(tempfile.mkdtemp(prefix="rkv-campaign-"))
    bench = _Bench(cfg, root)
    try:
        return [bench.run(t, s, conditional, plan).row() for t, s in trials]
    finally:
        bench.close()
        shutil.rmtree(root, ignore_errors=True)
