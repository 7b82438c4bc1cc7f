"""Numba kernels of the ``kivi`` quantizer (the format is described in :mod:`rkv.quant.kivi`).

Element types. The block arrives as raw bits, ``uint16`` for float16 and bfloat16, or as
``float32``. Every kernel takes a ``tag``: ``None`` for float32 data, else the 16-bit format
(:data:`MODE_F16` or :data:`MODE_BF16`); numba prunes ``if tag is None`` at compile time, so
each kernel has exactly two specialisations (16-bit and 32-bit). Work is done on float32
scratch rows so that every inner loop vectorizes. All arithmetic is IEEE ``float32`` /
``float64`` without fast-math or fused multiply-add, so results are bit-for-bit reproducible
(the golden files depend on it).

Metadata (scale ``s`` and zero point ``z`` of every group) is stored in the block's own dtype,
laid out ``[key scales | key zeros | value scales | value zeros]`` in a ``uint16`` array of
bits (16-bit dtypes) or a ``float32`` array:

* ``z`` is the group minimum, an element of the block, so it is stored exactly;
* ``s`` is the *smallest* value of the dtype that is ``>= (max - min) / (2**bits - 1)``, the
  quotient computed in float64. Rounding up keeps every element inside the code range, so the
  quantization error never exceeds ``s / 2`` (plus float32 rounding).

Codes: ``q = clamp(rint((x - z) / s), 0, 2**bits - 1)`` with float32 subtraction and division
(``s == 0``, a constant group, divides by 1 instead: ``x - z == 0`` there). Dequantization:
``x^ = z + float32(q) * s`` in float32, then rounded to nearest even into the output dtype;
for float16 output it is first clamped to +-65504.
"""

from __future__ import annotations

import platform
from typing import Any

import llvmlite.binding as llvm_binding
import numpy as np
import numpy.typing as npt
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from rkv.quant._jit import jit

Arr = npt.NDArray[Any]
Tag = int | None

MODE_F16 = 0
MODE_BF16 = 1

#: inputs must satisfy ``|x| < 2**126``: then no scale or dequantized value can overflow
LIMIT_BITS = 0x7E800000  # bits of 2**126: |x| < 2**126 <=> (bits & 0x7FFFFFFF) < LIMIT_BITS
F16_MAX = np.float32(65504.0)
#: elements per scratch chunk of the value kernels
CHUNK = 4096


def _hardware_half() -> bool:
    """True when LLVM turns float16 <-> float32 conversions into instructions (x86 F16C,
    ARM); otherwise the kernels use their integer-only conversions."""
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64", "i386", "i686"):
        return bool(llvm_binding.get_host_cpu_features().get("f16c", False))
    return machine in ("aarch64", "arm64")


#: compile-time switch between the hardware and the integer float16 conversions
HW_HALF = _hardware_half()


# ------------------------------------------------------------------------- conversions
def _h2f_impl(typingctx: Any, h: Any) -> Any:
    """float32 value of float16 bits (exact; LLVM ``fpext half``)."""
    sig = types.float32(types.uint16)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return sig, codegen


def _f2h_impl(typingctx: Any, f: Any) -> Any:
    """float16 bits of a float32, rounded to nearest even (LLVM ``fptrunc``)."""
    sig = types.uint16(types.float32)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))

    return sig, codegen


_h2f: Any = intrinsic(_h2f_impl)
_f2h: Any = intrinsic(_f2h_impl)


@jit
def f32_bits_to_f16(u: Any) -> Any:
    """float16 bits of the float32 with bits ``u``, rounded to nearest even.

    ``u`` must be finite with ``|value| <= 65504`` (larger values give garbage, not inf).
    """
    a = u & 0x7FFFFFFF
    sign = (u >> 16) & 0x8000
    # normal float16 result: drop 13 mantissa bits with round-to-nearest-even, rebias
    hn = (a - 0x38000000 + 0xFFF + ((a >> 13) & 1)) >> 13
    # subnormal (or zero) float16 result: shift the full significand into place
    e = a >> 23
    sh = min(max(126 - e, 1), 31)
    m = (a & 0x7FFFFF) | 0x800000
    hs = m >> sh
    rem = m & ((1 << sh) - 1)
    half = 1 << (sh - 1)
    if rem > half or (rem == half and (hs & 1) == 1):
        hs += 1
    h = hn if a >= 0x38800000 else hs
    return h | sign


@jit
def f32_bits_to_bf16(u: Any) -> Any:
    """bfloat16 bits of the (finite) float32 with bits ``u``, rounded to nearest even."""
    return (u + 0x7FFF + ((u >> 16) & 1)) >> 16


@jit
def _widen(src: Arr, start: int, n: int, tag: Tag, dst: Arr, dstu: Arr) -> None:
    """``dst[:n] = float32(src[start:start + n])`` (``dstu`` is ``dst`` viewed as uint32).

    Exact for every bit pattern (subnormals, infinities and NaNs included)."""
    # (slices and 0-based loop indices everywhere: numba then drops its negative-index
    # wraparound and the loops vectorize)
    s = src[start : start + n]
    d = dst[:n]
    du = dstu[:n]
    if tag is None:
        for i in range(n):
            d[i] = s[i]
    elif tag == MODE_BF16:
        for i in range(n):
            du[i] = np.uint32(s[i]) << 16
    elif HW_HALF:
        for i in range(n):
            d[i] = _h2f(s[i])
    else:
        f16_to_f32_soft(s, d, du)


@jit
def f16_to_f32_soft(s: Arr, d: Arr, du: Arr) -> None:
    """``d = float32(float16 bits s)`` without hardware support (``du``: ``d`` as uint32)."""
    n = s.shape[0]
    # subnormals through float arithmetic, the rest by moving the bits
    for i in range(n):
        d[i] = np.float32(s[i] & 0x3FF) * np.float32(2.0**-24)
    for i in range(n):
        h = np.int64(s[i])
        a = h & 0x7FFF
        if a >= 0x7C00:
            u = (a << 13) | 0x7F800000
        elif a >= 0x400:
            u = (a << 13) + 0x38000000
        else:
            u = np.int64(du[i])
        du[i] = u | ((h & 0x8000) << 16)


@jit
def f32_to_f16_soft(su: Arr, o: Arr) -> None:
    """``o`` = float16 bits of the float32 bits ``su`` (finite, ``|x| <= 65504``), rounded to
    nearest even, without hardware support."""
    for i in range(su.shape[0]):
        o[i] = f32_bits_to_f16(np.int64(su[i]))


@jit
def _narrow(row: Arr, rowu: Arr, n: int, out: Arr, base: int, tag: Tag) -> None:
    """``out[base:base + n]`` = ``row[:n]`` rounded to nearest even into the output dtype."""
    o = out[base : base + n]
    rf = row[:n]
    ru = rowu[:n]
    if tag is None:
        for i in range(n):
            o[i] = rf[i]
    elif tag == MODE_F16:
        for i in range(n):
            rf[i] = min(max(rf[i], -F16_MAX), F16_MAX)
        if HW_HALF:
            for i in range(n):
                o[i] = _f2h(rf[i])
        else:
            f32_to_f16_soft(ru, o)
    else:
        for i in range(n):
            o[i] = f32_bits_to_bf16(np.int64(ru[i]))


# ------------------------------------------------------------------------- metadata
@jit
def _metadata(
    mn: Arr, mx: Arr, n: int, levels: int, tag: Tag, meta: Arr, s_off: int, z_off: int,
    dv: Arr, t64: Arr, t64u: Arr, ex: Arr,
) -> None:
    """Scales and zero points of ``n`` groups with minima ``mn`` and maxima ``mx``.

    Writes them to ``meta[s_off + i]`` / ``meta[z_off + i]`` and the float32 divisor of each
    group (its scale, or 1 for a constant group) to ``dv``. ``t64`` (float64, viewed as
    ``t64u``) and ``ex`` (int64) are scratch of at least ``n`` elements.
    """
    if tag is None:
        prec, emin = 23, -126
    elif tag == MODE_F16:
        prec, emin = 10, -14
    else:
        prec, emin = 7, -126
    lo = mn[:n]
    hi = mx[:n]
    d = dv[:n]
    q = t64[:n]
    qu = t64u[:n]
    e = ex[:n]
    ms = meta[s_off : s_off + n]
    mz = meta[z_off : z_off + n]
    # a zero minimum becomes +0.0 (min and max do not order -0.0 and +0.0)
    for i in range(n):
        lo[i] = lo[i] + np.float32(0.0)
    # the quotient, rounded once (float64)
    for i in range(n):
        q[i] = (np.float64(hi[i]) - np.float64(lo[i])) / levels
    # binade E of each quotient (at least the dtype's subnormal binade)
    for i in range(n):
        e[i] = max(np.int64((qu[i] >> 52) & 0x7FF) - 1023, emin)
    for i in range(n):
        s = q[i]
        qu[i] = np.uint64(prec - e[i] + 1023) << 52  # 2**(prec - E): 1 / the dtype's spacing
        # smallest multiple k * 2**(E - prec) of the spacing that is >= s; its bits
        k = np.ceil(s * q[i])
        q[i] = k / q[i]
        e[i] = ((e[i] - emin) << prec) + np.int64(k)
    for i in range(n):
        s32 = np.float32(q[i])
        d[i] = s32 if s32 > 0 else np.float32(1.0)
    if tag is None:
        for i in range(n):
            ms[i] = np.float32(q[i])
            mz[i] = lo[i]
    else:
        for i in range(n):
            ms[i] = e[i]
        lou = mn.view(np.uint32)[:n]
        if tag == MODE_F16:
            for i in range(n):
                mz[i] = f32_bits_to_f16(np.int64(lou[i]))
        else:
            for i in range(n):
                mz[i] = np.int64(lou[i]) >> 16


# ------------------------------------------------------------------------- encode
@jit
def _encode_keys(
    src: Arr, tag: Tag, n_tok: int, n_ch: int, group: int, levels: int, meta: Arr,
    ks_off: int, kz_off: int, codes: Arr,
) -> int:
    """Keys ``[n_tok, n_ch]`` (channel = head * head_dim + dim), per-channel groups of
    ``group`` consecutive tokens. Returns the number of non-finite / out-of-range elements."""
    rows = min(group, n_tok)
    buf = np.empty(rows * n_ch, np.float32)
    bufu = buf.view(np.uint32)
    bufi = buf.view(np.int32)
    mn = np.empty(n_ch, np.float32)
    mx = np.empty(n_ch, np.float32)
    dv = np.empty(n_ch, np.float32)
    t64 = np.empty(n_ch, np.float64)
    t64u = t64.view(np.uint64)
    ex = np.empty(n_ch, np.int64)
    flev = np.float32(levels)
    zero = np.float32(0.0)
    n_grp = (n_tok + group - 1) // group
    for tg in range(n_grp):
        t0 = tg * group
        nr = min(t0 + group, n_tok) - t0
        _widen(src, t0 * n_ch, nr * n_ch, tag, buf, bufu)
        bad = 0
        first = buf[:n_ch]
        for c in range(n_ch):
            mn[c] = first[c]
            mx[c] = first[c]
        for r in range(nr):
            row = buf[r * n_ch : (r + 1) * n_ch]
            rowi = bufi[r * n_ch : (r + 1) * n_ch]
            for c in range(n_ch):
                v = row[c]
                mn[c] = min(mn[c], v)
                mx[c] = max(mx[c], v)
                bad += (rowi[c] & 0x7FFFFFFF) >= LIMIT_BITS
        if bad:
            return bad
        gbase = tg * n_ch
        _metadata(mn, mx, n_ch, levels, tag, meta, ks_off + gbase, kz_off + gbase, dv,
                  t64, t64u, ex)
        for r in range(nr):
            row = buf[r * n_ch : (r + 1) * n_ch]
            o = codes[(t0 + r) * n_ch : (t0 + r + 1) * n_ch]
            for c in range(n_ch):
                q = np.rint((row[c] - mn[c]) / dv[c])
                o[c] = np.uint8(min(max(q, zero), flev))
    return 0


@jit
def _encode_values(
    src: Arr, off: int, tag: Tag, n_rows: int, dim: int, vgroup: int, levels: int,
    meta: Arr, vs_off: int, vz_off: int, codes: Arr,
) -> int:
    """Values: ``n_rows = tokens * heads`` rows of ``dim`` elements starting at element
    ``off``, per-token groups of ``vgroup`` consecutive elements of a row."""
    n_grp = (dim + vgroup - 1) // vgroup
    rpc = max(1, CHUNK // dim)  # rows per chunk
    buf = np.empty(rpc * dim, np.float32)
    bufu = buf.view(np.uint32)
    bufi = buf.view(np.int32)
    ng = rpc * n_grp
    mn = np.empty(ng, np.float32)
    mx = np.empty(ng, np.float32)
    mni = mn.view(np.int32)
    mxi = mx.view(np.int32)
    dv = np.empty(ng, np.float32)
    t64 = np.empty(ng, np.float64)
    t64u = t64.view(np.uint64)
    ex = np.empty(ng, np.int64)
    flev = np.float32(levels)
    zero = np.float32(0.0)
    for r0 in range(0, n_rows, rpc):
        nr = min(rpc, n_rows - r0)
        _widen(src, off + r0 * dim, nr * dim, tag, buf, bufu)
        bad = np.int64(0)
        # min / max of each group on order-preserving integer keys of the float bits: integer
        # reductions vectorize, float ones do not (without fast-math)
        for r in range(nr):
            for gi in range(n_grp):
                a = r * dim + gi * vgroup
                grp = bufi[a : min(a + vgroup, (r + 1) * dim)]
                lo = np.int64(0x7FFFFFFF)
                hi = np.int64(-0x80000000)
                for i in range(grp.shape[0]):
                    u = np.int64(grp[i])
                    k = u ^ ((u >> 31) & 0x7FFFFFFF)
                    lo = min(lo, k)
                    hi = max(hi, k)
                    bad += np.int64((u & 0x7FFFFFFF) >= LIMIT_BITS)
                mni[r * n_grp + gi] = lo ^ ((lo >> 31) & 0x7FFFFFFF)
                mxi[r * n_grp + gi] = hi ^ ((hi >> 31) & 0x7FFFFFFF)
        if bad:
            return int(bad)
        m0 = r0 * n_grp
        _metadata(mn, mx, nr * n_grp, levels, tag, meta, vs_off + m0, vz_off + m0, dv,
                  t64, t64u, ex)
        obase = off + r0 * dim
        for r in range(nr):
            for gi in range(n_grp):
                a = r * dim + gi * vgroup
                b = min(a + vgroup, (r + 1) * dim)
                x = buf[a:b]
                o = codes[obase + a : obase + b]
                z = mn[r * n_grp + gi]
                d = dv[r * n_grp + gi]
                for i in range(x.shape[0]):
                    q = np.rint((x[i] - z) / d)
                    o[i] = np.uint8(min(max(q, zero), flev))
    return 0


@jit
def kivi_encode(
    src: Arr, tag: Tag, n_tok: int, heads: int, dim: int, group: int, vgroup: int,
    levels: int, vlevels: int, meta: Arr, codes: Arr,
) -> int:
    """Quantize a block ``[2, n_tok, heads, dim]`` (flat ``src``) into one code per byte in
    ``codes`` (``2 * n_tok * heads * dim``) and the metadata in ``meta``; keys take codes up
    to ``levels``, values up to ``vlevels``.

    Returns the number of elements that are not finite or have ``|x| >= 2**126`` in the first
    offending group or chunk (0 = ok; otherwise the outputs are incomplete)."""
    n_ch = heads * dim
    gk = ((n_tok + group - 1) // group) * n_ch
    gv = n_tok * heads * ((dim + vgroup - 1) // vgroup)
    bad = _encode_keys(src, tag, n_tok, n_ch, group, levels, meta, 0, gk, codes)
    if bad:
        return bad
    return _encode_values(  # type: ignore[no-any-return]
        src, n_tok * n_ch, tag, n_tok * heads, dim, vgroup, vlevels, meta, 2 * gk,
        2 * gk + gv, codes,
    )


# ------------------------------------------------------------------------- bit packing
@jit
def pack_codes(codes: Arr, bits: int, out: Arr) -> None:
    """Pack ``codes`` (values < 2**bits, bits 2 or 4) little-endian: element ``i`` goes to
    byte ``i * bits // 8`` at bit ``i * bits % 8``. Unused high bits of the last byte are 0."""
    n = codes.shape[0]
    if bits == 4:
        nf = n // 2
        for k in range(nf):
            out[k] = codes[2 * k] | (codes[2 * k + 1] << 4)
        if n % 2:
            out[nf] = codes[n - 1]
    else:
        nf = n // 4
        for k in range(nf):
            j = 4 * k
            out[k] = codes[j] | (codes[j + 1] << 2) | (codes[j + 2] << 4) | (codes[j + 3] << 6)
        rem = n - 4 * nf
        if rem:
            acc = np.int64(0)
            for j in range(rem):
                acc |= np.int64(codes[4 * nf + j]) << (2 * j)
            out[nf] = acc


@jit
def unpack_codes(packed: Arr, bits: int, n: int, out: Arr) -> None:
    """Inverse of :func:`pack_codes`: ``n`` codes into ``out`` (one per byte)."""
    if bits == 4:
        nf = n // 2
        for k in range(nf):
            b = packed[k]
            out[2 * k] = b & 15
            out[2 * k + 1] = b >> 4
        if n % 2:
            out[n - 1] = packed[nf] & 15
    else:
        nf = n // 4
        for k in range(nf):
            b = packed[k]
            j = 4 * k
            out[j] = b & 3
            out[j + 1] = (b >> 2) & 3
            out[j + 2] = (b >> 4) & 3
            out[j + 3] = b >> 6
        for j in range(n - 4 * nf):
            out[4 * nf + j] = (packed[nf] >> (2 * j)) & 3


# ------------------------------------------------------------------------- decode
@jit
def kivi_dequant(
    codes: Arr, tag: Tag, n_tok: int, heads: int, dim: int, group: int, vgroup: int,
    meta: Arr, out: Arr,
) -> int:
    """Dequantize one code per byte (``codes``) with the metadata ``meta`` into ``out``
    (flat; bits of the output dtype for 16-bit dtypes). Returns the number of groups whose
    metadata is not finite or has a negative scale (0 = ok; ``out`` is then untouched)."""
    n_ch = heads * dim
    gk = ((n_tok + group - 1) // group) * n_ch
    n_vg = (dim + vgroup - 1) // vgroup
    gv = n_tok * heads * n_vg
    nm = 2 * (gk + gv)
    # metadata as float32: [key scales | key zeros | value scales | value zeros]
    mf = np.empty(nm, np.float32)
    _widen(meta, 0, nm, tag, mf, mf.view(np.uint32))
    bad = 0
    for i in range(nm):
        bad += not abs(mf[i]) < np.inf
    ks = mf[:gk]
    vs = mf[2 * gk : 2 * gk + gv]
    for i in range(gk):
        bad += ks[i] < 0
    for i in range(gv):
        bad += vs[i] < 0
    if bad:
        return bad
    row = np.empty(max(n_ch, CHUNK + dim), np.float32)
    rowu = row.view(np.uint32)
    for t in range(n_tok):
        mb = (t // group) * n_ch
        s = mf[mb : mb + n_ch]
        z = mf[gk + mb : gk + mb + n_ch]
        q = codes[t * n_ch : (t + 1) * n_ch]
        for c in range(n_ch):
            row[c] = z[c] + np.float32(q[c]) * s[c]
        _narrow(row, rowu, n_ch, out, t * n_ch, tag)
    voff = n_tok * n_ch
    n_rows = n_tok * heads
    rpc = max(1, CHUNK // dim)
    for r0 in range(0, n_rows, rpc):
        nr = min(rpc, n_rows - r0)
        base = voff + r0 * dim
        for r in range(nr):
            m = 2 * gk + (r0 + r) * n_vg
            for gi in range(n_vg):
                s1 = mf[m + gi]
                z1 = mf[gv + m + gi]
                a = r * dim + gi * vgroup
                b = min(a + vgroup, (r + 1) * dim)
                q = codes[base + a : base + b]
                o = row[a:b]
                for j in range(b - a):
                    o[j] = z1 + np.float32(q[j]) * s1
        _narrow(row, rowu, nr * dim, out, base, tag)
    return 0
