"""Prefetch policies: which of the objects a caller will soon need to move up, in what order.

The caller (the engine's :meth:`prefetch`, the multi-tier replay) knows what is coming: the
requests in a scheduler's queue. It hands a policy the upcoming objects that sit below the
fast tier, in queue order, and a byte budget; the policy answers the keys to move, most
urgent first, whose sizes fit the budget. Asking changes nothing.

* ``queue``: in queue order, stopping at the first object that does not fit (the next
  request's data first; nothing is skipped, so a later object never overtakes an earlier).
* ``shallow``: a KV cache's order. A request reads its prefix from the first chunk on and
  every leading chunk saves its load, while a chunk behind a missing one saves nothing; so
  with a budget too small for the whole queue, the first chunks of every queued request go
  before the tails of the first ones (by depth, then queue order), skipping what does not
  fit. ``max_depth`` bounds how deep it looks.
* ``cooccur``: learns online which objects follow which. Accesses reported with the same
  ``now`` form one *step* (an MoE layer's chosen experts: ``now`` is the step's index); for
  every pair (a in step s, b in step s+1) it counts ``a -> b``. Asked, it ranks the upcoming
  objects (the candidates, e.g. every expert of the next layer not in the fast tier) by the
  mean over the latest step's objects ``a`` of ``P(b | a) = count(a -> b) / steps after a``,
  and returns those above ``min_p``, best first, skipping what does not fit. Nothing learned
  about a candidate: not returned.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Sequence

from policies.base import Item, PolicyError, PrefetchPolicy
from policies.table import build


class QueueOrder(PrefetchPolicy):
    """Upcoming objects in queue order until the budget runs out."""

    name = "queue"

    def hints(self, upcoming: Sequence[Item], budget: int) -> list[Hashable]:
        out: list[Hashable] = []
        seen: set[Hashable] = set()
        for item in upcoming:
            if item.key in seen:
                continue
            if item.size > budget:
                break
            seen.add(item.key)
            budget -= item.size
            out.append(item.key)
        return out


class ShallowFirst(PrefetchPolicy):
    """Shallow chunks of every queued request before deep ones (module docstring)."""

    name = "shallow"

    def __init__(self, max_depth: int | None = None) -> None:
        if max_depth is not None and (isinstance(max_depth, bool)
                                      or not isinstance(max_depth, int) or max_depth < 0):
            raise PolicyError(f"max_depth must be an int >= 0 or None, got {max_depth!r}")
        self.max_depth = max_depth

    def hints(self, upcoming: Sequence[Item], budget: int) -> list[Hashable]:
        first: dict[Hashable, tuple[int, int, Item]] = {}
        for pos, item in enumerate(upcoming):
            if item.key not in first and (self.max_depth is None
                                          or item.depth <= self.max_depth):
                first[item.key] = (item.depth, pos, item)
        out: list[Hashable] = []
        for _, _, item in sorted(first.values(), key=lambda e: (e[0], e[1])):
            if item.size <= budget:
                budget -= item.size
                out.append(item.key)
        return out


class CoOccurrence(PrefetchPolicy):
    """Predicts the next step's objects from the latest step's, by co-occurrence counts
    learned online (module docstring)."""

    name = "cooccur"

    def __init__(self, min_p: float = 0.0) -> None:
        if isinstance(min_p, bool) or not isinstance(min_p, int | float) \
                or not 0 <= min_p < 1:
            raise PolicyError(f"min_p must be a number in [0, 1), got {min_p!r}")
        self.min_p = float(min_p)
        self._counts: defaultdict[Hashable, defaultdict[Hashable, int]] = defaultdict(
            lambda: defaultdict(int))
        self._followed: defaultdict[Hashable, int] = defaultdict(int)  # steps after a
        self._prev: list[Hashable] = []      # the step before the latest
        self._cur: list[Hashable] = []       # the latest step (may still be growing)
        self._step: float | None = None

    def on_access(self, key: Hashable, hit: bool, now: float) -> None:
        if now != self._step:
            if self._step is not None:
                self._prev, self._cur = self._cur, []
                for a in self._prev:
                    self._followed[a] += 1
            self._step = now
        if key in self._cur:
            return
        self._cur.append(key)
        counts = self._counts
        for a in self._prev:
            counts[a][key] += 1

    def probabilities(self) -> dict[Hashable, float]:
        """``P(b | latest step)`` for every object ``b`` ever seen after one of its keys."""
        score: dict[Hashable, float] = defaultdict(float)
        cur = self._cur
        for a in cur:
            n = self._followed.get(a, 0)
            if n:
                for b, c in self._counts[a].items():
                    score[b] += c / n
        return {b: s / len(cur) for b, s in score.items()}

    def hints(self, upcoming: Sequence[Item], budget: int) -> list[Hashable]:
        p = self.probabilities()
        ranked: dict[Hashable, tuple[float, int, Item]] = {}
        for pos, item in enumerate(upcoming):
            s = p.get(item.key, 0.0)
            if s > self.min_p and item.key not in ranked:
                ranked[item.key] = (-s, pos, item)
        out: list[Hashable] = []
        for _, _, item in sorted(ranked.values(), key=lambda e: (e[0], e[1])):
            if item.size <= budget:
                budget -= item.size
                out.append(item.key)
        return out


_PREFETCH: dict[str, type[PrefetchPolicy]] = {"queue": QueueOrder, "shallow": ShallowFirst,
                                              "cooccur": CoOccurrence}


def make_prefetch(spec: str) -> PrefetchPolicy:
    """A prefetch policy from its spec: ``"queue"``, ``"shallow(max_depth=8)"`` or
    ``"cooccur(min_p=0.1)"``."""
    return build(spec, _PREFETCH, "prefetch")


def available_prefetch() -> list[str]:
    return sorted(_PREFETCH)
