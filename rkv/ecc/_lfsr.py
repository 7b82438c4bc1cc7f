"""Slicing-by-8 LFSR encoder kernels shared by Reed-Solomon (GF(2^8) symbols) and BCH (bits).

Both codes are systematic cyclic codes: the parity of a data word ``d`` is ``d(x) * x^deg mod
g(x)``. The parity register is ``E`` bytes (``E*8`` bits, top-aligned for BCH), kept as ``W``
little-endian ``uint64`` words (``W >= ceil(E/8)``, zero-padded). One step consumes 8 data
bytes ``w``::

    f = reg[0] ^ w                      # the 8 bytes leaving the register, plus the input
    reg = (reg >> 64) ^ T[0, f0] ^ T[1, f1] ^ ... ^ T[7, f7]

so each data byte costs one table row (``W`` words) XOR and no per-symbol GF arithmetic. A
codeword whose data length is not a multiple of 8 is fed zero bytes in front (leading zeros do
not change the remainder), so every step is a full 8-byte step.

The main kernels keep the register in an LLVM ``<W x i64>`` vector (a numba ``intrinsic``
emitting the loop in LLVM IR): a table row is then one vector load + XOR (AVX2/AVX-512) and the
64-bit shift is a shuffle. Four codewords run in lockstep to hide the load latency. Register
widths 1..16, 20, 24, 28 and 32 words each have an entry point that compiles only when a codec
uses it; wider registers (BCH with a very large ``t``) use a scalar kernel.

Indices are unsigned where numba indexes arrays: it then emits no negative-index wraparound
code, and LLVM merges the eight byte loads of a chunk into one unaligned 8-byte load.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
from llvmlite import ir  # type: ignore[import-untyped]
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from rkv.ecc._jit import jit, jit_inline
from rkv.parallel import prange

Arr = npt.NDArray[Any]

@jit_inline
def _ld8(data: Arr, pos: int) -> Any:
    p = np.uint64(pos)
    return (
        np.uint64(data[p])
        | (np.uint64(data[p + np.uint64(1)]) << np.uint64(8))
        | (np.uint64(data[p + np.uint64(2)]) << np.uint64(16))
        | (np.uint64(data[p + np.uint64(3)]) << np.uint64(24))
        | (np.uint64(data[p + np.uint64(4)]) << np.uint64(32))
        | (np.uint64(data[p + np.uint64(5)]) << np.uint64(40))
        | (np.uint64(data[p + np.uint64(6)]) << np.uint64(48))
        | (np.uint64(data[p + np.uint64(7)]) << np.uint64(56))
    )


@jit_inline
def _lead(data: Arr, pos: int, lead: int) -> Any:
    """The first chunk of a codeword whose length is not a multiple of 8: zeros, then data."""
    w = np.uint64(0)
    for j in range(lead):
        w |= np.uint64(data[np.uint64(pos + j)]) << np.uint64(8 * (8 - lead + j))
    return w


@jit_inline
def _idx(f: Any, wsz: Any) -> Any:
    m = np.uint64(0xFF)
    tb = np.uint64(256) * wsz
    return (
        (f & m) * wsz,
        ((f >> np.uint64(8)) & m) * wsz + tb,
        ((f >> np.uint64(16)) & m) * wsz + tb * np.uint64(2),
        ((f >> np.uint64(24)) & m) * wsz + tb * np.uint64(3),
        ((f >> np.uint64(32)) & m) * wsz + tb * np.uint64(4),
        ((f >> np.uint64(40)) & m) * wsz + tb * np.uint64(5),
        ((f >> np.uint64(48)) & m) * wsz + tb * np.uint64(6),
        (f >> np.uint64(56)) * wsz + tb * np.uint64(7),
    )


# -------------------------------------------------------- any width (scalar fallback, W > 32)
@jit_inline
def _stepg(f: Any, t: Arr, w: int, s: Arr) -> None:
    uw = np.uint64(w)
    i0, i1, i2, i3, i4, i5, i6, i7 = _idx(f, uw)
    for i in range(w):
        ui = np.uint64(i)
        s[ui] = (
            s[ui + np.uint64(1)] ^ t[i0 + ui] ^ t[i1 + ui] ^ t[i2 + ui] ^ t[i3 + ui]
            ^ t[i4 + ui] ^ t[i5 + ui] ^ t[i6 + ui] ^ t[i7 + ui]
        )


@jit
def _oneg(data: Arr, start: int, n: int, t: Arr, out: Arr, q: int, s: Arr) -> None:
    w = out.shape[1]
    s[:] = 0
    pos = start
    lead = n & 7
    if lead:
        _stepg(_lead(data, pos, lead), t, w, s)
        pos += lead
    for _ in range(n >> 3):
        _stepg(s[0] ^ _ld8(data, pos), t, w, s)
        pos += 8
    for i in range(w):
        out[q, i] = s[i]


@jit
def _lfsr_gen(data: Arr, starts: Arr, lens: Arr, t: Arr, out: Arr) -> None:
    ncw = starts.shape[0]
    w = out.shape[1]
    sa = np.zeros(w + 1, dtype=np.uint64)
    sb = np.zeros(w + 1, dtype=np.uint64)
    half = ncw // 2
    for qa in range(half):
        qb = qa + half
        n = lens[qa]
        if lens[qb] != n:
            _oneg(data, starts[qa], n, t, out, qa, sa)
            _oneg(data, starts[qb], lens[qb], t, out, qb, sa)
            continue
        pa = starts[qa]
        pb = starts[qb]
        sa[:] = 0
        sb[:] = 0
        lead = n & 7
        if lead:
            _stepg(_lead(data, pa, lead), t, w, sa)
            _stepg(_lead(data, pb, lead), t, w, sb)
            pa += lead
            pb += lead
        for _ in range(n >> 3):
            wa = _ld8(data, pa)
            wb = _ld8(data, pb)
            pa += 8
            pb += 8
            _stepg(sa[0] ^ wa, t, w, sa)
            _stepg(sb[0] ^ wb, t, w, sb)
        for i in range(w):
            out[qa, i] = sa[i]
            out[qb, i] = sb[i]
    if ncw & 1:
        _oneg(data, starts[ncw - 1], lens[ncw - 1], t, out, ncw - 1, sa)


# ------------------------------------------------------------------ SIMD (LLVM vectors)
@intrinsic
def _vrun_impl(
    typingctx: Any, data: Any, pos: Any, nchunks: Any, table: Any, state: Any, nstreams: Any,
    width: Any,
) -> Any:
    """Run ``nstreams`` independent registers of ``width`` words over ``nchunks`` 8-byte chunks.

    Stream ``s`` reads ``data[pos[s] + 8c : pos[s] + 8c + 8]`` (unaligned little-endian) and
    keeps its register in row ``s`` of ``state`` (``(nstreams, width)`` uint64), loaded once
    and stored once. The register is an LLVM ``<width x i64>`` vector: each table row is one
    vector load and one XOR (AVX2/AVX-512), the shift is a shuffle. ``nstreams`` and ``width``
    must be compile-time constants; several streams hide the load latency.
    """
    literal = types.IntegerLiteral
    if not isinstance(nstreams, literal) or not isinstance(width, literal):
        return None
    ns = int(nstreams.literal_value)
    wd = int(width.literal_value)
    sig = types.none(data, pos, nchunks, table, state, nstreams, width)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        i64 = ir.IntType(64)
        i32 = ir.IntType(32)
        vty = ir.VectorType(i64, wd)
        arrs = [
            context.make_array(signature.args[i])(context, builder, args[i]) for i in (0, 1, 3, 4)
        ]
        dptr, pptr, tptr, sptr = (a.data for a in arrs)
        zero = ir.Constant(vty, None)
        mask = ir.Constant(ir.VectorType(i32, wd), [i + 1 for i in range(wd)])
        svars = []
        poss = []
        for st in range(ns):
            p = builder.bitcast(builder.gep(sptr, [ir.Constant(i64, st * wd)]), vty.as_pointer())
            var = cgutils.alloca_once(builder, vty)  # type: ignore[no-untyped-call]
            builder.store(builder.load(p, align=8), var)
            svars.append(var)
            poss.append(builder.load(builder.gep(pptr, [ir.Constant(i64, st)])))
        with cgutils.for_range(builder, args[2]) as loop:
            off8 = builder.mul(loop.index, ir.Constant(i64, 8))
            for st in range(ns):
                reg = builder.load(svars[st])
                wp = builder.bitcast(
                    builder.gep(dptr, [builder.add(poss[st], off8)]), i64.as_pointer()
                )
                f = builder.xor(
                    builder.extract_element(reg, ir.Constant(i32, 0)), builder.load(wp, align=1)
                )
                vals = [builder.shuffle_vector(reg, zero, mask)]
                for j in range(8):
                    sh = builder.lshr(f, ir.Constant(i64, 8 * j))
                    b = builder.and_(sh, ir.Constant(i64, 255))
                    idx = builder.add(
                        builder.mul(b, ir.Constant(i64, wd)), ir.Constant(i64, j * 256 * wd)
                    )
                    vp = builder.bitcast(builder.gep(tptr, [idx]), vty.as_pointer())
                    vals.append(builder.load(vp, align=8))
                while len(vals) > 1:  # XOR tree: short dependency chain
                    nxt = [builder.xor(vals[i], vals[i + 1]) for i in range(0, len(vals) - 1, 2)]
                    if len(vals) % 2:
                        nxt.append(vals[-1])
                    vals = nxt
                builder.store(vals[0], svars[st])
        for st in range(ns):
            p = builder.bitcast(builder.gep(sptr, [ir.Constant(i64, st * wd)]), vty.as_pointer())
            builder.store(builder.load(svars[st]), p, align=8)
        return context.get_dummy_value()

    return sig, codegen


_vrun: Any = _vrun_impl  # called from jitted code only (mypy cannot type intrinsic calls)

_NS = 4  # codewords encoded in lockstep


@jit_inline
def _lead_to_scratch(data: Arr, pos: int, lead: int, scratch: Arr, s: int) -> None:
    for j in range(8 - lead):
        scratch[8 * s + j] = 0
    for j in range(lead):
        scratch[8 * s + 8 - lead + j] = data[pos + j]


@jit_inline
def _vec_core(data: Arr, starts: Arr, lens: Arr, t: Arr, out: Arr, w: Any) -> None:
    ncw = starts.shape[0]
    st = np.zeros((_NS, w), dtype=np.uint64)
    st1 = np.zeros((1, w), dtype=np.uint64)
    pos = np.zeros(_NS, dtype=np.int64)
    spos = np.arange(_NS, dtype=np.int64) * 8
    scratch = np.zeros(8 * _NS, dtype=np.uint8)
    quarter = ncw // _NS
    for qq in range(quarter):
        n = lens[qq]
        same = True
        for s in range(1, _NS):
            if lens[qq + s * quarter] != n:
                same = False
        if same:
            st[:, :] = 0
            lead = n & 7
            for s in range(_NS):
                pos[s] = starts[qq + s * quarter] + lead
                if lead:
                    _lead_to_scratch(data, starts[qq + s * quarter], lead, scratch, s)
            if lead:
                _vrun(scratch, spos, 1, t, st, _NS, w)
            _vrun(data, pos, n >> 3, t, st, _NS, w)
            for s in range(_NS):
                for i in range(w):
                    out[qq + s * quarter, i] = st[s, i]
        else:
            for s in range(_NS):
                q = qq + s * quarter
                _vec_one(data, starts[q], lens[q], t, st1, pos, spos, scratch, w)
                for i in range(w):
                    out[q, i] = st1[0, i]
    for q in range(_NS * quarter, ncw):
        _vec_one(data, starts[q], lens[q], t, st1, pos, spos, scratch, w)
        for i in range(w):
            out[q, i] = st1[0, i]


@jit_inline
def _vec_one(
    data: Arr, start: int, n: int, t: Arr, st1: Arr, pos: Arr, spos: Arr, scratch: Arr, w: Any
) -> None:
    st1[:, :] = 0
    lead = n & 7
    if lead:
        _lead_to_scratch(data, start, lead, scratch, 0)
        _vrun(scratch, spos, 1, t, st1, 1, w)
    pos[0] = start + lead
    _vrun(data, pos, n >> 3, t, st1, 1, w)


# One entry point per register width: each compiles (and caches) only when a codec needs it.
# Widths between the ones listed run at the next listed width (tables are zero-padded).
@jit
def _lfsr_v1(data: Arr, starts: Arr, lens: Arr, t: Arr, out: Arr) -> None:
    _vec_core(data, starts, lens, t, out, 1)


@jit
def _lfsr_v2(data: Arr, starts: Arr, lens: Arr, t: Arr, out: Arr) -> None:
    _vec_core(data, starts, lens, t, out, 2)


@jit
def _lfsr_v3(data: Arr, starts: Arr, lens: Arr, t: Arr, out: Arr) -> None:
    _vec_core(data, starts, lens, t, out, 3)


@jit
def _lfsr_v4(data: Arr, starts: Arr, lens: Arr, t: Arr, out: Arr) -> None:
    _vec_core(data, starts, lens, t, out, 4)


@jit
def _lfsr_v5(data: Arr, starts: Arr, lens: Arr, t: Arr, out: Arr) -> None:
    _vec_core(data, starts, lens, t, out, 5)


@jit
def _lfsr_v6(data: Arr, starts: Arr, lens: Arr, t: Arr, out: Arr) -> None:
    _vec_core(data, starts, lens, t, out, 6)


@jit
def _lfsr_v7(data: Arr, starts: Arr, lens: Arr, t: Arr, out: Arr) -> None:
    _vec_core(data, starts, lens, t, out, 7)


@jit
def _lfsr_v8(data: Arr, starts: Arr, lens: Arr, t: Arr, out: Arr) -> None:
    _vec_core(data, starts, lens, t, out, 8)


@jit
def _lfsr_v9(data: Arr, starts: Arr, lens: Arr, t: Arr, out: Arr) -> None:
    _vec_core(data, starts, lens, t, out, 9)


@jit
def _lfsr_v10(data: Arr, starts: Arr, lens: Arr, t: Arr, out: Arr) -> None:
    _vec_core(data, starts, lens, t, out, 10)


@jit
def _lfsr_v11(data: Arr, starts: Arr, lens: Arr, t: Arr, out: Arr) -> None:
    _vec_core(data, starts, lens, t, out, 11)


@jit
def _lfsr_v12(data: Arr, starts: Arr, lens: Arr, t: Arr, out: Arr) -> None:
    _vec_core(data, starts, lens, t, out, 12)


@jit
def _lfsr_v13(data: Arr, starts: Arr, lens: Arr, t: Arr, out: Arr) -> None:
    _vec_core(data, starts, lens, t, out, 13)


@jit
def _lfsr_v14(data: Arr, starts: Arr, lens: Arr, t: Arr, out: Arr) -> None:
    _vec_core(data, starts, lens, t, out, 14)


@jit
def _lfsr_v15(data: Arr, starts: Arr, lens: Arr, t: Arr, out: Arr) -> None:
    _vec_core(data, starts, lens, t, out, 15)


@jit
def _lfsr_v16(data: Arr, starts: Arr, lens: Arr, t: Arr, out: Arr) -> None:
    _vec_core(data, starts, lens, t, out, 16)


@jit
def _lfsr_v20(data: Arr, starts: Arr, lens: Arr, t: Arr, out: Arr) -> None:
    _vec_core(data, starts, lens, t, out, 20)


@jit
def _lfsr_v24(data: Arr, starts: Arr, lens: Arr, t: Arr, out: Arr) -> None:
    _vec_core(data, starts, lens, t, out, 24)


@jit
def _lfsr_v28(data: Arr, starts: Arr, lens: Arr, t: Arr, out: Arr) -> None:
    _vec_core(data, starts, lens, t, out, 28)


@jit
def _lfsr_v32(data: Arr, starts: Arr, lens: Arr, t: Arr, out: Arr) -> None:
    _vec_core(data, starts, lens, t, out, 32)


_VEC_KERNELS = {
    1: _lfsr_v1,
    2: _lfsr_v2,
    3: _lfsr_v3,
    4: _lfsr_v4,
    5: _lfsr_v5,
    6: _lfsr_v6,
    7: _lfsr_v7,
    8: _lfsr_v8,
    9: _lfsr_v9,
    10: _lfsr_v10,
    11: _lfsr_v11,
    12: _lfsr_v12,
    13: _lfsr_v13,
    14: _lfsr_v14,
    15: _lfsr_v15,
    16: _lfsr_v16,
    20: _lfsr_v20,
    24: _lfsr_v24,
    28: _lfsr_v28,
    32: _lfsr_v32,
}


def vector_width(w: int) -> int:
    """The register width (words) the encoder runs at for a ``w``-word parity register."""
    for v in sorted(_VEC_KERNELS):
        if w <= v:
            return v
    return w


def lfsr_parity(data: Arr, starts: Arr, lens: Arr, tables: Arr, w: int) -> npt.NDArray[np.uint8]:
    """Parity registers of the codewords ``data[starts[q] : starts[q] + lens[q]]``.

    ``data`` is a read-only uint8 array (see :func:`rkv.ecc.base.as_u8`), ``starts``/``lens``
    int64 arrays, ``tables`` from :mod:`rkv.ecc.gf` built for register width ``w`` words
    (:func:`vector_width` of the parity size). Returns ``(ncw, 8*w)`` uint8: row ``q`` holds the
    ``E`` parity bytes of codeword ``q`` followed by zero padding.
    """
    ncw = int(starts.shape[0])
    out = np.empty((ncw, w), dtype=np.uint64)
    kern = _VEC_KERNELS.get(w, _lfsr_gen)

    def run(a: int, z: int) -> None:  # codewords a..z-1: contiguous slices, same kernel
        kern(data, starts[a:z], lens[a:z], tables, out[a:z])

    # A large block's codewords are split over the codec pool (inline when small).
    prange(run, ncw, int(data.shape[0]))
    return out.view(np.uint8).reshape(ncw, 8 * w)
