"""The planted proposal for shard RS codes (``shardrs(k=K, m=M)``) under independent bits.

A shard code loses a block to bit errors when some byte column holds ``a = m // 2 + 1``
wrong bytes (in ``a`` distinct shards) and more than ``m`` shards are damaged in all (their
bytes or their checksum entries), so the fewest bits that lose a block are ``m + 1``:
``a`` in one column and ``r = m + 1 - a`` in other shards. The proposal plants exactly that
on top of the model's own draw (docs/rare-events.md, "Planting for shard codes"):

* a column ``c`` uniform in ``[0, S)``;
* ``a`` distinct shards ``A`` uniform among the ``n = k + m``, and in each the byte at
  column ``c`` gets one wrong bit (uniform among its 8);
* ``r`` distinct further shards ``B`` uniform among the other ``n - a``, and each gets one
  wrong bit uniform among the ``8 (S + C)`` bits of its bytes and its checksum entry;
* the planted bits are forced wrong (a union with the model's flips).

Each choice ``w`` plants a set ``F_w`` of ``m + 1`` distinct bits, and for independent bits
of probability ``p`` the union has ``P(x | w) = p(x) p^-(m+1) 1{F_w in x}`` (the planted
bits may or may not have flipped already). So for *any* pattern ``x``

    q(x) / p(x) = N(x) / (|W| p^(m+1)),  |W| = S C(n, a) 8^a C(n - a, r) (8 (S + C))^r,

with ``N(x)`` the number of choices planted inside ``x``:
``N(x) = sum_c [y^a z^r] prod_s (1 + n_sc y + u_s z)``, where ``n_sc`` counts the flipped
bits of shard ``s`` in column ``c`` and ``u_s`` those of shard ``s`` (bytes and checksum
entry): each shard is in ``A`` (one of its ``n_sc`` bits), in ``B`` (one of its ``u_s``) or
in neither. Only columns with at least ``a`` flipped shards contribute, and the factors of
the shards without a flip in ``c`` are the same for every column.
"""

from __future__ import annotations

import math
from itertools import pairwise

import numpy as np


class ShardPlant:
    """Plants ``m + 1`` wrong bits in a shard record and gives any pattern's density ratio.

    ``geom``: ``(payload_off, n, m, shard_bytes, check_bytes)``, byte offsets in the record
    (the shards follow one another from ``payload_off``, then the ``n`` checksum entries).
    """

    def __init__(self, geom: tuple[int, ...], p: float, nbytes: int) -> None:
        off, n, m, s, ch = (int(v) for v in geom)
        if not (0 < m < n and s > 0 and ch > 0 and off >= 0 and 0.0 < p < 1.0):
            raise ValueError(f"bad shard planting {geom} at p = {p}")
        if off + n * (s + ch) > nbytes:
            raise ValueError("the shards do not fit in the record")
        self.off, self.n, self.m, self.s, self.ch = off, n, m, s, ch
        self.a = m // 2 + 1
        self.r = m + 1 - self.a
        self.ubits = 8 * (s + ch)
        self.log_norm = (math.log(s) + math.log(math.comb(n, self.a)) + self.a * math.log(8)
                         + math.log(math.comb(n - self.a, self.r))
                         + self.r * math.log(self.ubits) + (m + 1) * math.log(p))

    def plant(self, rng: np.random.Generator) -> np.ndarray:
        """The ``m + 1`` planted bit offsets (distinct, unsorted)."""
        c = int(rng.integers(self.s))
        shards = rng.choice(self.n, size=self.a + self.r, replace=False).astype(np.int64)
        a_sh, b_sh = shards[: self.a], shards[self.a:]
        col = 8 * (self.off + a_sh * self.s + c) + rng.integers(8, size=self.a)
        u = rng.integers(self.ubits, size=self.r)
        in_shard = u < 8 * self.s
        other = np.where(in_shard, 8 * (self.off + b_sh * self.s) + u,
                         8 * (self.off + self.n * self.s + b_sh * self.ch) + u - 8 * self.s)
        return np.concatenate((col, other)).astype(np.int64)

    def count(self, flips: np.ndarray) -> int:
        """``N(x)``: the plantings whose bits all lie in ``flips`` (bit offsets, unique)."""
        b = flips // 8 - self.off
        keep = (b >= 0) & (b < self.n * (self.s + self.ch))
        b = b[keep]
        if b.size < self.m + 1:
            return 0
        in_sh = b < self.n * self.s
        owner = np.where(in_sh, b // self.s, (b - self.n * self.s) // self.ch)
        u = np.bincount(owner, minlength=self.n)
        # per (shard, column) flipped bits, and the columns with at least a flipped shards
        cell, n_sc = np.unique(b[in_sh], return_counts=True)
        if (np.count_nonzero(u) < self.m + 1) or cell.size < self.a:
            return 0
        cols = cell % self.s
        order = np.argsort(cols, kind="stable")
        cell, n_sc, cols = cell[order], n_sc[order], cols[order]
        _, first, per = np.unique(cols, return_index=True, return_counts=True)
        cand = np.flatnonzero(per >= self.a)
        if cand.size == 0:
            return 0
        # Q(z) = prod_s (1 + u_s z) up to z^r, over every shard
        base = [1] + [0] * self.r
        for us in u[u > 0].tolist():
            base = _mul_lin(base, us)
        total = 0
        for j in cand.tolist():
            lo, hi = int(first[j]), int(first[j] + per[j])
            sh = (cell[lo:hi] // self.s).tolist()
            ns = n_sc[lo:hi].tolist()
            # divide out the column's shards' (1 + u_s z), then multiply (1 + n y + u z)
            qz = base
            for s_ in sh:
                qz = _div_lin(qz, int(u[s_]))
            poly = [qz] + [[0] * (self.r + 1) for _ in range(self.a)]   # poly[y][z]
            for s_, nv in zip(sh, ns, strict=True):
                poly = _mul_shard(poly, nv, int(u[s_]))
            total += poly[self.a][self.r]
        return total

    def log_ratio(self, flips: np.ndarray) -> float:
        """log q(x) / p(x) of the planting for a pattern whose bit class flipped ``flips``."""
        n = self.count(flips)
        return math.log(n) - self.log_norm if n else -math.inf


def _mul_lin(poly: list[int], u: int) -> list[int]:
    """poly(z) (1 + u z), truncated to poly's degree."""
    return [poly[0]] + [c + u * d for d, c in pairwise(poly)]


def _div_lin(poly: list[int], u: int) -> list[int]:
    """poly(z) / (1 + u z) as a power series, truncated (exact when the factor divides)."""
    out = [poly[0]]
    for c in poly[1:]:
        out.append(c - u * out[-1])
    return out


def _mul_shard(poly: list[list[int]], nv: int, u: int) -> list[list[int]]:
    """poly(y, z) (1 + nv y + u z), truncated to poly's degrees."""
    out = []
    for i, row in enumerate(poly):
        new = [row[0]] + [c + u * d for d, c in pairwise(row)]
        if i:
            new = [x + nv * y for x, y in zip(new, poly[i - 1], strict=True)]
        out.append(new)
    return out
