"""rkv as the persistent prefix cache of a Hugging Face causal LM (transformers is imported
only in the adapter modules).

``HFPrefixCache.generate`` is ``model.generate`` with rkv under it: the longest stored
prefix of the prompt is restored (verified), the rest prefilled, the usual generation
arguments honoured, and the KV of the prompt *and* of the generated tokens stored, so the
next turn of a conversation restores the model's own answer too::

    cache = HFPrefixCache(engine, model, model_id="SmolLM2-135M-Instruct")
    out = cache.generate(input_ids, max_new_tokens=32)
    out.sequences, out.rows[0].restored, out.ttft

``prefill`` restores and computes a prompt's logits without generating. Keys are stored after
RoPE, exactly as the model's ``DynamicCache`` holds them (``layout="hf-dynamic-cache"`` in the
model fingerprint), as ``[layers, 2, tokens, kv_heads, head_dim]`` in the spec's dtype.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from rkv.adapters.hf_generate import GenerateResult, generate
from rkv.adapters.hf_store import as_rows, model_dtype, resolve_spec, spec_for, stored_prefix
from rkv.adapters.hf_stream import streamed_cache
from rkv.errors import ShapeError
from rkv.format.hf_kv import as_torch_kv, cache_from_kv, kv_from_cache, kv_tensor
from rkv.format.model import ModelSpec
from rkv.store.engine import Engine, GetResult

#: The KV conversions are :mod:`rkv.format.hf_kv`'s, importable from here too.
__all__ = ["HFPrefixCache", "PrefillResult", "as_torch_kv", "cache_from_kv", "kv_from_cache",
           "kv_tensor", "model_spec"]


def model_spec(model: Any, model_id: str, *, revision: str = "", dtype: str | None = None
               ) -> ModelSpec:
    """The rkv model spec of a transformers causal LM (its KV layout and dtype)."""
    return spec_for(model, model_id, revision=revision, dtype=dtype or model_dtype(model))


@dataclass(frozen=True)
class PrefillResult:
    logits: Any                 # [1, new tokens, vocab] for the tokens that were computed
    cache: Any                  # the full DynamicCache after the prefill
    restored_tokens: int        # prompt tokens whose KV came from rkv
    computed_tokens: int
    seconds: float
    read: GetResult | None      # rkv's per-block report of the restore (None: nothing stored)


class HFPrefixCache:
    """rkv as the persistent prefix cache of a transformers causal LM.

    Give ``model_id`` (the spec is read from the model's config, in ``kv_dtype``, default
    the model's dtype) or ``spec`` (the store's :class:`ModelSpec`; KV is converted to its
    dtype). A model that does not match the KV the store holds under that id raises
    :class:`~rkv.errors.ShapeError` (see :func:`rkv.adapters.hf_store.resolve_spec`).
    ``store=False``: restore only, never write.
    """

    def __init__(self, engine: Engine, model: Any, *, model_id: str | None = None,
                 spec: ModelSpec | None = None, revision: str = "",
                 kv_dtype: str | None = None, store: bool = True) -> None:
        self.engine = engine
        self.model = model
        self.spec = resolve_spec(engine, model, model_id=model_id, spec=spec,
                                 revision=revision, kv_dtype=kv_dtype)
        self.store = store

    def stored_prefix(self, tokens: Any) -> int:
        """Tokens of ``tokens`` the store holds KV for (not verified; partial chunks count)."""
        return stored_prefix(self.engine, tokens, self.spec)

    def restore(self, tokens: list[int]) -> tuple[int, Any, GetResult | None]:
        """``(n, cache, read)``: the verified KV of the longest stored prefix of all but the
        last token (the model must compute at least one token to give the next-token logits)
        as a ``DynamicCache`` in the model's dtype (None when ``n`` is 0), and rkv's read
        report (None when nothing was stored). A block that fails verification ends the
        prefix at its chunk: the rest is recomputed."""
        m = stored_prefix(self.engine, tokens[:-1], self.spec) if len(tokens) > 1 else 0
        if not m:
            return 0, None, None
        read = self.engine.get(tokens[:m], model=self.spec, as_torch=True)
        n = read.n_tokens
        if not n:
            return 0, None, read
        return n, cache_from_kv(read.kv[:, :, :n], self.model.config,
                                dtype=self.model.dtype, device=self.model.device), read

    def put(self, items: list[tuple[list[int], Any]]) -> int:
        """Store ``(tokens, kv tensor in the model's dtype)`` items, converted to the spec's
        dtype, in one mutation; returns the tokens stored (0 with ``store=False``)."""
        if not self.store or not items:
            return 0
        import torch

        want = getattr(torch, self.spec.dtype)
        self.engine.put_many([(t, kv.to(want)) for t, kv in items], model=self.spec)
        return sum(len(t) for t, _ in items)

    def generate(self, input_ids: Any, attention_mask: Any = None, *, restore: bool = True,
                 **kwargs: Any) -> GenerateResult:
        """``model.generate`` with rkv as the prefix cache: see
        :func:`rkv.adapters.hf_generate.generate`. Returns a
        :class:`~rkv.adapters.hf_generate.GenerateResult`."""
        return generate(self, input_ids, attention_mask, restore=restore, **kwargs)

    def prefill(self, input_ids: Any, *, stream: bool = False) -> PrefillResult:
        """Prefill ``input_ids`` (``[1, T]`` tensor or a list of ints) reusing stored KV.
        ``stream``: restore layer by layer while the model runs (:meth:`Engine.get_layers`,
        :mod:`rkv.adapters.hf_stream`), so loading overlaps the prefill; a layer that turns
        out shorter than the stored prefix (a lost block) falls back to a full restore."""
        import torch

        rows = as_rows(input_ids)
        if len(rows) != 1:
            raise ShapeError(f"prefill takes one prompt, got {len(rows)} (generate takes many)")
        tokens = rows[0]
        ids = torch.tensor([tokens], device=self.model.device)
        t0 = time.perf_counter()
        if stream and len(tokens) > 1:
            got = self._prefill_streamed(ids, tokens, t0)
            if got is not None:
                return got
        restored, cache, read = self.restore(tokens)
        with torch.no_grad():
            out = self.model(ids[:, restored:], cache=cache, use_cache=True)
        cache = out.cache
        seconds = time.perf_counter() - t0
        self.put([(tokens, kv_tensor(cache))])
        return PrefillResult(out.logits, cache, restored, len(tokens) - restored, seconds, read)

    def _prefill_streamed(self, ids: Any, tokens: list[int], t0: float
                          ) -> PrefillResult | None:
        """The streamed restore (None: fall back to a full one)."""
        import torch

        m = stored_prefix(self.engine, tokens[:-1], self.spec)
        if not m:
            return None
        with self.engine.get_layers(tokens[:m], model=self.spec) as st:
            restored = st.n_tokens
            if not restored:
                return None
            layers = iter(st)

            def pull() -> tuple[int, np.ndarray]:
                lk = next(layers)
                if lk.n_tokens != restored:
                    raise _Shrunk
                return lk.layer, lk.kv

            try:
                cache = streamed_cache(self.model.config, self.spec.n_layers, pull,
                                       self.model.dtype, self.model.device)
                with torch.no_grad():
                    out = self.model(ids[:, restored:], cache=cache, use_cache=True)
                cache.finish()
                for _ in layers:        # the end of the stream applies its bookkeeping
                    pass
            except _Shrunk:
                return None
        seconds = time.perf_counter() - t0
        cache = out.cache
        self.put([(tokens, kv_tensor(cache))])
        read = GetResult(restored, None, list(st.blocks), st.stored_tokens)
        return PrefillResult(out.logits, cache, restored, len(tokens) - restored, seconds, read)


class _Shrunk(Exception):
    """A streamed layer verified fewer tokens than the prefill assumed."""
