"""Galois-field tables and code constructions (pure numpy/Python, computed once and cached).

Conventions (all codes in :mod:`rkv.ecc`):

* ``GF(2^m)`` is built from a primitive polynomial ``prim`` (bit ``i`` = coefficient of
  ``x^i``); the primitive element is ``alpha = x`` (the integer 2). For ``GF(2^8)`` the
  polynomial is ``0x11d``, as in reedsolo, galois (its default ``GF(2**8)``) and most storage
  RS codes. For BCH the polynomials are the Linux kernel's (``lib/bch.c``), so parity bytes are
  identical to bchlib's.
* Polynomials over the field are written highest degree first when they are byte strings: byte
  0 of a codeword is the coefficient of ``x^(n-1)``.
* Reed-Solomon generator ``g(x) = prod_{i=0}^{nsym-1} (x - alpha^i)`` (first consecutive root
  ``alpha^0``; reedsolo's ``fcr=0``; galois's ``ReedSolomon(..., c=0)``).
* BCH generator ``g(x) = lcm(M_1, M_3, ..., M_{2t-1})`` over GF(2), ``M_i`` the minimal
  polynomial of ``alpha^i`` (narrow sense; galois's ``BCH(..., c=1)``).

Slicing tables (:func:`rs_slicing_tables`, :func:`bch_slicing_tables`) drive the LFSR encoder in
:mod:`rkv.ecc._lfsr`: the parity register is ``E`` bytes, padded to ``W = ceil(E/8)`` little-endian
``uint64`` words; ``T[j, v]`` is the register contribution of byte value ``v`` fed ``7-j`` bytes
before the end of an 8-byte chunk, i.e. ``(v(x) * x^(deg + 8*(7-j))) mod g(x)`` for BCH or
``(v * x^(nsym + 7 - j)) mod g(x)`` for RS.
"""

from __future__ import annotations

from functools import cache

import numpy as np
import numpy.typing as npt

from rkv.errors import ConfigError

I64 = npt.NDArray[np.int64]
U8 = npt.NDArray[np.uint8]
U64 = npt.NDArray[np.uint64]

#: The Linux kernel's default primitive polynomials for GF(2^m), m = 5..15 (as bchlib).
BCH_PRIM_POLYS: dict[int, int] = {
    5: 0x25,
    6: 0x43,
    7: 0x83,
    8: 0x11D,
    9: 0x211,
    10: 0x409,
    11: 0x805,
    12: 0x1053,
    13: 0x201B,
    14: 0x402B,
    15: 0x8003,
}
RS_PRIM_POLY = 0x11D


class Field:
    """Log/antilog tables of GF(2^m) for the decoding kernels.

    ``exp`` has ``2*N + 2`` entries (``exp[i] = alpha^(i mod N)``) so that the sum of two logs
    indexes it directly; ``log[0]`` is ``-1`` (never used: kernels test for zero first).
    ``qsol[c]`` is a ``y`` with ``y^2 + y = c`` or ``-1`` when none exists (quadratic roots).
    """

    def __init__(self, m: int, prim: int) -> None:
        self.m = m
        self.prim = prim
        self.size = 1 << m
        self.N = self.size - 1
        exp = np.zeros(2 * self.N + 2, dtype=np.int64)
        log = np.full(self.size, -1, dtype=np.int64)
        x = 1
        for i in range(self.N):
            exp[i] = x
            if log[x] != -1:
                raise ConfigError(f"polynomial {prim:#x} is not primitive for GF(2^{m})")
            log[x] = i
            x <<= 1
            if x & self.size:
                x ^= prim
        if x != 1:
            raise ConfigError(f"polynomial {prim:#x} is not primitive for GF(2^{m})")
        exp[self.N : 2 * self.N] = exp[: self.N]
        exp[2 * self.N :] = exp[:2]
        self.exp = exp
        self.log = log
        # quadratic solutions: y and y^1 both map to y^2 ^ y
        ys = np.arange(self.size, dtype=np.int64)
        sq = np.zeros(self.size, dtype=np.int64)
        nz = ys != 0
        sq[nz] = exp[(2 * log[ys[nz]]) % self.N]
        qsol = np.full(self.size, -1, dtype=np.int64)
        qsol[sq ^ ys] = ys
        self.qsol = qsol

    def mul(self, a: int, b: int) -> int:
        if a == 0 or b == 0:
            return 0
        return int(self.exp[self.log[a] + self.log[b]])

    def pow_alpha(self, e: int) -> int:
        return int(self.exp[e % self.N])

    def inv(self, a: int) -> int:
        if a == 0:
            raise ZeroDivisionError("inverse of 0 in GF(2^m)")
        return int(self.exp[(self.N - self.log[a]) % self.N])

    def mul_table(self) -> U8:
        """The full 256x256 product table (GF(2^8) only)."""
        assert self.m == 8
        a = np.arange(256)
        la = self.log[a]
        t = self.exp[(la[:, None] + la[None, :]) % self.N].astype(np.uint8)
        t[0, :] = 0
        t[:, 0] = 0
        return np.asarray(t, dtype=np.uint8)


@cache
def field(m: int, prim: int) -> Field:
    return Field(m, prim)


def gf256() -> Field:
    return field(8, RS_PRIM_POLY)


@cache
def gf256_mul_table() -> U8:
    t = gf256().mul_table()
    t.flags.writeable = False
    return t


# ------------------------------------------------------------------------------- Reed-Solomon
@cache
def rs_generator(nsym: int) -> tuple[int, ...]:
    """Coefficients of ``prod_{i<nsym} (x - alpha^i)``, highest degree first (g[0] == 1)."""
    f = gf256()
    g = [1]
    for i in range(nsym):
        root = f.pow_alpha(i)
        nxt = [*g, 0]
        for j, c in enumerate(g):
            nxt[j + 1] ^= f.mul(c, root)
        g = nxt
    return tuple(g)


def register_words(nbytes: int) -> int:
    """Words of the encoder's parity register for ``nbytes`` parity bytes (vector widths)."""
    from rkv.ecc._lfsr import vector_width

    return vector_width((nbytes + 7) // 8)


def _pack_words(rows: U8, width_bytes: int) -> U64:
    """Pad ``rows`` (..., E) of bytes to ``8*W`` bytes and view them as little-endian uint64."""
    w = register_words(width_bytes)
    shape = (*rows.shape[:-1], 8 * w)
    buf = np.zeros(shape, dtype=np.uint8)
    buf[..., :width_bytes] = rows
    return np.ascontiguousarray(buf).view("<u8").astype(np.uint64)


@cache
def rs_slicing_tables(nsym: int) -> tuple[U64, int]:
    """Slicing-by-8 tables for RS with ``nsym`` parity bytes: flat ``(8*256*W,)`` uint64, W."""
    mul = gf256_mul_table()
    g = np.asarray(rs_generator(nsym)[1:], dtype=np.intp)  # x^nsym mod g, highest first
    v = np.arange(256, dtype=np.intp)
    tables = np.zeros((8, 256, nsym), dtype=np.uint8)
    cur = mul[v[:, None], g[None, :]]  # v * x^nsym mod g
    tables[7] = cur
    for j in range(6, -1, -1):
        top = cur[:, 0].astype(np.intp)
        shifted = np.zeros_like(cur)
        shifted[:, :-1] = cur[:, 1:]
        cur = shifted ^ mul[top[:, None], g[None, :]]
        tables[j] = cur
    w = register_words(nsym)
    flat = _pack_words(tables, nsym).reshape(-1)
    flat.flags.writeable = False
    return flat, w


# ------------------------------------------------------------------------------------- BCH
def _gf2_mul(a: int, b: int) -> int:
    r = 0
    while b:
        if b & 1:
            r ^= a
        a <<= 1
        b >>= 1
    return r


def _gf2_mod(a: int, g: int) -> int:
    dg = g.bit_length() - 1
    while a.bit_length() - 1 >= dg and a:
        a ^= g << (a.bit_length() - 1 - dg)
    return a


def cyclotomic_coset(i: int, n: int) -> list[int]:
    coset = []
    c = i % n
    while c not in coset:
        coset.append(c)
        c = (2 * c) % n
    return coset


@cache
def bch_generator(m: int, t: int, prim: int) -> int:
    """The BCH generator polynomial over GF(2) as an int (bit i = coefficient of x^i)."""
    f = field(m, prim)
    seen: set[int] = set()
    g = 1
    for i in range(1, 2 * t, 2):
        if i % f.N in seen:
            continue
        coset = cyclotomic_coset(i, f.N)
        seen.update(coset)
        poly = [1]  # coefficients over GF(2^m), lowest degree first
        for c in coset:
            root = f.pow_alpha(c)
            nxt = [0] * (len(poly) + 1)
            for j, a in enumerate(poly):
                nxt[j + 1] ^= a
                nxt[j] ^= f.mul(a, root)
            poly = nxt
        if any(a not in (0, 1) for a in poly):  # pragma: no cover - maths guarantees it
            raise AssertionError("minimal polynomial is not binary")
        g = _gf2_mul(g, sum(a << j for j, a in enumerate(poly)))
    return g


@cache
def bch_slicing_tables(m: int, t: int, prim: int) -> tuple[U64, int, int, int]:
    """Slicing tables for the BCH(m, t) encoder: (flat tables, W, ecc_bits, ecc_bytes).

    ``ecc_bits = deg g`` and ``ecc_bytes = ceil(m*t/8)`` (the kernel's choice, which can leave
    whole zero bytes after the parity when ``deg g < m*t``); parity is top-aligned.
    """
    g = bch_generator(m, t, prim)
    deg = g.bit_length() - 1
    ebytes = (m * t + 7) // 8  # as the Linux kernel: room for m*t bits even if deg < m*t
    pad = 8 * ebytes - deg
    # basis[s] = x^(deg + s) mod g, for s = 0..63
    basis = []
    r = _gf2_mod(1 << deg, g)
    for _ in range(64):
        basis.append(r)
        r <<= 1
        if r >> deg:
            r ^= g
    tables = np.zeros((8, 256, ebytes), dtype=np.uint8)
    for j in range(8):
        base = 8 * (7 - j)
        vals = [0] * 256
        for v in range(1, 256):
            low = (v & -v).bit_length() - 1
            vals[v] = vals[v & (v - 1)] ^ basis[base + low]
        tables[j] = np.frombuffer(
            b"".join((x << pad).to_bytes(ebytes, "big") for x in vals), dtype=np.uint8
        ).reshape(256, ebytes)
    w = register_words(ebytes)
    flat = _pack_words(tables, ebytes).reshape(-1)
    flat.flags.writeable = False
    return flat, w, deg, ebytes


@cache
def bch_syndrome_tables(m: int, t: int, ebytes: int, deg: int) -> tuple[I64, I64, I64]:
    """Tables for the odd BCH syndromes from a top-aligned remainder (see ``_gfcore``).

    ``btab[v, jj] = sum_b bit_b(v) alpha^(j b)`` for ``j = 2jj+1``; ``step8[jj] = 8j mod N``;
    ``fix[jj] = -j*(8*ebytes - deg) mod N`` (undoes the zero padding after the parity).
    """
    f = field(m, BCH_PRIM_POLYS[m])
    j = 2 * np.arange(t, dtype=np.int64) + 1
    v = np.arange(256, dtype=np.int64)
    btab = np.zeros((256, t), dtype=np.int64)
    for b in range(8):
        on = ((v >> b) & 1).astype(bool)
        btab[on] ^= f.exp[(j * b) % f.N][None, :]
    step8 = (8 * j) % f.N
    fix = (-j * (8 * ebytes - deg)) % f.N
    return btab, step8, fix


# ------------------------------------------------------------------ GF(2^8) matrices (numpy)
def gf256_matmul(a: U8, b: U8) -> U8:
    """Matrix product over GF(2^8)."""
    mul = gf256_mul_table()
    prod = mul[a[:, :, None].astype(np.intp), b[None, :, :].astype(np.intp)]
    return np.asarray(np.bitwise_xor.reduce(prod, axis=1), dtype=np.uint8)


def gf256_inv(a: U8) -> U8:
    """Inverse of a square matrix over GF(2^8) (Gauss-Jordan); raises if singular."""
    f = gf256()
    mul = gf256_mul_table()
    size = a.shape[0]
    aug = np.concatenate([a.astype(np.uint8), np.eye(size, dtype=np.uint8)], axis=1)
    for col in range(size):
        piv = col + int(np.flatnonzero(aug[col:, col])[0]) if aug[col:, col].any() else -1
        if piv < 0:
            raise ZeroDivisionError("singular matrix over GF(2^8)")
        if piv != col:
            aug[[col, piv]] = aug[[piv, col]]
        inv = f.inv(int(aug[col, col]))
        aug[col] = mul[inv, aug[col].astype(np.intp)]
        factors = aug[:, col].astype(np.intp)
        factors[col] = 0
        aug ^= mul[factors[:, None], aug[col].astype(np.intp)[None, :]]
    return np.ascontiguousarray(aug[:, size:])


@cache
def rs_parity_matrix(k: int, m: int) -> U8:
    """``P`` (m x k): parity byte ``p`` of a systematic RS(k+m, k) word is ``sum_j P[p,j] d_j``.

    Column ``j`` is the parity of the word with a single 1 at data position ``j``:
    ``x^(k-1-j+m) mod g(x)``, highest degree first.
    """
    mul = gf256_mul_table()
    g = np.asarray(rs_generator(m)[1:], dtype=np.intp)
    p = np.zeros((m, k), dtype=np.uint8)
    cur = g.astype(np.uint8)  # x^m mod g
    for j in range(k - 1, -1, -1):
        p[:, j] = cur
        top = int(cur[0])
        nxt = np.zeros(m, dtype=np.uint8)
        nxt[:-1] = cur[1:]
        cur = nxt ^ mul[top, g]
    p.flags.writeable = False
    return p


@cache
def rs_check_matrix(n: int, nsym: int) -> U8:
    """``H`` (nsym x n) with ``H[i, s] = alpha^(i (n-1-s))``: syndromes ``S = H c``."""
    f = gf256()
    i = np.arange(nsym)[:, None]
    s = np.arange(n)[None, :]
    h = np.asarray(f.exp[(i * (n - 1 - s)) % f.N], dtype=np.uint8)
    h.flags.writeable = False
    return h
