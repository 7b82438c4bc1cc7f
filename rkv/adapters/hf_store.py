"""What the Hugging Face adapter asks of the store (transformers is imported lazily).

- :func:`resolve_spec`: the :class:`~rkv.format.model.ModelSpec` a model's KV is stored under,
  checked against the model's config and against the specs the store already holds, so a
  model that does not match the store's KV is a :class:`~rkv.errors.ShapeError`, never a
  silent miss.
- :func:`stored_prefix`: the longest stored prefix of a prompt, *partial last chunk
  included*. The store keys whole chunks of ``chunk_tokens``; the trailing partial chunk of
  a stored sequence gets a key of its own that hashes its length, so a longer prompt (the
  next turn of a conversation) cannot find it by its own chunking. This function finds it:
  after the stored full chunks, it looks for the longest stored partial chunk whose tokens
  start the rest of the prompt.
"""

from __future__ import annotations

import operator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from rkv.errors import ShapeError
from rkv.format.model import KV_DTYPES, ModelSpec

if TYPE_CHECKING:
    from rkv.store.engine import Engine

#: The layout of KV as a ``DynamicCache`` holds it (keys after RoPE), in the fingerprint.
LAYOUT = "hf-dynamic-cache"


def model_dtype(model: Any) -> str:
    """The model's KV dtype by rkv's name (``float16``, ``bfloat16``, ``float32``)."""
    name = str(model.dtype).removeprefix("torch.")
    if name not in KV_DTYPES:
        raise ShapeError(f"the model computes in {name}; rkv stores KV as one of {KV_DTYPES} "
                         "(pass kv_dtype= to convert)")
    return name


def config_shape(model: Any) -> dict[str, int]:
    """``n_layers``, ``n_kv_heads`` and ``head_dim`` of a causal LM's KV cache."""
    cfg = model.config
    heads = int(cfg.num_attention_heads)
    return {"n_layers": int(cfg.num_hidden_layers),
            "n_kv_heads": int(getattr(cfg, "num_key_value_heads", None) or heads),
            "head_dim": int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)}


def spec_for(model: Any, model_id: str, *, revision: str, dtype: str) -> ModelSpec:
    """The spec of ``model``'s KV cache, read from its config."""
    shape = config_shape(model)
    return ModelSpec(model_id, n_layers=shape["n_layers"], n_kv_heads=shape["n_kv_heads"],
                     head_dim=shape["head_dim"], dtype=dtype, revision=revision, layout=LAYOUT)


def check_cache_layers(model: Any) -> None:
    """Only full-attention layers are stored: a sliding-window or linear-attention layer
    keeps part of the sequence (or a state), which a prefix restore cannot rebuild."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    cache = DynamicCache(config=model.config)
    odd = sorted({type(la).__name__ for la in cache.layers if type(la) is not DynamicLayer})
    if odd:
        raise ShapeError(f"the model's cache has {', '.join(odd)} layers: only full-attention "
                         "models (DynamicLayer) can use rkv as their prefix cache")


def resolve_spec(engine: Engine, model: Any, *, model_id: str | None, spec: ModelSpec | None,
                 revision: str, kv_dtype: str | None) -> ModelSpec:
    """The spec to store ``model``'s KV under.

    ``spec`` (the store's description of the model): the model's layers, KV heads and head
    size must equal it, its layout must be :data:`LAYOUT`; KV is converted to ``spec.dtype``.
    ``model_id``: the spec is read from the model's config, in ``kv_dtype`` (default: the
    model's dtype). If the store already holds KV of ``model_id`` at ``revision`` but none
    with this spec, the model is not the one that KV came from (other layers, heads or head
    size), or it computes in another dtype than was stored: an error, not a silent miss.
    """
    if (spec is None) == (model_id is None):
        raise ShapeError("give exactly one of model_id= (the spec is read from the model) "
                         "or spec= (the store's ModelSpec)")
    if kv_dtype is not None and kv_dtype not in KV_DTYPES:
        raise ShapeError(f"kv_dtype must be one of {KV_DTYPES}, got {kv_dtype!r}")
    check_cache_layers(model)
    shape = config_shape(model)
    if spec is not None:
        if not isinstance(spec, ModelSpec):
            raise ShapeError(f"spec must be a ModelSpec, got {type(spec).__name__}")
        if spec.layout != LAYOUT:
            raise ShapeError(f"spec has layout {spec.layout!r}: a DynamicCache's KV is stored "
                             f"as layout {LAYOUT!r}")
        if kv_dtype is not None and kv_dtype != spec.dtype:
            raise ShapeError(f"kv_dtype={kv_dtype!r} contradicts spec.dtype={spec.dtype!r}")
        _same_shape(spec, shape, f"the store's spec of {spec.model_id!r}")
        return spec
    assert model_id is not None
    ours = spec_for(model, model_id, revision=revision, dtype=kv_dtype or model_dtype(model))
    held = [s for s in stored_specs(engine) if (s.model_id, s.revision, s.layout)
            == (ours.model_id, ours.revision, ours.layout)]
    if held and ours not in held:
        # Specs that differ from ours only in the dtype: the same model, stored in another
        # dtype (fine when asked for with kv_dtype=). Any other difference in the fields we
        # set from the config means another model under this id.
        same = [s for s in held if replace(s, dtype=ours.dtype) == ours]
        if not same:
            _same_shape(held[0], shape, f"the KV stored for {model_id!r}"
                        + (f" (revision {revision!r})" if revision else ""))
        elif kv_dtype is None:
            have = sorted({s.dtype for s in same})
            raise ShapeError(
                f"the store holds KV of {model_id!r} as {'/'.join(have)}, this model computes "
                f"{ours.dtype}: pass kv_dtype={have[0]!r} to convert, or another revision")
    return ours


def _same_shape(spec: ModelSpec, shape: dict[str, int], what: str) -> None:
    diff = [f"{k}={getattr(spec, k)} (model: {v})" for k, v in shape.items()
            if getattr(spec, k) != v]
    if diff:
        raise ShapeError(f"this model does not match {what}: {', '.join(diff)}")


def stored_specs(engine: Engine) -> list[ModelSpec]:
    """The model specs the store holds KV under (damaged entries left out)."""
    return engine.models()


def stored_prefix(engine: Engine, tokens: Any, spec: ModelSpec) -> int:
    """Length of the longest stored prefix of ``tokens``, counting a stored partial chunk
    that continues the stored full chunks (not yet verified: a get does that;
    :mod:`rkv.store.prefix`)."""
    return engine.lookup(tokens, model=spec, partial=True)


def as_rows(input_ids: Any, attention_mask: Any = None) -> list[list[int]]:
    """The prompt of each row: a ``[B, T]`` tensor (with an optional 0/1 mask, left or right
    padding), a 1-D tensor, a list of ints or a list of such lists."""
    import torch

    if isinstance(input_ids, list | tuple) and input_ids and isinstance(input_ids[0],
                                                                         list | tuple):
        try:
            rows = [[operator.index(t) for t in r] for r in input_ids]
        except TypeError as exc:
            raise ShapeError(f"token ids must be integers: {exc}") from exc
        if attention_mask is not None:
            raise ShapeError("attention_mask goes with a [batch, tokens] tensor, not lists")
    else:
        ids = torch.as_tensor(input_ids)
        if ids.is_floating_point() and ids.numel():
            raise ShapeError(f"token ids must be integers, got {ids.dtype}")
        if ids.ndim == 1:
            ids = ids.unsqueeze(0)
        if ids.ndim != 2:
            raise ShapeError(f"input_ids must be [batch, tokens], got shape {tuple(ids.shape)}")
        if attention_mask is None:
            rows = ids.tolist()
        else:
            mask = torch.as_tensor(attention_mask)
            if mask.shape != ids.shape:
                raise ShapeError(f"attention_mask has shape {tuple(mask.shape)}, input_ids "
                                 f"{tuple(ids.shape)}")
            rows = []
            for r, m in zip(ids.tolist(), mask.tolist(), strict=True):
                on = np.flatnonzero(np.asarray(m))
                if len(on) and on[-1] - on[0] + 1 != len(on):
                    raise ShapeError("attention_mask has a gap inside a row: only left or "
                                     "right padding is supported")
                rows.append(r[on[0]:on[-1] + 1] if len(on) else [])
    if not rows or any(not r for r in rows):
        raise ShapeError("empty prompt")
    return rows
