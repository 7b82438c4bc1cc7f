"""The planted proposal for an event class whose single event comes in strata
(`EventClass.strata`: a latent sector error with 0, 1, 2, ... clustered neighbours in the
record, `faultmodels.nand_cluster`).

On the NVMe default a block is lost to one latent sector error only when two of its
neighbours land in the same record (three lost sectors in three shards: P about 3e-5 per
event), so neither a count tilt (more events: pairs of events are rarer still) nor the
conditional part reaches it. The plant draws the class with exactly one event, from a stratum
``j >= j0`` chosen with probability ``rho_j`` proportional to the model's ``pi_j`` over those
strata, and every other class at its own law.

The sampler realizes *every* single event of this class through the strata, whichever part
of the mixture draws it (equal in law to the class's own realization: tested in
tests/campaign/test_framing_model.py), and remembers the stratum, so the plant's density ratio
is known for any draw: on the latent (count, stratum, the stratum's own draw), with the other
classes at their own law,

    q_plant(z) / p(z) = 1{K = 1} rho_j / (P(K = 1) pi_j).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from faultmodels.base import ErrorPattern


class StrataPlant:
    """One class's strata, drawn plainly or planted from stratum ``first`` up."""

    def __init__(self, cls: Any, first: int) -> None:
        if cls.strata is None or cls.law != "poisson":
            raise ValueError("strata planting needs a Poisson class with strata")
        self.strata = cls.strata()
        self.pi = np.array([p for p, _ in self.strata], dtype=np.float64)
        if not 0 < first < self.pi.size or self.pi[first:].sum() <= 0.0:
            raise ValueError(f"no stratum from {first} on to plant")
        self.pi /= self.pi.sum()       # the dropped tail (below 1e-30) is not drawn
        self.rho = np.zeros_like(self.pi)
        self.rho[first:] = self.pi[first:] / self.pi[first:].sum()
        mu = float(cls.mu)
        self.log_p1 = math.log(mu) - mu          # P(K = 1)
        self.first = first

    def one(self, rng: np.random.Generator, planted: bool = False
            ) -> tuple[ErrorPattern, int]:
        """One event's pattern and its stratum, from ``pi`` (or ``rho``, planted)."""
        j = int(rng.choice(self.pi.size, p=self.rho if planted else self.pi))
        return self.strata[j][1](rng), j

    def log_ratio(self, k: int, j: int) -> float:
        """log q_plant / p of a draw with ``k`` events of this class, the one in stratum
        ``j`` when ``k == 1``."""
        if k != 1 or j < self.first:
            return -math.inf
        return math.log(self.rho[j]) - self.log_p1 - math.log(self.pi[j])
