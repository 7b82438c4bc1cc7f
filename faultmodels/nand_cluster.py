"""One latent sector error with its spatial cluster, split by how many of its clustered
neighbours land in the buffer (`EventClass.strata`).

`NandModel`'s latent-sector class realizes an event as a primary sector uniform over the
buffer's ``n_s`` sectors plus ``G`` neighbours, ``G`` geometric (``P(G = g) = (1 - q) q^g``),
each at an offset uniform in ``+-[1, w]`` sectors. A neighbour of primary ``s`` falls inside
with probability ``r_s = (min(w, s) + min(w, n_s - 1 - s)) / (2 w)``, so the number ``J`` inside
is geometric too (a thinned geometric): ``P(J = j | s) = (1 - b_s) b_s^j`` with
``b_s = q r_s / (1 - q + q r_s)``. Given ``J = j``, ``s`` has the posterior
``(1 - b_s) b_s^j`` (normalized) and the ``j`` neighbours are uniform among ``s``'s in-buffer
neighbours. Drawing stratum by stratum lets a judge weigh the rare strata (a primary with two
neighbours in one record: what three lost sectors need) at their exact probability instead of
as the share of a few thousand draws, where they round to 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from .pattern import ErrorPattern

Stratum = tuple[float, Callable[[np.random.Generator], ErrorPattern]]


def lse_strata(n_s: int, w: int, q: float, erase: Callable[[np.ndarray], ErrorPattern],
               tiny: float = 1e-30, most: int = 64) -> list[Stratum]:
    """(P(J = j), a draw of one event given J = j) for j = 0, 1, ... while the stratum's
    probability is at least ``tiny`` (at most ``most`` strata); ``erase`` turns sector
    indices into the event's pattern."""
    s = np.arange(n_s, dtype=np.int64)
    left, right = np.minimum(w, s), np.minimum(w, n_s - 1 - s)
    r = (left + right) / (2.0 * w)
    b = q * r / (1.0 - q + q * r)
    out: list[Stratum] = []
    for j in range(most):
        weight = (1.0 - b) * b ** j
        pj = float(weight.mean())
        if pj < tiny or not pj > 0.0:
            break
        post = weight / weight.sum()

        def draw(rng: np.random.Generator, j: int = j, post: np.ndarray = post
                 ) -> ErrorPattern:
            prim = int(rng.choice(n_s, p=post))
            lo, hi = int(left[prim]), int(right[prim])
            # in-buffer neighbours: offsets -lo..-1 and 1..hi
            pick = rng.integers(0, lo + hi, size=j) if j else np.empty(0, np.int64)
            pos = np.where(pick < lo, prim - lo + pick, prim + 1 + (pick - lo))
            return erase(np.concatenate(([prim], pos)).astype(np.int64))

        out.append((pj, draw))
    return out


def strata_mass(strata: list[Stratum]) -> float:
    """The probability the strata cover (1 up to the dropped tail)."""
    return math.fsum(p for p, _ in strata)
