"""The Reed-Solomon decoder's bookkeeping around the solver, as numba kernels.

Finding the codewords with a non-zero remainder and writing the corrections back into the data
took about as long as the LFSR pass itself when done with numpy on a 192 KiB block, and numpy's
small-array operations hold the GIL; as kernels (``nogil``) they cost a few microseconds, so
threads decoding blocks side by side no longer queue for the GIL.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from rkv.ecc._jit import jit

Arr = npt.NDArray[Any]


@jit
def remainders(calc: Arr, stored: Arr, rem: Arr, bad: Arr) -> int:
    """``calc[q, :nsym] ^ stored[q]`` for every codeword ``q``; the non-zero ones are packed
    into ``rem[:nb]`` with their codeword numbers in ``bad[:nb]``. Returns ``nb``."""
    ncw = stored.shape[0]
    nsym = stored.shape[1]
    nb = 0
    for q in range(ncw):
        nz = np.uint8(0)
        for p in range(nsym):
            x = calc[q, p] ^ stored[q, p]
            rem[nb, p] = x
            nz |= x
        if nz != 0:
            bad[nb] = q
            nb += 1
    return nb


@jit
def apply_fixes(out: Arr, bad: Arr, lens: Arr, pos: Arr, mag: Arr, cnt: Arr, inter: int,
                k: int) -> int:
    """XOR the solver's magnitudes into the data ``out`` (corrections that fall in parity are
    skipped); codeword ``q``'s data byte ``p`` sits at ``(q // I) I k + p I + q % I``. Returns
    the corrections in all; -1 when a codeword failed (``cnt < 0``), before writing any."""
    total = 0
    for r in range(bad.shape[0]):
        if cnt[r] < 0:
            return -1
        total += cnt[r]
    for r in range(bad.shape[0]):
        q = bad[r]
        for j in range(cnt[r]):
            p = pos[r, j]
            if p < lens[q]:
                off = (q // inter) * inter * k + p * inter + q % inter
                out[off] ^= np.uint8(mag[r, j])
    return total
