"""Conversion between caller tensors (numpy or torch) and the numpy arrays rkv stores.

torch is never imported here unless the caller passes a torch tensor or asks for one.
bfloat16 is represented in numpy with ``ml_dtypes.bfloat16``.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from rkv.errors import ShapeError
from rkv.format.dtypes import numpy_dtype
from rkv.format.model import ModelSpec


def _is_torch(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _check(shape: tuple[int, ...], dtype: str, want: tuple[int, ...], spec: ModelSpec) -> None:
    shape = tuple(shape)
    if shape != want:
        raise ShapeError(
            f"kv has shape {shape}, expected {want} "
            "([layers, 2, tokens, kv_heads, head_dim] for this model and token count)"
        )
    if dtype != spec.dtype:
        raise ShapeError(f"kv has dtype {dtype}, the model spec says {spec.dtype}")


def _torch_to_numpy(t: Any, spec: ModelSpec, want: tuple[int, ...]) -> np.ndarray:
    """Check a torch tensor before any copy, then view (or copy) it as a CPU numpy array."""
    import torch

    if t.layout != torch.strided:
        raise ShapeError(f"kv must be a dense tensor, got layout {t.layout}")
    _check(t.shape, str(t.dtype).removeprefix("torch."), want, spec)
    if t.device.type == "meta":
        raise ShapeError("kv is a tensor on the 'meta' device: it holds no data")
    try:
        t = t.detach().resolve_conj().resolve_neg()
        if t.device.type != "cpu":
            t = t.cpu()
        if t.dtype == torch.bfloat16:
            bits = t.contiguous().view(torch.int16).numpy()
            return bits.view(numpy_dtype("bfloat16"))  # type: ignore[no-any-return]
        return t.numpy()  # type: ignore[no-any-return]
    except (RuntimeError, TypeError, ValueError, NotImplementedError) as exc:
        raise ShapeError(f"kv tensor cannot be read as a CPU array: {exc}") from exc


def as_kv_array(kv: Any, spec: ModelSpec, n_tokens: int) -> np.ndarray:
    """Check ``kv`` against the model and return it as a C-contiguous numpy array.

    ``kv`` is a numpy array or torch tensor shaped ``[layers, 2, tokens, kv_heads,
    head_dim]`` with the model's dtype; it is copied only when not already C-contiguous
    on the CPU. Anything else raises :class:`ShapeError`.
    """
    want = (spec.n_layers, 2, n_tokens, spec.n_kv_heads, spec.head_dim)
    if _is_torch(kv):
        arr = _torch_to_numpy(kv, spec, want)
    elif isinstance(kv, np.ndarray) and not isinstance(kv, np.ma.MaskedArray):
        arr = kv
        name = spec.dtype if arr.dtype == numpy_dtype(spec.dtype) else str(arr.dtype)
        _check(arr.shape, name, want, spec)
    else:
        raise ShapeError(f"kv must be a numpy array or torch tensor, got {type(kv).__name__}")
    return np.ascontiguousarray(arr)


def to_output(arr: np.ndarray, dtype: str, as_torch: bool) -> Any:
    if not as_torch:
        return arr
    import torch

    if dtype == "bfloat16":
        return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(arr)
