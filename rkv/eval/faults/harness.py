"""The one fault-injection harness: store KV, corrupt the stored records, read them back.

Campaigns (:mod:`rkv.eval.faults.bench`), quality runs (:class:`rkv.eval.quality.RkvRoundTrip`,
:func:`rkv.eval.quality.raw_model_faults`) and sweeps all inject here, so a fault drawn for a
record means the same thing everywhere:

* a :class:`Harness` holds one tier: a real :class:`~rkv.store.engine.Engine` whose only tier has
  the given quantizer and code (byte planes included), or, for the ``raw`` baseline, the bare
  values (quantized if asked) in the same kind of LMDB tier, as peers store them;
* :meth:`Harness.draw` draws a record's pattern from a ``faultmodels`` model (direct,
  conditioned on a fault, or importance-sampled); :meth:`Harness.inject` applies it at the
  tier boundary (persistent media errors rewrite the record, transient link errors corrupt
  the next read only, erasures are reported by the medium, lost records read as absent);
* :meth:`Harness.read` reads a prefix back through the real read path (raw: unverified, up
  to the first block the medium reports) and :meth:`Harness.classify` turns a one-block read
  into the campaign's outcome: clean, masked, corrected, degraded, DUE or SDC.

Every draw comes from the caller's generator and every injection is logged, so a run is a
pure function of its seed.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rkv.errors import MediumError, RkvError
from rkv.format.dtypes import numpy_dtype
from rkv.format.keys import as_token_array, block_key, chunk_bounds, chunk_keys
from rkv.format.model import ModelSpec
from rkv.store.config import EngineConfig, TierConfig
from rkv.store.engine import Engine
from rkv.tiers import LmdbTier, TierSpec
from rkv.tiers.faulty import FaultyTier, Injection

__all__ = ["OUTCOMES", "Harness", "Readback", "kv_spec"]

#: What one block's read can turn out to be (campaign outcomes).
OUTCOMES = ("clean", "masked", "corrected", "degraded", "due", "sdc")
#: Block statuses that end the verified prefix.
LOST = ("uncorrectable", "missing")


def kv_spec(kv: np.ndarray, name: str = "harness/kv") -> ModelSpec:
    """The model spec of a KV array ``[layers, 2, tokens, kv_heads, head_dim]``."""
    return ModelSpec(name, n_layers=kv.shape[0], n_kv_heads=kv.shape[3],
                     head_dim=kv.shape[4], dtype=kv.dtype.name)


@dataclass
class Readback:
    """What a read returned for a prefix of ``asked`` tokens: the KV of the first
    ``n_tokens`` (verified by rkv; for raw storage, what the medium did not report), one
    status per block read (``ok``, ``corrected``, ``degraded``, ``uncorrectable``,
    ``missing``) and the symbols or bits the codes corrected."""

    asked: int
    n_tokens: int
    kv: np.ndarray
    statuses: list[str] = field(default_factory=list)
    corrected: int = 0

    @property
    def due_blocks(self) -> int:
        """Blocks the read reported unusable (the prefix stops at the first)."""
        return sum(s in LOST for s in self.statuses)

    @property
    def recompute_tokens(self) -> int:
        """Tokens past the verified prefix: what a serving engine recomputes."""
        return self.asked - self.n_tokens

    def report(self) -> dict[str, int]:
        """Counts for quality tables: statuses seen, corrected symbols, DUE blocks and the
        tokens to recompute."""
        out: dict[str, int] = {}
        for s in self.statuses:
            out[s] = out.get(s, 0) + 1
        out["corrected_symbols"] = self.corrected
        out["due_blocks"] = self.due_blocks
        out["recomputed_tokens"] = self.recompute_tokens
        return out


class Harness:
    """A store with one fault-injecting tier (``tier``), or raw storage when ``raw``.

    ``root`` is a directory the harness may fill; :meth:`temporary` makes and removes one.
    ``seed`` seeds the tier's own generator (the random bytes of erasures) until a caller
    sets :attr:`rng` per trial. ``placement`` (an engine ``[placement]`` table) lets the
    engine plan each block's bits and code from the tier's fault model instead of using the
    tier's ``quant`` and ``ecc``.
    """

    def __init__(self, root: Path, tier: TierConfig, *, chunk_tokens: int = 256,
                 raw: bool = False, seed: int = 0,
                 placement: Mapping[str, Any] | None = None) -> None:
        from rkv.codec.stages import quantizer_for

        self.root = Path(root)
        self.chunk_tokens = chunk_tokens
        self.raw = raw
        self.quant = quantizer_for(tier.quant)
        self._owned = False
        if raw:
            if placement:
                raise ValueError("raw storage has no placement plan")
            self.tier = FaultyTier(LmdbTier(
                TierSpec(tier.name, tier.capacity_bytes, tier.map_bytes, tier.sync),
                self.root / "raw"), seed=seed)
            self.engine: Engine | None = None
        else:
            cfg = EngineConfig(chunk_tokens=chunk_tokens, tiers=(tier,), repair=False,
                               placement=dict(placement or {}))
            self.engine = Engine.open(self.root / "store", cfg)
            faulty = self.engine.wrap_tier(tier.name, lambda t: FaultyTier(t, seed=seed))
            assert isinstance(faulty, FaultyTier)
            self.tier = faulty

    @classmethod
    def temporary(cls, *, quant: str = "none", ecc: str = "none", chunk_tokens: int = 256,
                  raw: bool = False, seed: int = 0) -> Harness:
        """A harness in a fresh temporary directory (removed by :meth:`close`) whose only
        tier is in memory and has ``quant`` and ``ecc`` (any codec spec, byte planes too)."""
        root = Path(tempfile.mkdtemp(prefix="rkv-harness-"))
        tier = TierConfig("t0", medium="memory", path=str(root / "t0"),
                          capacity_bytes=1 << 40, ecc=ecc, quant=quant)
        try:
            h = cls(root, tier, chunk_tokens=chunk_tokens, raw=raw, seed=seed)
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
        h._owned = True
        return h

    @property
    def rng(self) -> np.random.Generator:
        return self.tier.rng

    @rng.setter
    def rng(self, rng: np.random.Generator) -> None:
        self.tier.rng = rng

    def close(self) -> None:
        try:
            if self.engine is not None:
                self.engine.close()
            else:
                self.tier.close()
        finally:
            if self._owned:
                shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Harness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def clear(self) -> None:
        """Forget every record and its damage (the next trial starts empty)."""
        if self.engine is not None:
            self.engine.clear()
        else:
            self.tier.clear()

    # -- writing ------------------------------------------------------------------------------
    def keys(self, tokens: Any, spec: ModelSpec) -> list[list[bytes]]:
        """The block keys of ``tokens``: one list of layer keys per chunk."""
        chunks = chunk_keys(as_token_array(tokens), spec.fingerprint(), self.chunk_tokens)
        return [[block_key(c, layer) for layer in range(spec.n_layers)] for c in chunks]

    def put(self, tokens: Any, kv: np.ndarray, spec: ModelSpec) -> None:
        """Store ``kv`` (``[layers, 2, tokens, heads, dim]``) for ``tokens``: through the
        engine, or as each block's bare values for raw storage."""
        if self.engine is not None:
            self.engine.put(tokens, kv, model=spec)
            return
        self.put_raw(self._raw_items(tokens, kv, spec))

    def put_raw(self, items: list[tuple[bytes, np.ndarray]]) -> None:
        """Raw storage: write ``(key, block values [2, tokens, heads, dim])`` as peers do."""
        self.tier.put_many([(key, self.stored_bytes(block)) for key, block in items])

    def _raw_items(self, tokens: Any, kv: np.ndarray, spec: ModelSpec
                   ) -> list[tuple[bytes, np.ndarray]]:
        bounds = chunk_bounds(len(as_token_array(tokens)), self.chunk_tokens)
        return [(key, kv[layer, :, s:e])
                for (s, e), layer_keys in zip(bounds, self.keys(tokens, spec), strict=True)
                for layer, key in enumerate(layer_keys)]

    def stored_bytes(self, block: np.ndarray) -> np.ndarray:
        """What raw storage keeps for a block: its values, quantized if the tier says so."""
        if self.quant is None:
            return np.ascontiguousarray(block).view(np.uint8).reshape(-1)
        return np.frombuffer(self.quant.encode(block), dtype=np.uint8)

    def reference(self, block: np.ndarray) -> np.ndarray:
        """The fault-free decode of a block (``[2, tokens, heads, dim]``): the dequantized
        values for quantized tiers, not the values that went in."""
        if self.quant is None:
            return block
        return self.quant.decode(self.quant.encode(block), block.shape, block.dtype.name)

    # -- injecting ----------------------------------------------------------------------------
    def record_bytes(self, key: bytes) -> int:
        """Bytes of the stored record ``key`` (0 if absent)."""
        return len(self.tier.inner.get(key) or b"")

    @staticmethod
    def draw(model: Any, nbytes: int, hours: float, rng: np.random.Generator, *,
             conditional: bool = False, sampler: Any = None) -> tuple[Any, float | None]:
        """One record's pattern and its log importance weight (None unless ``sampler``, an
        :class:`rkv.eval.faults.importance.Sampler`, draws it): conditioned on a fault when
        ``conditional``, else as faults come."""
        if sampler is not None:
            pattern, log_w = sampler.draw(rng)
            return pattern, log_w
        if conditional:
            return model.sample_given_error(nbytes, hours, rng), None
        return model.sample(nbytes, hours, rng), None

    def inject(self, key: bytes, pattern: Any) -> Injection:
        """Apply ``pattern`` to record ``key``: persistently, or to the next read only when
        the pattern is transient (a link error; the stored record stays intact)."""
        if pattern.transient and not pattern.is_empty:
            self.tier.inject_transient(key, pattern)   # logged when the read applies it
            return Injection(key, self.record_bytes(key),
                             np.asarray(pattern.flips, dtype=np.int64),
                             tuple(pattern.erasures), False, True)
        return self.tier.inject(key, pattern)

    def inject_model(self, model: Any, hours: float, rng: np.random.Generator
                     ) -> list[Injection]:
        """Draw and inject ``model``'s faults over ``hours`` into every stored record, in
        key order, each as faults come (:meth:`draw`)."""
        out = []
        for key in list(self.tier.iter_keys()):
            pattern, _ = self.draw(model, self.record_bytes(key), hours, rng)
            out.append(self.inject(key, pattern))
        return out

    # -- reading ------------------------------------------------------------------------------
    def read(self, tokens: Any, spec: ModelSpec) -> Readback:
        """Read the prefix back: verified through the engine (stopping at the first chunk
        with an uncorrectable or missing block), or raw (stopping at the first block the
        medium reports lost or unreadable; anything else comes back as stored)."""
        n = len(as_token_array(tokens))
        if self.engine is not None:
            got = self.engine.get(tokens, model=spec)
            return Readback(n, got.n_tokens, np.asarray(got.kv),
                            [b.status for b in got.blocks], got.corrected)
        dtype = numpy_dtype(spec.dtype)
        out = np.empty((spec.n_layers, 2, n, spec.n_kv_heads, spec.head_dim), dtype)
        statuses: list[str] = []
        done = 0
        with self.tier.reader() as r:
            for (s, e), layer_keys in zip(chunk_bounds(n, self.chunk_tokens),
                                          self.keys(tokens, spec), strict=True):
                for layer, key in enumerate(layer_keys):
                    values = self._raw_block(r, key, (2, e - s, *out.shape[3:]), dtype)
                    if values is None:
                        statuses.append("uncorrectable")
                        return Readback(n, done, out[:, :, :done], statuses)
                    out[layer, :, s:e] = values
                    statuses.append("ok")
                done = e
        return Readback(n, done, out, statuses)

    def _raw_block(self, reader: Any, key: bytes, shape: tuple[int, ...], dtype: Any
                   ) -> np.ndarray | None:
        """A raw block's values as read, or None when the medium says it cannot read it."""
        try:
            view = reader.get(key)
        except MediumError:
            return None
        if view is None:
            return None
        data = bytes(view)
        if self.quant is None:
            if len(data) != int(np.prod(shape)) * np.dtype(dtype).itemsize:
                return None
            return np.frombuffer(data, dtype=dtype).reshape(shape)
        try:
            return self.quant.decode(data, shape, np.dtype(dtype).name)
        except RkvError:
            return None

    def _within_groups(self, got: Any, reference: np.ndarray) -> bool:
        """A degraded quantized block's promise (quantized planes): every value inside its
        KIVI group's range, judged on the fault-free decode (whose group minimum is the
        zero point and whose maximum the top code, up to the scale's rounding)."""
        from rkv.quant import KiviQuantizer
        from rkv.quant.kivi_groups import within_ranges

        q = self.quant
        if not isinstance(q, KiviQuantizer):
            return False
        return bool(within_ranges(np.asarray(got)[0], reference[0], q.group, q.bits,
                                  q.vbits).all())

    def classify(self, tokens: Any, spec: ModelSpec, reference: np.ndarray, inj: Injection
                 ) -> tuple[str, int]:
        """The outcome of reading back one block (one chunk of a one-layer model) whose
        fault-free decode is ``reference`` (``[1, 2, tokens, heads, dim]``), and the symbols
        corrected. Raw storage trusts what it reads unless the medium reports a loss."""
        clean = inj.empty
        if self.engine is None:
            if inj.lost or inj.erasures:
                return "due", 0      # the medium reports it: a peer sees a failed read
            key = block_key(chunk_keys(as_token_array(tokens), spec.fingerprint(),
                                       self.chunk_tokens)[0], 0)
            with self.tier.reader() as r:
                values = self._raw_block(r, key, reference.shape[1:], reference.dtype)
            if values is None:
                return "due", 0
            if np.array_equal(values.view(np.uint8), reference[0].view(np.uint8)):
                return ("clean" if clean else "masked"), 0
            return "sdc", 0
        got = self.engine.get(tokens, model=spec)
        if got.n_tokens != len(tokens):
            return "due", 0
        st = got.blocks[0]
        if st.status == "degraded":
            if self.quant is not None:
                return ("degraded", 0) if self._within_groups(got.kv, reference) \
                    else ("sdc", 0)
            # Bounded noise is the promise: the high half of every value must be exact.
            w = reference.dtype.itemsize
            hi = slice(w - w // 2, w)
            same_high = np.array_equal(got.kv.view(np.uint8).reshape(-1, w)[:, hi],
                                       reference.view(np.uint8).reshape(-1, w)[:, hi])
            return ("degraded", 0) if same_high else ("sdc", 0)
        if not np.array_equal(got.kv.view(np.uint8), reference.view(np.uint8)):
            return "sdc", 0
        if st.status == "corrected":
            return "corrected", st.corrected
        return ("clean" if clean else "masked"), 0
