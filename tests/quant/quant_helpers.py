"""Shared helpers for the rkv.quant tests: block generators and an independent numpy reading
of the ``kivi`` format (offsets and fields computed here from docs/quantization.md, not from
:class:`rkv.quant.KiviLayout`)."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np
import numpy.typing as npt

Arr = npt.NDArray[Any]

DT: dict[str, Any] = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32}
#: (mantissa bits, smallest normal exponent) per dtype
PREC = {"float16": (10, -14), "bfloat16": (7, -126), "float32": (23, -126)}
DTYPE_CODE = {"float16": 1, "bfloat16": 2, "float32": 3}
KINDS = ("normal", "wide", "coarse", "tiny", "outliers", "constant")


def make_block(seed: int, shape: tuple[int, ...], dtype: str, kind: str = "normal") -> Arr:
    """A finite block of ``shape`` with values of the given flavour."""
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    if kind == "normal":
        x = rng.standard_normal(n) * rng.uniform(0.01, 10) + rng.uniform(-5, 5)
    elif kind == "wide":  # magnitudes over many binades, both signs
        x = rng.choice([-1.0, 1.0], n) * 2.0 ** rng.uniform(-12, 12, n)
    elif kind == "coarse":  # few distinct values: many constant groups, exact zeros, -0.0
        x = rng.integers(-2, 3, n).astype(np.float64)
        x[rng.random(n) < 0.2] = -0.0
    elif kind == "tiny":  # float16 subnormal range
        x = rng.standard_normal(n) * 2.0**-20
    elif kind == "outliers":
        x = rng.standard_normal(n)
        x[rng.random(n) < 0.02] *= 300
    elif kind == "constant":
        x = np.full(n, rng.uniform(-3, 3))
    else:
        raise ValueError(kind)
    return x.reshape(shape).astype(DT[dtype])


def round8(n: int) -> int:
    return (n + 7) // 8 * 8


@dataclass
class Parsed:
    header: tuple[Any, ...]
    copy_len: int
    copy_offsets: tuple[int, int, int]
    codes_offset: int
    codes_len: int
    ks: Arr  # [ceil(T/G), H, D], float64 values
    kz: Arr
    vs: Arr  # [T, H, ceil(D/Gv)]
    vz: Arr
    codes: Arr  # [2, T, H, D] uint8


def unpack(buf: bytes, bits: int, n: int) -> Arr:
    """Little-endian bit unpacking, plainly: element i at bit (i*bits)%8 of byte (i*bits)//8."""
    b = np.frombuffer(buf, np.uint8).astype(np.int64)
    i = np.arange(n)
    pos = i * bits
    return ((b[pos // 8] >> (pos % 8)) & ((1 << bits) - 1)).astype(np.uint8)


def meta_values(raw: bytes, dtype: str) -> Arr:
    return np.frombuffer(raw, DT[dtype]).astype(np.float64)


def parse(enc: bytes, bits: int, group: int, shape: tuple[int, ...], dtype: str,
          copy: int = 0) -> Parsed:
    _, t, h, d = shape
    gv = min(group, d)
    nkt = -(-t // group)
    nvd = -(-d // gv)
    gk = nkt * h * d
    gvn = t * h * nvd
    w = 4 if dtype == "float32" else 2
    meta_len = 2 * (gk + gvn) * w
    cl = 24 + round8(meta_len) + 8
    n = 2 * t * h * d
    codes_len = -(-n * bits // 8)
    offs = (0, cl, 2 * cl + round8(codes_len))
    assert len(enc) == 3 * cl + round8(codes_len)
    c = enc[offs[copy] : offs[copy] + cl]
    header = struct.unpack("<4sBBBBHHIII", c[:24])
    m = meta_values(c[24 : 24 + meta_len], dtype)
    ks = m[:gk].reshape(nkt, h, d)
    kz = m[gk : 2 * gk].reshape(nkt, h, d)
    vs = m[2 * gk : 2 * gk + gvn].reshape(t, h, nvd)
    vz = m[2 * gk + gvn :].reshape(t, h, nvd)
    codes = unpack(enc[2 * cl : 2 * cl + codes_len], bits, n).reshape(2, t, h, d)
    return Parsed(header, cl, offs, 2 * cl, codes_len, ks, kz, vs, vz, codes)


def per_element(p: Parsed, group: int, shape: tuple[int, ...]) -> tuple[Arr, Arr]:
    """The scale and zero point of every element's group, shaped like the block."""
    _, t, _h, d = shape
    gv = min(group, d)
    tok = np.arange(t) // group
    dim = np.arange(d) // gv
    s = np.empty(shape)
    z = np.empty(shape)
    s[0] = p.ks[tok]
    z[0] = p.kz[tok]
    s[1] = p.vs[:, :, dim]
    z[1] = p.vz[:, :, dim]
    return s, z


def dequant_ref(codes: Arr, s: Arr, z: Arr, dtype: str) -> Arr:
    """``z + q * s`` in float32, rounded into ``dtype`` (float16 clamped to +-65504)."""
    v = z.astype(np.float32) + codes.astype(np.float32) * s.astype(np.float32)
    if dtype == "float16":
        v = np.clip(v, np.float32(-65504), np.float32(65504))
    return v.astype(DT[dtype])


def ulp(v: Arr, dtype: str) -> Arr:
    """The spacing of ``dtype`` at ``|v|`` (float64)."""
    prec, emin = PREC[dtype]
    a = np.abs(np.asarray(v, np.float64))
    e = np.floor(np.log2(np.maximum(a, 2.0**emin)))
    return np.asarray(2.0 ** (np.maximum(e, emin) - prec))


def error_bound(x: Arr, s: Arr, z: Arr, bits: int, dtype: str) -> Arr:
    """Per-element bound on ``|x - x^|``: ``s/2``, float32 rounding of the code and of
    ``z + q*s``, and half a unit in the last place of the output dtype."""
    levels = (1 << bits) - 1
    x64 = x.astype(np.float64)
    f32 = 2.0**-22 * (np.abs(z) + levels * s + np.abs(x64)) + s * levels * 2.0**-22
    return s / 2 + f32 + ulp(np.abs(x64) + s, dtype) / 2 + 2.0**-149


def same_values(a: Arr, b: Arr) -> bool:
    """Bitwise equality of two blocks (so that -0.0 != +0.0 and the test is exact)."""
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
