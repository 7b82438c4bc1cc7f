"""Algebraic decoding kernels over GF(2^m): syndromes, Berlekamp-Massey, root search, Forney.

Only codewords whose parity check failed reach these kernels; they receive the *remainder*
``r(x) = received(x) mod g(x)`` (re-encoded parity XOR received parity, ``E`` bytes), from which
the syndromes follow cheaply because ``g`` vanishes at every root: ``S_i = r(alpha^i)``.

Field tables come from :class:`rkv.ecc.gf.Field`: ``exp`` (``2N+2`` entries), ``log``
(``log[0] == -1``), ``qsol`` (solutions of ``y^2 + y = c``).

Positions: a codeword of ``nlen`` symbols has symbol ``p`` (0 = first = highest degree) at
degree ``e = nlen - 1 - p`` and locator ``X = alpha^e``.

Every decode is re-checked: the locator's degree must equal the number of distinct roots found
inside the (shortened) codeword, the errata count must be within the decoding radius, and the
syndromes of the corrected word must all be zero. Anything else is reported as uncorrectable.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from rkv.ecc._jit import jit

Arr = npt.NDArray[Any]


@jit
def _berlekamp_massey(
    s: Arr, nsyn: int, lam: Arr, b: Arr, tmp: Arr, ne: Any, expt: Arr, logt: Arr, n: int
) -> Any:
    """Errors-and-erasures Berlekamp-Massey (Massey's form, started from the erasures).

    ``lam`` holds the erasure locator on entry (degree ``ne``) and the errata locator on exit;
    ``b`` and ``tmp`` are scratch of the same size. Returns the register length ``L``.
    Coefficients past ``size - 1`` are dropped (only in hopeless cases; the caller re-checks).
    """
    size = lam.shape[0]
    for i in range(size):
        b[i] = lam[i]
    deg_c = ne
    deg_b = ne
    big_l = ne
    shift = 1
    log_bb = 0  # log of the discrepancy that produced b (b is kept unnormalised)
    for r in range(ne, nsyn):
        delta = 0
        for j in range(min(r, deg_c) + 1):
            a = lam[j]
            c = s[r - j]
            if a != 0 and c != 0:
                delta ^= expt[logt[a] + logt[c]]
        if delta == 0:
            shift += 1
            continue
        coef = (logt[delta] - log_bb) % n  # log of delta / bb
        if 2 * big_l <= r + ne:
            for i in range(deg_c + 1):
                tmp[i] = lam[i]
            old_deg = deg_c
            for i in range(deg_b + 1):
                c = b[i]
                if c != 0 and i + shift < size:
                    lam[i + shift] ^= expt[logt[c] + coef]
            deg_c = max(deg_c, min(deg_b + shift, size - 1))
            for i in range(old_deg + 1):
                b[i] = tmp[i]
            for i in range(old_deg + 1, size):
                b[i] = 0
            deg_b = old_deg
            log_bb = logt[delta]
            big_l = r + 1 + ne - big_l
            shift = 1
        else:
            for i in range(deg_b + 1):
                c = b[i]
                if c != 0 and i + shift < size:
                    lam[i + shift] ^= expt[logt[c] + coef]
            deg_c = max(deg_c, min(deg_b + shift, size - 1))
            shift += 1
    return big_l


@jit
def _degree(p: Arr) -> int:
    for i in range(p.shape[0] - 1, -1, -1):
        if p[i] != 0:
            return i
    return 0


@jit
def _quad_roots(
    l1: int, l2: int, e0: int, nlen: int, expt: Arr, logt: Arr, qsol: Arr, n: int, out: Arr,
    cnt: int,
) -> int:
    """Roots of ``1 + l1 z + l2 z^2`` (``l2 != 0``) as exponents in ``[e0, nlen)``.

    The locators solve ``X^2 + l1 X + l2 = 0``; ``X = l1 y`` turns that into
    ``y^2 + y = l2 / l1^2``, looked up in ``qsol``. Appends to ``out`` from ``cnt`` on.
    """
    if l1 == 0:
        return cnt  # a double root: not two distinct error positions
    c = expt[(logt[l2] - 2 * logt[l1]) % n]
    y = qsol[c]
    if y <= 1:
        return cnt
    e = (logt[l1] + logt[y]) % n
    if e0 <= e < nlen:
        out[cnt] = e
        cnt += 1
    e = (logt[l1] + logt[y ^ 1]) % n
    if e0 <= e < nlen:
        out[cnt] = e
        cnt += 1
    return cnt


@jit
def _find_roots(
    lam: Arr, deg: int, nlen: int, expt: Arr, logt: Arr, qsol: Arr, n: int, scratch: Arr,
    out: Arr,
) -> int:
    """Exponents ``e < nlen`` with ``lam(alpha^-e) == 0`` into ``out``; returns their count.

    Chien search that deflates the polynomial by each root it finds (so later positions cost
    less) and finishes the last two roots in closed form. Degree 1 and 2 need no search.
    A polynomial that does not split into distinct roots inside the codeword returns fewer
    than ``deg`` roots. ``scratch`` needs ``3 * (deg + 1)`` entries.
    """
    if deg == 0:
        return 0
    third = scratch.shape[0] // 3
    poly = scratch[:third]
    lgs = scratch[third : 2 * third]
    stp = scratch[2 * third :]
    for j in range(deg + 1):
        poly[j] = lam[j]
    d = deg
    cnt = 0
    e0 = 0
    while d > 2:
        nt = 0
        for j in range(1, d + 1):
            c = poly[j]
            if c != 0:
                lgs[nt] = (logt[c] - (j * e0) % n) % n
                stp[nt] = j
                nt += 1
        found = -1
        unt = np.uint64(nt)
        for e in range(e0, nlen):
            v = 1
            for q in range(unt):  # unsigned indices: no wraparound checks in the hot loop
                x = lgs[q]
                v ^= expt[np.uint64(x)]
                x -= stp[q]
                x += (x >> 63) & n
                lgs[q] = x
            if v == 0:
                found = e
                break
        if found < 0:
            return cnt
        out[cnt] = found
        cnt += 1
        # deflate: poly(z) = (1 + X z) Q(z), X = alpha^found; Q_j = poly_j + X Q_(j-1)
        prev = 1
        for j in range(1, d):
            qj = poly[j] ^ (expt[logt[prev] + found] if prev != 0 else 0)
            poly[j] = qj
            prev = qj
        if poly[d] != (expt[logt[prev] + found] if prev != 0 else 0):
            return cnt
        poly[d] = 0
        d -= 1
        e0 = found + 1
    if d == 2:
        return _quad_roots(poly[1], poly[2], e0, nlen, expt, logt, qsol, n, out, cnt)
    e = logt[poly[1]] if poly[1] != 0 else n
    if e0 <= e < nlen:
        out[cnt] = e
        cnt += 1
    return cnt


@jit
def _rs_solve(
    synd: Arr,
    nsym: int,
    nlen: int,
    epos: Arr,
    ne: int,
    expt: Arr,
    logt: Arr,
    qsol: Arr,
    n: int,
    lam: Arr,
    b: Arr,
    tmp: Arr,
    omega: Arr,
    lg: Arr,
    roots: Arr,
    out_pos: Arr,
    out_mag: Arr,
) -> int:
    """Errors-and-erasures RS decoding of one codeword from its syndromes (first root alpha^0).

    ``epos[:ne]`` are erased symbol positions. Writes the positions and (non-zero) error
    magnitudes into ``out_pos``/``out_mag`` and returns how many, or -1 if uncorrectable.
    """
    if ne > nsym:
        return -1
    size = lam.shape[0]
    for i in range(size):
        lam[i] = 0
    lam[0] = 1
    # erasure locator: prod (1 + X_j z)
    for q in range(ne):
        lx = nlen - 1 - epos[q]
        for i in range(q + 1, 0, -1):
            c = lam[i - 1]
            if c != 0:
                lam[i] ^= expt[logt[c] + lx]
    big_l = _berlekamp_massey(synd, nsym, lam, b, tmp, ne, expt, logt, n)
    deg = _degree(lam)
    if deg != big_l or 2 * big_l - ne > nsym or deg == 0:
        return -1
    nroots = _find_roots(lam, deg, nlen, expt, logt, qsol, n, lg, roots)
    if nroots != deg:
        return -1
    # errors outside the erasure set must stay within the decoding radius: 2e + ne <= nsym
    n_err = 0
    for r in range(nroots):
        p = nlen - 1 - roots[r]
        hit = False
        for q in range(ne):
            if epos[q] == p:
                hit = True
                break
        if not hit:
            n_err += 1
    if 2 * n_err + ne > nsym:
        return -1
    # error evaluator omega(z) = S(z) lam(z) mod z^nsym  (only degrees < deg are needed)
    for i in range(deg):
        acc = 0
        for j in range(min(i, deg) + 1):
            a = lam[j]
            c = synd[i - j]
            if a != 0 and c != 0:
                acc ^= expt[logt[a] + logt[c]]
        omega[i] = acc
    cnt = 0
    for r in range(nroots):
        e = roots[r]
        xinv = (n - e) % n  # log of X^-1
        # omega(X^-1)
        num = 0
        for i in range(deg):
            a = omega[i]
            if a != 0:
                num ^= expt[logt[a] + (xinv * i) % n]
        # lam'(X^-1) = sum over odd j of lam_j X^-(j-1)
        den = 0
        for j in range(1, deg + 1, 2):
            a = lam[j]
            if a != 0:
                den ^= expt[logt[a] + (xinv * (j - 1)) % n]
        if den == 0:
            return -1
        if num == 0:
            continue  # an erased symbol that was in fact right
        mag = expt[(logt[num] - logt[den] + e) % n]  # X * omega / lam'
        out_pos[cnt] = nlen - 1 - e
        out_mag[cnt] = mag
        cnt += 1
    # re-check: the syndromes of the corrected word must vanish
    for i in range(nsym):
        acc = synd[i]
        for r in range(cnt):
            e = nlen - 1 - out_pos[r]
            acc ^= expt[logt[out_mag[r]] + (e * i) % n]
        if acc != 0:
            return -1
    return cnt


@jit
def rs_decode_batch(
    rem: Arr,
    nlens: Arr,
    eptr: Arr,
    epos: Arr,
    expt: Arr,
    logt: Arr,
    qsol: Arr,
    out_pos: Arr,
    out_mag: Arr,
    out_cnt: Arr,
) -> None:
    """Decode the codewords whose remainders are the rows of ``rem`` (``(nb, nsym)`` uint8).

    ``nlens[q]`` is the (shortened) length of codeword ``q``; its erasures are
    ``epos[eptr[q]:eptr[q+1]]`` (positions within the codeword). Results: ``out_cnt[q]`` is the
    number of corrected symbols or -1, their positions/magnitudes in ``out_pos[q]``,
    ``out_mag[q]`` (each ``(nb, nsym)``).
    """
    nb = rem.shape[0]
    nsym = rem.shape[1]
    n = expt.shape[0] // 2 - 1
    synd = np.zeros(nsym + 2, dtype=np.int64)
    lam = np.zeros(nsym + 2, dtype=np.int64)
    b = np.zeros(nsym + 2, dtype=np.int64)
    tmp = np.zeros(nsym + 2, dtype=np.int64)
    omega = np.zeros(nsym + 2, dtype=np.int64)
    lg = np.zeros(3 * nsym + 6, dtype=np.int64)
    roots = np.zeros(nsym + 2, dtype=np.int64)
    pos = np.zeros(nsym + 2, dtype=np.int64)
    mag = np.zeros(nsym + 2, dtype=np.int64)
    ep = np.zeros(nsym + 2, dtype=np.int64)
    for q in range(nb):
        # syndromes S_i = r(alpha^i), r_p at degree nsym-1-p
        for i in range(nsym):
            synd[i] = 0
        for p in range(nsym):
            c = rem[q, p]
            if c == 0:
                continue
            idx = logt[c]
            step = nsym - 1 - p
            for i in range(nsym):
                synd[i] ^= expt[idx]
                idx += step
                if idx >= n:
                    idx -= n
        nz = False
        for i in range(nsym):
            if synd[i] != 0:
                nz = True
        ne = eptr[q + 1] - eptr[q]
        if ne > nsym:
            out_cnt[q] = -1
            continue
        if not nz:
            out_cnt[q] = 0
            continue
        for i in range(ne):
            ep[i] = epos[eptr[q] + i]
        cnt = _rs_solve(
            synd, nsym, nlens[q], ep, ne, expt, logt, qsol, n, lam, b, tmp, omega, lg, roots,
            pos, mag,
        )
        out_cnt[q] = cnt
        for i in range(max(cnt, 0)):
            out_pos[q, i] = pos[i]
            out_mag[q, i] = mag[i]


@jit
def rs_decode_columns(
    synd: Arr,
    cols: Arr,
    nlen: int,
    epos: Arr,
    expt: Arr,
    logt: Arr,
    qsol: Arr,
    out_pos: Arr,
    out_mag: Arr,
    out_cnt: Arr,
) -> None:
    """Like :func:`rs_decode_batch` from precomputed syndromes: ``synd`` is ``(nsym, ncols)``
    uint8 and only columns ``cols`` are decoded, all of length ``nlen`` with erasures ``epos``.
    """
    nsym = synd.shape[0]
    n = expt.shape[0] // 2 - 1
    s = np.zeros(nsym + 2, dtype=np.int64)
    lam = np.zeros(nsym + 2, dtype=np.int64)
    b = np.zeros(nsym + 2, dtype=np.int64)
    tmp = np.zeros(nsym + 2, dtype=np.int64)
    omega = np.zeros(nsym + 2, dtype=np.int64)
    lg = np.zeros(3 * nsym + 6, dtype=np.int64)
    roots = np.zeros(nsym + 2, dtype=np.int64)
    pos = np.zeros(nsym + 2, dtype=np.int64)
    mag = np.zeros(nsym + 2, dtype=np.int64)
    ne = epos.shape[0]
    for q in range(cols.shape[0]):
        c = cols[q]
        for i in range(nsym):
            s[i] = synd[i, c]
        cnt = _rs_solve(
            s, nsym, nlen, epos, ne, expt, logt, qsol, n, lam, b, tmp, omega, lg, roots, pos,
            mag,
        )
        out_cnt[q] = cnt
        for i in range(max(cnt, 0)):
            out_pos[q, i] = pos[i]
            out_mag[q, i] = mag[i]


@jit
def bch_decode_batch(
    rem: Arr,
    nbits: Arr,
    btab: Arr,
    step8: Arr,
    fix: Arr,
    expt: Arr,
    logt: Arr,
    qsol: Arr,
    out_pos: Arr,
    out_cnt: Arr,
) -> None:
    """Binary BCH decoding of the codewords whose remainders are the rows of ``rem``.

    ``rem`` is ``(nb, E)`` uint8, top-aligned (bit 7 of byte 0 is the coefficient of
    ``x^(deg_g-1)``, ``pad = 8E - deg_g`` zero bits at the end); ``nbits[q]`` the codeword
    length in bits. Syndrome tables (``t`` = their width): ``btab[v, jj]`` is the byte ``v`` read
    as a polynomial at ``alpha^(2jj+1)``; ``step8[jj] = log alpha^(8(2jj+1))`` and
    ``fix[jj] = log alpha^(-(2jj+1) pad)`` (all mod N). Writes the error *exponents*
    ``e`` (bit at degree ``e``; the bit index from the start is ``nbits-1-e``) into
    ``out_pos[q]`` and their count into ``out_cnt[q]`` (-1: uncorrectable).
    """
    nb = rem.shape[0]
    ebytes = rem.shape[1]
    t = btab.shape[1]
    n = expt.shape[0] // 2 - 1
    nsyn = 2 * t
    acc = np.zeros(t, dtype=np.int64)
    lg = np.zeros(3 * nsyn + 6, dtype=np.int64)
    synd = np.zeros(nsyn + 2, dtype=np.int64)
    lam = np.zeros(nsyn + 2, dtype=np.int64)
    b = np.zeros(nsyn + 2, dtype=np.int64)
    tmp = np.zeros(nsyn + 2, dtype=np.int64)
    roots = np.zeros(nsyn + 2, dtype=np.int64)
    for q in range(nb):
        # odd syndromes S_j = r(alpha^j), j = 1, 3, ..., 2t-1 (synd[j-1] holds S_j), by Horner
        # over the remainder bytes: acc_j <- acc_j * alpha^(8j) + (byte value at alpha^j)
        for jj in range(t):
            acc[jj] = 0
        for by in range(ebytes):
            v = rem[q, by]
            for jj in range(t):
                a = acc[jj]
                if a != 0:
                    a = expt[logt[a] + step8[jj]]
                acc[jj] = a ^ btab[v, jj]
        for jj in range(t):
            a = acc[jj]
            synd[2 * jj] = expt[logt[a] + fix[jj]] if a != 0 else 0
        nz = False
        for j in range(0, nsyn, 2):
            if synd[j] != 0:
                nz = True
        if not nz:
            out_cnt[q] = 0
            continue
        # even syndromes: S_2j = S_j^2
        for j in range(2, nsyn + 1, 2):
            h = synd[j // 2 - 1]
            synd[j - 1] = expt[2 * logt[h]] if h != 0 else 0
        for i in range(lam.shape[0]):
            lam[i] = 0
        lam[0] = 1
        big_l = _berlekamp_massey(synd, nsyn, lam, b, tmp, np.int64(0), expt, logt, n)
        deg = _degree(lam)
        if deg != big_l or deg > t or deg == 0:
            out_cnt[q] = -1
            continue
        nroots = _find_roots(lam, deg, nbits[q], expt, logt, qsol, n, lg, roots)
        if nroots != deg:
            out_cnt[q] = -1
            continue
        ok = True
        for j in range(0, nsyn, 2):
            chk = synd[j]
            for r in range(nroots):
                chk ^= expt[(roots[r] * (j + 1)) % n]
            if chk != 0:
                ok = False
                break
        if not ok:
            out_cnt[q] = -1
            continue
        out_cnt[q] = nroots
        for r in range(nroots):
            out_pos[q, r] = roots[r]
