"""The planted proposal for a record's framing: its three voted header copies and its three
preludes, under independent bit errors.

The decoder tries every prelude and header copy, then the bitwise vote (docs/format.md), so a
group of three copies is lost only when every copy holds an error and some bit position is
wrong in two of them: three bits at the least (a pair of copies at one bit position, any bit
of the third copy). The plant forces such patterns, and, with probability ``pair_share``, the
two-bit half of one (one bit position in two copies), which a decoder that gave up on two bad
copies would lose: the campaign then measures, rather than assumes, that two wrong bits are
harmless.

A choice ``w`` (kind, group, copies, bits) plants a set ``F_w`` of distinct bits; for
independent bits of probability ``p`` the union with the model's own draw has
``P(x | w) = p(x) p^-|F_w| 1{F_w in x}``, so for *any* pattern ``x``

    q(x) / p(x) = (1 - pair_share) N3(x) / (|S3| p^3)
                  + pair_share sum_g N2_g(x) / (G |S2_g| p^2),

with the three-bit choices uniform over both groups (``|S3| = sum_g 3 B_g^2`` for copies of
``B_g`` bits: each group in proportion to its share of the loss), the two-bit ones over a
group drawn uniformly from the ``G`` groups (``|S2_g| = 3 B_g``: the 64-bit prelude gets as
many as the header), and ``N3``, ``N2_g`` the numbers of such choices inside ``x``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

PRELUDE_BYTES = 8
_PAIRS = ((0, 1, 2), (0, 2, 1), (1, 2, 0))


class FramingPlant:
    """Plants wrong framing bits and gives any pattern's density ratio (module docstring).

    ``plan`` is a :class:`~rkv.eval.faults.importance.TiltPlan`: ``plant`` (the header copies'
    offsets), ``plant_len`` (one copy's bytes), ``prelude`` (the preludes' offsets, or
    empty) and ``pair_share``; ``p`` is the bit error probability."""

    def __init__(self, plan: Any, p: float) -> None:
        self.groups: list[tuple[tuple[int, ...], int]] = [(tuple(plan.plant), 8 * plan.plant_len)]
        if plan.prelude:
            self.groups.append((tuple(plan.prelude), 8 * PRELUDE_BYTES))
        self.pair_share = float(plan.pair_share)
        sizes = np.array([b for _, b in self.groups], dtype=np.float64)
        self.mass = sizes ** 2 / float((sizes ** 2).sum())     # three-bit group shares
        self.log_s3 = math.log(3.0 * float((sizes ** 2).sum())) + 3 * math.log(p)
        self.log_s2 = [math.log(3.0 * b) + 2 * math.log(p) for _, b in self.groups]

    def plant(self, rng: np.random.Generator) -> np.ndarray:
        """The bit offsets (in the record) of one planted pattern."""
        pair = rng.random() < self.pair_share
        g = int(rng.integers(len(self.groups))) if pair else \
            int(rng.choice(len(self.groups), p=self.mass))
        starts, bits = self.groups[g]
        a, b, third = _PAIRS[int(rng.integers(3))]
        j, y = (int(v) for v in rng.integers(bits, size=2))
        st = [8 * s for s in starts]
        out = [st[a] + j, st[b] + j] if pair else [st[a] + j, st[b] + j, st[third] + y]
        return np.array(out, dtype=np.int64)

    def log_ratio(self, flips: np.ndarray) -> float:
        """log q_plant(x) / p(x) for a pattern with these flipped bits (sorted, distinct)."""
        n3 = 0
        terms = []
        for (starts, bits), log_s2 in zip(self.groups, self.log_s2, strict=True):
            sets = [flips[(flips >= 8 * s) & (flips < 8 * s + bits)] - 8 * s for s in starts]
            n2 = 0
            for a, b, third in _PAIRS:
                both = np.intersect1d(sets[a], sets[b], assume_unique=True).size
                n2 += both
                n3 += both * sets[third].size
            if n2 and self.pair_share > 0.0:
                terms.append(math.log(self.pair_share / len(self.groups)) + math.log(n2)
                             - log_s2)
        if n3 and self.pair_share < 1.0:
            terms.append(math.log1p(-self.pair_share) + math.log(n3) - self.log_s3)
        if not terms:
            return -math.inf
        top = max(terms)
        return top + math.log(math.fsum(math.exp(t - top) for t in terms))
