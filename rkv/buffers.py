"""Byte-buffer views shared by the numba kernels of rkv.ecc and rkv.quant."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from rkv.errors import InputError

U8 = npt.NDArray[np.uint8]


def as_u8(data: Any) -> U8:
    """A read-only, 1-D, C-contiguous ``uint8`` view of ``data`` (copied only if it must be).

    Accepts ``bytes``, ``bytearray``, ``memoryview`` and any ``numpy`` array (its raw bytes).
    Every kernel receives arrays built by this function, so each kernel compiles once.
    """
    if isinstance(data, np.ndarray):
        arr = data
        if arr.dtype != np.uint8 or arr.ndim != 1 or not arr.flags.c_contiguous:
            arr = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
    elif isinstance(data, bytes | bytearray):
        arr = np.frombuffer(data, dtype=np.uint8)
    else:
        try:
            mv = memoryview(data)
        except TypeError as exc:
            raise InputError(f"expected a bytes-like object, got {type(data).__name__}") from exc
        if not mv.c_contiguous:
            arr = np.ascontiguousarray(np.asarray(mv)).reshape(-1).view(np.uint8)
        else:
            arr = np.frombuffer(mv.cast("B"), dtype=np.uint8)
    if arr.flags.writeable:
        arr = arr.view()
        arr.flags.writeable = False
    return arr


def readonly(arr: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """A read-only view of ``arr`` (kernels take read-only inputs only)."""
    if arr.flags.writeable:
        arr = arr.view()
        arr.flags.writeable = False
    return arr
