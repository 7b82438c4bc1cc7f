"""An online reuse predictor: will a block be referenced again within a horizon?

Learned from what a cache sees and nothing else. Each reference of a key starts an
*observation* in a feature cell (a tuple of small integers the caller chooses, most
informative first); the next reference of the same key within ``horizon`` clock units labels
it positive, and an observation older than the horizon with no reference is labelled negative
(resolved lazily, oldest first, so memory holds only the observations of the last horizon).
The estimate of a cell is its share of positives, backed off to shorter prefixes of the cell
tuple (``cell[:k]``, down to the empty tuple, the global rate) while a cell has fewer than
``min_weight`` labels, so a rare combination borrows from its coarser parent instead of
answering from three samples.

Labels are weighted by ``exp(t / memory)`` (``t``: the clock when the label was given), so
estimates follow a workload that changes, over about ``memory`` clock units; the weights are
rescaled before they overflow. This is the relaxed-Belady idea of LRB (Song et al., NSDI'20)
reduced to a table: the boundary is the horizon, and the learner is a back-off frequency table
instead of a boosted tree, which costs a few dictionary operations per reference.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable

from policies.base import PolicyError

Cell = tuple[int, ...]

#: Rescale the label weights when they pass this (exp overflows near 1e308).
_RESCALE_AT = 1e200


class ReusePredictor:
    """P(a reference is followed by another of the same key within ``horizon``), per cell.

    ``horizon`` may be changed between calls (a cache sets it from its eviction age);
    ``prior`` answers while nothing is labelled; ``min_weight`` is the labelled weight (in
    labels) a cell needs before it answers for itself.
    """

    def __init__(self, horizon: float = 100.0, *, memory: float = 4096.0,
                 min_weight: float = 32.0, prior: float = 0.3) -> None:
        if not (horizon > 0 and math.isfinite(horizon)):
            raise PolicyError(f"horizon must be a finite number > 0, got {horizon!r}")
        if not (memory > 0 and math.isfinite(memory)):
            raise PolicyError(f"memory must be a finite number > 0, got {memory!r}")
        if not min_weight >= 1:
            raise PolicyError(f"min_weight must be >= 1, got {min_weight!r}")
        if not 0 <= prior <= 1:
            raise PolicyError(f"prior must be in [0, 1], got {prior!r}")
        self.horizon = float(horizon)
        self.memory = float(memory)
        self.min_weight = float(min_weight)
        self.prior = float(prior)
        #: (positives, labels) per cell prefix, weighted.
        self._counts: dict[Cell, list[float]] = {}
        #: key -> (start, cell, serial) of its open observation.
        self._open: dict[Hashable, tuple[float, Cell, int]] = {}
        self._queue: deque[tuple[float, Hashable, int]] = deque()
        self._serial = 0
        self._origin = 0.0          # clock the weights are relative to
        self._unit = 1.0            # the weight of one label given at ``_origin``
        self.labels = 0             # labels given (unweighted), for inspection

    # -- told ----------------------------------------------------------------------------------
    def observe(self, key: Hashable, cell: Cell, now: float) -> None:
        """``key`` was referenced at ``now``, in ``cell``: label its open observation (a
        reference within the horizon: positive) and open a new one."""
        self.expire(now)
        old = self._open.get(key)
        if old is not None:
            self._label(old[1], now - old[0] <= self.horizon, now)
        self._serial += 1
        self._open[key] = (now, cell, self._serial)
        self._queue.append((now, key, self._serial))

    def expire(self, now: float) -> None:
        """Label negative every open observation older than the horizon at ``now``."""
        queue, opened, horizon = self._queue, self._open, self.horizon
        while queue and now - queue[0][0] > horizon:
            _, key, serial = queue.popleft()
            got = opened.get(key)
            if got is not None and got[2] == serial:
                del opened[key]
                self._label(got[1], False, now)

    def _label(self, cell: Cell, positive: bool, now: float) -> None:
        w = self._weight(now)
        counts = self._counts
        for k in range(len(cell) + 1):
            c = counts.get(cell[:k])
            if c is None:
                c = counts[cell[:k]] = [0.0, 0.0]
            if positive:
                c[0] += w
            c[1] += w
        self.labels += 1

    def _weight(self, now: float) -> float:
        w = self._unit * math.exp(min((now - self._origin) / self.memory, 600.0))
        if w > _RESCALE_AT:
            # Rescale every count (and the unit) so that a label given now weighs 1.
            for c in self._counts.values():
                c[0] /= w
                c[1] /= w
            self._origin, self._unit, w = now, 1.0, 1.0
        return w

    # -- asked ---------------------------------------------------------------------------------
    def p(self, cell: Cell, now: float) -> float:
        """The estimate for ``cell``: its finest prefix with enough labelled weight."""
        w1 = self._weight_at(now)
        counts = self._counts
        # "min_weight labels" of today's weight, less a rounding margin: labels given a
        # moment ago weigh a hair under one.
        need = self.min_weight * w1 * (1 - 1e-9)
        for k in range(len(cell), -1, -1):
            c = counts.get(cell[:k])
            if c is not None and c[1] >= need:
                return c[0] / c[1]
        c = counts.get(())
        if c is not None and c[1] > 0:
            # Not enough anywhere yet: shrink the global rate towards the prior.
            m = self.min_weight * w1
            return (c[0] + self.prior * m) / (c[1] + m)
        return self.prior

    def _weight_at(self, now: float) -> float:
        """The weight of one label given at ``now`` (read-only: no rescale)."""
        return self._unit * math.exp(min((now - self._origin) / self.memory, 600.0))

    def pending(self) -> int:
        """Open observations (bounded by the references of the last horizon)."""
        return len(self._open)

    def table(self, depth: int | None = None) -> dict[Cell, tuple[float, float]]:
        """Each cell prefix (of ``depth`` entries, or all) -> (estimate, labelled weight in
        labels at the latest weight)."""
        w1 = self._unit * math.exp(min((self._queue[-1][0] if self._queue else self._origin)
                                       - self._origin, 600.0 * self.memory) / self.memory)
        return {cell: (c[0] / c[1] if c[1] else 0.0, c[1] / w1)
                for cell, c in self._counts.items() if depth is None or len(cell) == depth}
