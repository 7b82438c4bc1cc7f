"""Column-parallel GF(2^8) kernels for the shard-level Reed-Solomon code (:mod:`rkv.ecc.shardrs`).

Shards are rows of a ``(rows, S8)`` ``uint64`` matrix: each word packs 8 bytes = 8 independent
codeword columns, so GF(2^8) arithmetic on a whole word is SIMD within a register, and LLVM
vectorises the column loops further (AVX2/AVX-512). Multiplying a packed word by ``alpha = 2``
(``_dbl``) is a shift plus the reduction ``0x1d`` on bytes whose top bit was set; multiplying by
any constant is a sum of doublings.

Loops over columns run in blocks that stay in L1 while the rows stream through once, and use
unsigned indices so that numba emits no negative-index wraparound (which blocks vectorisation).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from rkv.ecc._jit import jit, jit_inline

Arr = npt.NDArray[Any]

BLOCK_WORDS = 256  # 2 KiB of columns per block


@jit_inline
def _dbl(x: Any) -> Any:
    """``2 * x`` in GF(2^8) (polynomial 0x11d) for each of the 8 bytes packed in ``x``."""
    h = (x >> np.uint64(7)) & np.uint64(0x0101010101010101)
    return (
        ((x & np.uint64(0x7F7F7F7F7F7F7F7F)) << np.uint64(1))
        ^ h
        ^ (h << np.uint64(2))
        ^ (h << np.uint64(3))
        ^ (h << np.uint64(4))
    )


@jit
def parity_m2(ra: Arr, rb: Arr, out: Arr) -> None:
    """Two parity rows for the data rows ``ra`` then ``rb`` (``RS(k+2, k)`` per column).

    Systematic LFSR division by ``g(x) = (x + 1)(x + alpha) = x^2 + 3x + 2`` per column::

        f = d ^ r0;  r0 = r1 ^ 3 f;  r1 = 2 f
    """
    s8 = out.shape[1]
    ja = ra.shape[0]
    nrows = ja + rb.shape[0]
    o0 = out[0]
    o1 = out[1]
    us8 = np.uint64(s8)
    c0 = np.uint64(0)
    blk = np.uint64(BLOCK_WORDS)
    while c0 < us8:
        c1 = min(us8, c0 + blk)
        for c in range(c0, c1):
            o0[c] = 0
            o1[c] = 0
        for j in range(nrows):
            row = ra[j] if j < ja else rb[j - ja]
            for c in range(c0, c1):
                f = row[c] ^ o0[c]
                d2 = _dbl(f)
                o0[c] = o1[c] ^ f ^ d2
                o1[c] = d2
        c0 = c1


@jit
def lincomb(ra: Arr, rb: Arr, coef: Arr, out: Arr, tmp: Arr) -> None:
    """``out[p] = sum_i coef[p, i] * row_i`` over GF(2^8), rows ``ra`` then ``rb``.

    ``coef`` is ``(q, rows)`` uint8, ``out`` ``(q, S8)`` uint64, ``tmp`` ``(8, BLOCK_WORDS)``
    uint64 scratch. Per row, the doublings ``row * 2^b`` are made once per block and XORed into
    every output whose coefficient has bit ``b``; all-zero coefficient columns cost nothing.
    """
    q = out.shape[0]
    s8 = out.shape[1]
    ja = ra.shape[0]
    nrows = coef.shape[1]
    us8 = np.uint64(s8)
    blk = np.uint64(tmp.shape[1])
    c0 = np.uint64(0)
    while c0 < us8:
        c1 = min(us8, c0 + blk)
        w = c1 - c0
        for p in range(q):
            op = out[p]
            for c in range(c0, c1):
                op[c] = 0
        for i in range(nrows):
            row = ra[i] if i < ja else rb[i - ja]
            hb = -1
            for p in range(q):
                cv = coef[p, i]
                b = 7
                while b > hb and not (cv >> b) & 1:
                    b -= 1
                if b > hb:
                    hb = b
            if hb < 0:
                continue
            if hb == 0:  # only coefficients 0 and 1: plain XOR
                for p in range(q):
                    if coef[p, i] != 0:
                        op = out[p]
                        for c in range(c0, c1):
                            op[c] ^= row[c]
                continue
            t0 = tmp[0]
            for c in range(np.uint64(0), w):
                t0[c] = row[c0 + c]
            for b in range(1, hb + 1):
                tb = tmp[b]
                tp = tmp[b - 1]
                for c in range(np.uint64(0), w):
                    tb[c] = _dbl(tp[c])
            for p in range(q):
                cv = coef[p, i]
                if cv == 0:
                    continue
                op = out[p]
                for b in range(hb + 1):
                    if (cv >> b) & 1:
                        tb = tmp[b]
                        for c in range(np.uint64(0), w):
                            op[c0 + c] ^= tb[c]
        c0 = c1
