"""rkv as the prefix cache of a Hugging Face causal LM (transformers is imported only here).

After a prefill the prompt's KV is stored by chunk; a later prompt that shares a prefix
restores the stored KV from rkv and prefills only the rest::

    cache = HFPrefixCache(engine, model, model_id="SmolLM2-135M-Instruct")
    out = cache.prefill(input_ids)        # restores what rkv has, computes the rest, stores
    out.logits, out.restored_tokens, out.seconds

Keys are stored after RoPE, exactly as the model's ``DynamicCache`` holds them
(``layout="hf-dynamic-cache"`` in the model fingerprint), as ``[layers, 2, tokens, kv_heads,
head_dim]`` in the cache's dtype; restoring them and continuing gives the logits a full prefill
gives (tested).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from rkv.engine import Engine, GetResult
from rkv.errors import ShapeError
from rkv.model import ModelSpec

_DTYPES = {"torch.float16": "float16", "torch.bfloat16": "bfloat16", "torch.float32": "float32"}


def model_spec(model: Any, model_id: str, *, revision: str = "", dtype: str | None = None
               ) -> ModelSpec:
    """The rkv model spec of a transformers causal LM (its KV layout and dtype)."""
    cfg = model.config
    heads = int(cfg.num_attention_heads)
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
    kv_dtype = dtype or _DTYPES.get(str(model.dtype), "float32")
    return ModelSpec(model_id, n_layers=int(cfg.num_hidden_layers),
                     n_kv_heads=int(getattr(cfg, "num_key_value_heads", heads)),
                     head_dim=head_dim, dtype=kv_dtype, revision=revision,
                     layout="hf-dynamic-cache")


def kv_from_cache(cache: Any) -> np.ndarray:
    """``[layers, 2, tokens, kv_heads, head_dim]`` from a batch-1 ``DynamicCache``."""
    import torch

    layers = cache.layers
    k0 = layers[0].keys
    if k0.shape[0] != 1:
        raise ShapeError("only batch size 1 caches can be stored")
    stacked = torch.stack([torch.stack([la.keys[0], la.values[0]]) for la in layers])
    # [L, 2, heads, T, D] -> [L, 2, T, heads, D]
    out = stacked.permute(0, 1, 3, 2, 4).contiguous()
    if out.dtype == torch.bfloat16:
        import ml_dtypes

        return out.view(torch.int16).numpy().view(ml_dtypes.bfloat16)  # type: ignore[no-any-return]
    return out.numpy()  # type: ignore[no-any-return]


def cache_from_kv(kv: np.ndarray, config: Any = None) -> Any:
    """A ``DynamicCache`` holding ``kv`` (``[layers, 2, tokens, kv_heads, head_dim]``)."""
    import torch
    from transformers import DynamicCache

    cache = DynamicCache(config=config) if config is not None else DynamicCache()
    if kv.dtype.name == "bfloat16":
        t = torch.from_numpy(np.ascontiguousarray(kv).view(np.int16)).view(torch.bfloat16)
    else:
        t = torch.from_numpy(np.ascontiguousarray(kv))
    t = t.permute(0, 1, 3, 2, 4)  # -> [L, 2, heads, T, D]
    for layer in range(t.shape[0]):
        cache.update(t[layer, 0].unsqueeze(0).contiguous(), t[layer, 1].unsqueeze(0).contiguous(),
                     layer)
    return cache


@dataclass(frozen=True)
class PrefillResult:
    logits: Any                 # [1, new tokens, vocab] for the tokens that were computed
    cache: Any                  # the full DynamicCache after the prefill
    restored_tokens: int        # prompt tokens whose KV came from rkv
    computed_tokens: int
    seconds: float
    read: GetResult | None      # rkv's per-block report of the restore (None: nothing restored)


class HFPrefixCache:
    """Restore-then-prefill for a transformers causal LM, with rkv as the KV store."""

    def __init__(self, engine: Engine, model: Any, *, model_id: str, revision: str = "",
                 store: bool = True) -> None:
        self.engine = engine
        self.model = model
        self.spec = model_spec(model, model_id, revision=revision)
        self.store = store

    def prefill(self, input_ids: Any, *, stream: bool = False) -> PrefillResult:
        """Prefill ``input_ids`` (``[1, T]`` tensor or a list of ints) reusing stored KV.
        ``stream``: restore layer by layer while the model runs (:meth:`Engine.get_layers`,
        :mod:`rkv.adapters.hf_stream`), so loading overlaps the prefill; a layer that turns
        out shorter than the stored prefix (a lost block) falls back to a full restore."""
        import torch

        ids = torch.as_tensor(input_ids).reshape(1, -1)
        tokens = ids[0].tolist()
        if not tokens:
            raise ShapeError("empty prompt")
        t0 = time.perf_counter()
        if stream and len(tokens) > 1:
            got = self._prefill_streamed(ids, tokens, t0)
            if got is not None:
                return got
        # Keep at least one token to compute: the model must produce the next-token logits.
        read = self.engine.get(tokens[:-1], model=self.spec) if len(tokens) > 1 else None
        restored = read.n_tokens if read is not None else 0
        cache = cache_from_kv(read.kv, self.model.config) if restored and read else None
        with torch.no_grad():
            out = self.model(ids[:, restored:], cache=cache, use_cache=True)
        cache = out.past_key_values
        seconds = time.perf_counter() - t0
        if self.store:
            self.engine.put(tokens, kv_from_cache(cache), model=self.spec)
        return PrefillResult(out.logits, cache, restored, len(tokens) - restored, seconds,
                             read if restored else None)

    def _prefill_streamed(self, ids: Any, tokens: list[int], t0: float
                          ) -> PrefillResult | None:
        """The streamed restore (None: fall back to a full one)."""
        import torch

        from rkv.adapters.hf_stream import streamed_cache

        with self.engine.get_layers(tokens[:-1], model=self.spec) as st:
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
                cache = streamed_cache(self.model.config, self.spec.n_layers, pull)
                with torch.no_grad():
                    out = self.model(ids[:, restored:], cache=cache, use_cache=True)
                cache.finish()
                for _ in layers:        # the end of the stream applies its bookkeeping
                    pass
            except _Shrunk:
                return None
        seconds = time.perf_counter() - t0
        cache = out.past_key_values
        if self.store:
            self.engine.put(tokens, kv_from_cache(cache), model=self.spec)
        read = GetResult(restored, None, list(st.blocks), st.stored_tokens)
        return PrefillResult(out.logits, cache, restored, len(tokens) - restored, seconds, read)


class _Shrunk(Exception):
    """A streamed layer verified fewer tokens than the prefill assumed."""
