"""Counting and placement helpers of the DRAM model (internal): its resolved fault classes
(`_Cls`, shared with :mod:`faultmodels.dram_secded`), how many fault origins touch a region,
how many origin pairs share a word, how long a fault persists, and where a fault that touches
a buffer lies. Exact integer counting, checked by brute force in the tests."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ._dist import IntArray, runs


@dataclass(frozen=True)
class _Cls:
    """One (mode, persistence) class with its resolved geometry."""

    mode: str
    kind: str
    transient: bool
    rate: float  # faults per byte of memory per hour
    span: int
    stride: int
    count: int
    bits: int
    fate: str  # "escape" | "secded" (split by the Hsiao code) | "correct" | "ondie"


def _hits(n: int, count: int, stride: int) -> int:
    """Number of origins whose `count` positions at `stride` touch an n-unit region."""
    return n + (count - 1) * min(stride, n)


def _sum_min_ramp(a: int, n: int, c: int) -> float:
    """Sum over the origins of a run of length a that touch an n-unit region of
    min(c, overlap length)."""
    m, big = min(a, n), max(a, n)

    def s(k: int) -> float:  # sum_{l=1..k} min(c, l)
        if k <= 0:
            return 0.0
        if c >= k:
            return k * (k + 1) / 2.0
        return c * (c + 1) / 2.0 + c * (k - c)

    return 2.0 * s(m - 1) + (big - m + 1) * min(c, m)


def _pairs(n: int, ai: int, si: int, aj: int, sj: int) -> float:
    """Ordered origin pairs (o_i, o_j) whose affected words share a word inside an n-word
    region. Exact for equal strides and for a run against a lattice; a union bound (expected
    shared words) for two lattices of different strides."""
    si = 1 if ai == 1 else si
    sj = 1 if aj == 1 else sj
    if si == sj:
        return float(ai) * n + float(_hits(n, ai, si)) * (aj - 1)
    if si == 1:
        return float(ai) * n + (aj - 1) * _sum_min_ramp(ai, n, sj)
    if sj == 1:
        return float(aj) * n + (ai - 1) * _sum_min_ramp(aj, n, si)
    return float(n) * ai * aj


def _persist_integral(h: float, tau: float) -> float:
    """integral_{0<ta<tb<h} P(a fault born at ta is still present at tb); a fault lasts
    until the next scrub (period tau, uniform phase) or forever (tau = inf)."""
    if math.isinf(tau):
        return h * h / 2.0
    if h <= tau:
        return h * h / 2.0 - h ** 3 / (6.0 * tau)
    return tau * tau / 3.0 + (h - tau) * tau / 2.0


def _line_erasures(byte_idx: IntArray, line: int, n: int) -> list[tuple[int, int, str]]:
    lines = np.unique(byte_idx // line)
    starts, ends = runs(lines)
    out = []
    for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
        a, b = s * line, min(e * line, n)
        out.append((a, b - a, "poison"))
    return out


def _in_range(o: int, count: int, stride: int, n: int) -> tuple[int, int]:
    """Index range [klo, khi] of positions o + k*stride (0 <= k < count) inside [0, n)."""
    klo = max(0, -(o // stride))
    khi = min(count - 1, (n - 1 - o) // stride)
    return klo, khi


def _hit_origin(count: int, stride: int, n: int, rng: np.random.Generator) -> int:
    """A uniform origin among those whose positions touch [0, n)."""
    if count == 1 or stride >= n:
        k = int(rng.integers(count))
        return int(rng.integers(n)) - k * stride
    return int(rng.integers(-(count - 1) * stride, n))


def lane_counts(n: int, wb: int) -> IntArray:
    """Bytes of each byte lane (offset within a ``wb``-byte bus word) in [0, n)."""
    lanes = np.arange(wb, dtype=np.int64)
    return np.maximum(0, -(-(n - lanes) // wb))
