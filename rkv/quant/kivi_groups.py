"""KIVI's quantization groups as arrays: every element's group minimum and maximum.

What a degraded read of a KIVI block (:mod:`rkv.ecc.qplanes`: verified metadata, codes as
read) is held to: each decoded value lies in its group's ``[z, z + (2^bits - 1) s]``, the
group's ``[min, max]`` up to the scale's rounding up to the dtype. The groups are those of
:mod:`rkv.quant.kivi`: keys per channel (``G`` consecutive tokens of one head and dim), values
per token (``min(G, head_dim)`` consecutive dims of one token and head); ragged last groups.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from rkv.quant.base import check_block

F64 = npt.NDArray[np.float64]


def _ranges(x: F64, axis: int, g: int) -> tuple[F64, F64]:
    n = x.shape[axis]
    pad = -n % g
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, pad)
    lo = np.pad(x, widths, constant_values=np.inf)
    hi = np.pad(x, widths, constant_values=-np.inf)
    shape = list(lo.shape)
    shape[axis:axis + 1] = [(n + pad) // g, g]
    gmin = np.repeat(lo.reshape(shape).min(axis=axis + 1), g, axis=axis)
    gmax = np.repeat(hi.reshape(shape).max(axis=axis + 1), g, axis=axis)
    keep = [slice(None)] * x.ndim
    keep[axis] = slice(0, n)
    return gmin[tuple(keep)], gmax[tuple(keep)]


def group_ranges(block: npt.NDArray[Any], group: int) -> tuple[F64, F64]:
    """(per-element group minimum, per-element group maximum) of a ``[2, T, H, D]`` block
    under KIVI groups of ``group`` (float64, the block's shape)."""
    arr, _ = check_block(block)
    x = arr.astype(np.float64)
    kmin, kmax = _ranges(x[0], 0, group)                    # keys: along tokens
    vmin, vmax = _ranges(x[1], 2, min(group, x.shape[3]))   # values: along head_dim
    return np.stack([kmin, vmin]), np.stack([kmax, vmax])


def within_ranges(decoded: npt.NDArray[Any], block: npt.NDArray[Any], group: int,
                  bits: int, vbits: int | None = None) -> npt.NDArray[np.bool_]:
    """Per element: whether ``decoded`` lies in the ``[min, max]`` of its group in
    ``block``: at least the minimum exactly (the zero point is the minimum, every code adds
    a non-negative multiple of the scale), at most the maximum up to the dtype's rounding
    (the scale rounded up to the dtype, times ``2^bits - 1``, plus the float32 rounding of
    ``z + q x s`` and of the output). ``vbits``: the values' bits when they differ from
    the keys'."""
    lo, hi = group_ranges(block, group)
    dt = np.dtype(block.dtype)
    vb = bits if vbits is None else vbits
    levels = np.array([(1 << bits) - 1, (1 << vb) - 1], np.float64).reshape(
        (2,) + (1,) * (lo.ndim - 1))
    scale = ((hi - lo) / levels).astype(dt).astype(np.float64)
    top = np.maximum(np.abs(lo), np.abs(hi)).astype(dt)
    # The scale's rounding up (levels ulps of it), then float32 arithmetic: the product
    # q x s (half an ulp of the range) and the sum z + q x s (half an ulp of the top), then
    # the narrowing into the output dtype (half an ulp of the top).
    rng = np.abs(hi - lo).astype(np.float32)
    tol = levels * np.spacing(scale.astype(dt)).astype(np.float64) + \
        np.spacing(rng).astype(np.float64) + 2 * np.spacing(top).astype(np.float64)
    y = np.asarray(decoded).astype(np.float64)
    ok: npt.NDArray[np.bool_] = (y >= lo) & (y <= hi + tol)
    return ok
