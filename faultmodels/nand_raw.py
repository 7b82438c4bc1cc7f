"""Raw (unprotected) NAND bit errors with overdispersion: beta-binomial per codeword-sized
group (Taranalli et al.), internal to `faultmodels.nand`."""

from __future__ import annotations

import math

import numpy as np

from ._dist import (
    FloatArray,
    IntArray,
    bb_log_p0,
    bb_zt_cdf,
    beta_params,
    distinct,
    first_nonzero_index,
    sample_from_cdf,
)
from .base import ErrorPattern, EventClass, EventRate

__all__ = ["raw_bb_class"]


def raw_bb_class(n: int, p: float, rate: EventRate, overdispersion: float,
                 codeword_bytes: int) -> EventClass:
    """Raw bit errors of an n-byte buffer with per-bit probability p, beta-binomial per
    codeword-sized group (``overdispersion`` > 0; the groups are ``codeword_bytes`` long)."""
    alpha, beta = beta_params(p, overdispersion)
    cw = codeword_bytes
    full, tail = divmod(n, cw)
    groups = []  # (units, log P(unit empty), bits per unit, first unit index)
    if full:
        groups.append((full, bb_log_p0(8 * cw, alpha, beta), 8 * cw, 0))
    if tail:
        groups.append((1, bb_log_p0(8 * tail, alpha, beta), 8 * tail, full))
    log_p0 = math.fsum(u * lz for u, lz, _, _ in groups)
    cdfs: dict[int, FloatArray] = {}

    def realize_units(idx: IntArray, m: int, first: int,
                      rng: np.random.Generator) -> list[IntArray]:
        cdf = cdfs.get(m)
        if cdf is None:
            cdf = cdfs[m] = bb_zt_cdf(m, alpha, beta)
        counts = sample_from_cdf(cdf, idx.size, rng)
        out = []
        for u, c in zip(idx.tolist(), counts.tolist(), strict=True):
            out.append(distinct(m, c, rng) + (first + u) * 8 * cw)
        return out

    def draw_nonzero(rng: np.random.Generator) -> ErrorPattern:
        parts: list[IntArray] = []
        chosen = False
        for gi, (units, lz, m, first) in enumerate(groups):
            q_unit = -math.expm1(lz)
            if not chosen:
                rest = math.fsum(u * z for u, z, _, _ in groups[gi:])
                here = units * lz
                q = 1.0 if here == rest else (-math.expm1(here)) / (-math.expm1(rest))
                if q < 1.0 and rng.random() >= q:
                    continue
                j = first_nonzero_index(units, lz, rng)
                later = units - j - 1
                nz = int(rng.binomial(later, q_unit)) if later > 0 else 0
                idx = np.concatenate(([j], j + 1 + distinct(later, nz, rng))).astype(np.int64)
                chosen = True
            else:
                nz = int(rng.binomial(units, q_unit))
                idx = distinct(units, nz, rng)
            if idx.size:
                parts.extend(realize_units(idx, m, first, rng))
        return ErrorPattern(n, np.concatenate(parts))

    return EventClass(rate, log_p0, draw_nonzero)
