"""Conversion between caller tensors (numpy or torch) and the numpy arrays rkv stores.

torch is never imported here unless the caller passes a torch tensor or asks for one.
bfloat16 is represented in numpy with ``ml_dtypes.bfloat16``.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from rkv.errors import ShapeError
from rkv.model import ModelSpec

_NP_DTYPES: dict[str, np.dtype[Any]] = {
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float32": np.dtype(np.float32),
}


def numpy_dtype(name: str) -> np.dtype[Any]:
    return _NP_DTYPES[name]


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "detach")


def _torch_to_numpy(t: Any) -> np.ndarray:
    import torch

    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)  # type: ignore[no-any-return]
    return t.numpy()  # type: ignore[no-any-return]


def as_kv_array(kv: Any, spec: ModelSpec, n_tokens: int) -> np.ndarray:
    """Check ``kv`` against the model and return it as a numpy array (no copy if possible).

    ``kv`` is shaped ``[layers, 2, tokens, kv_heads, head_dim]`` with the model's dtype.
    """
    arr = _torch_to_numpy(kv) if _is_torch(kv) else kv
    if not isinstance(arr, np.ndarray):
        raise ShapeError(f"kv must be a numpy array or torch tensor, got {type(kv).__name__}")
    want = (spec.n_layers, 2, n_tokens, spec.n_kv_heads, spec.head_dim)
    if arr.shape != want:
        raise ShapeError(
            f"kv has shape {tuple(arr.shape)}, expected {want} "
            "([layers, 2, tokens, kv_heads, head_dim] for this model and token count)"
        )
    if arr.dtype != _NP_DTYPES[spec.dtype]:
        raise ShapeError(f"kv has dtype {arr.dtype}, the model spec says {spec.dtype}")
    return arr


def to_output(arr: np.ndarray, dtype: str, as_torch: bool) -> Any:
    if not as_torch:
        return arr
    import torch

    if dtype == "bfloat16":
        return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(arr)
