"""KV conversions between a Hugging Face ``DynamicCache`` (or a torch tensor) and rkv's
``[layers, 2, tokens, kv_heads, head_dim]`` arrays (torch and transformers are imported only
when a conversion runs).

A layout conversion like :mod:`rkv.format.tensors`'s, so it sits with the formats, below
both of its users: the Hugging Face adapter (:mod:`rkv.adapters.hf`, ``hf_generate``,
``hf_stream``) and the quality and calibration runs in :mod:`rkv.eval`, which take a
model's KV apart without the adapter.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["as_torch_kv", "cache_from_kv", "kv_from_cache", "kv_tensor"]


def kv_tensor(cache: Any, *, row: int = 0, start: int = 0, stop: int | None = None,
              dtype: str | None = None) -> Any:
    """``[layers, 2, tokens, kv_heads, head_dim]`` torch tensor of one row of a
    ``DynamicCache`` (positions ``start:stop``), converted to ``dtype`` if given."""
    import torch

    layers = cache.layers
    stacked = torch.stack([torch.stack([la.keys[row, :, start:stop],
                                        la.values[row, :, start:stop]]) for la in layers])
    out = stacked.permute(0, 1, 3, 2, 4)          # [L, 2, heads, T, D] -> [L, 2, T, heads, D]
    if dtype is not None:
        out = out.to(getattr(torch, dtype))
    return out.contiguous()


def kv_from_cache(cache: Any, *, row: int = 0, start: int = 0, stop: int | None = None,
                  dtype: str | None = None) -> np.ndarray:
    """:func:`kv_tensor` as a numpy array (bfloat16 as ``ml_dtypes.bfloat16``)."""
    import torch

    out = kv_tensor(cache, row=row, start=start, stop=stop, dtype=dtype)
    if out.dtype == torch.bfloat16:
        import ml_dtypes

        return out.view(torch.int16).numpy().view(ml_dtypes.bfloat16)  # type: ignore[no-any-return]
    return out.numpy()  # type: ignore[no-any-return]


def as_torch_kv(kv: Any, dtype: Any = None) -> Any:
    """A numpy (bfloat16 included) or torch KV array as a torch tensor in ``dtype``."""
    import torch

    if isinstance(kv, np.ndarray):
        a = np.ascontiguousarray(kv)
        kv = (torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
              if a.dtype.name == "bfloat16" else torch.from_numpy(a))
    return kv if dtype is None or kv.dtype == dtype else kv.to(dtype)


def cache_from_kv(kv: Any, config: Any = None, *, dtype: Any = None, device: Any = None
                  ) -> Any:
    """A batch-1 ``DynamicCache`` holding ``kv`` (``[layers, 2, tokens, kv_heads, head_dim]``,
    numpy or torch), converted to the torch ``dtype`` and moved to ``device`` if given."""
    from transformers import DynamicCache

    cache = DynamicCache(config=config) if config is not None else DynamicCache()
    t = as_torch_kv(kv, dtype)
    if device is not None:
        t = t.to(device)
    t = t.permute(0, 1, 3, 2, 4)  # -> [L, 2, heads, T, D]
    for layer in range(t.shape[0]):
        cache.update(t[layer, 0].unsqueeze(0).contiguous(), t[layer, 1].unsqueeze(0).contiguous(),
                     layer)
    return cache
