"""A prefix-aware policy: what a KV cache knows that a generic cache does not.

Three facts about prefix-chained KV blocks shape it:

1. **A chunk is worthless once its parent is gone**: lookups walk a prefix from its first chunk,
   so a cached chunk under an evicted parent serves nobody. Only *leaves* (chunks with no cached
   child) are candidates; a chain is eaten from its tail, and a parent becomes a candidate when
   its last cached child leaves.
2. **Reuse gaps are long**: a prefix comes back at the next turn of its conversation, often
   after the cache has turned over. A chunk's access count is therefore kept in a history that
   outlives its eviction (halved once per ``history`` x cached-items accesses), so a chunk that
   returns for the third time enters with the weight of three uses, not as a newcomer; most new
   chunks are never reused (58 % of the blocks of the Mooncake trace are used once).
3. **Frequency and recency both count**, GreedyDual-style: a chunk's priority is
   ``H = L + freq * miss_cost * w(depth) / size``, where ``L`` is the priority of the last victim
   (so untouched chunks age relative to new ones). ``w(depth) = (1 + depth) ** -depth_weight``
   can favour shallow chunks (system prompts) over deep ones; it defaults to 0 because on the
   Mooncake trace reuse does not fall with depth and any weight lowered the hit ratio.

The victim is the leaf with the lowest ``H``. :meth:`victims` simulates exposing parents on a
private heap and changes nothing; when no set of leaves can free enough (everything else
protected), chunks with cached children are taken in ``H`` order as a last resort, so the
all-or-nothing contract holds. Items with a soft deadline in the future are taken only when
nothing else frees enough.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Container, Hashable
from typing import Any

from sortedcontainers import SortedList  # type: ignore[import-untyped]

from policies.base import EvictionPolicy, Item, PolicyError, Reason, soft_pinned
from policies.table import register


@register("prefix")
class PrefixAware(EvictionPolicy):
    """Leaf-only GreedyDual-size-frequency with a frequency history (module docstring)."""

    def __init__(self, capacity: int, depth_weight: float = 0.0, history: int = 32,
                 ) -> None:
        super().__init__(capacity)
        if not depth_weight >= 0:
            raise PolicyError(f"depth_weight must be >= 0, got {depth_weight!r}")
        if not isinstance(history, int) or history < 0:
            raise PolicyError(f"history must be an int >= 0, got {history!r}")
        self.depth_weight = float(depth_weight)
        self.history = history
        self._hist: dict[Hashable, int] = {}       # accesses per key, cached or not (aged)
        self._ticks = 0
        self._L = 0.0
        self._seq = itertools.count()
        self._freq: dict[Hashable, int] = {}
        self._prio: dict[Hashable, tuple[float, int]] = {}
        self._kids: dict[Hashable, int] = {}        # cached children per parent key
        self._leaves: Any = SortedList()            # (H, seq, key) of cached leaves

    def _value(self, item: Item, freq: int) -> float:
        w = (1.0 + item.depth) ** -self.depth_weight
        return float(freq * item.miss_cost * w / max(item.size, 1))

    def _set_prio(self, key: Hashable, item: Item) -> None:
        old = self._prio.get(key)
        leaf = self._kids.get(key, 0) == 0
        if old is not None and leaf:
            self._leaves.discard((old[0], old[1], key))
        prio = (self._L + self._value(item, self._freq[key]), next(self._seq))
        self._prio[key] = prio
        if leaf:
            self._leaves.add((prio[0], prio[1], key))

    # -- told ----------------------------------------------------------------------------------
    def _count(self, key: Hashable) -> int:
        """Count an access in the history that outlives eviction; halve every count once
        per ``history`` x (items cached) accesses, so old popularity fades."""
        n = self._hist.get(key, 0) + 1
        self._hist[key] = n
        self._ticks += 1
        if self._ticks >= self.history * max(len(self._items), 64):
            self._ticks = 0
            self._hist = {k: c >> 1 for k, c in self._hist.items() if c > 1}
        return n

    def _insert(self, item: Item, now: float) -> None:
        key, parent = item.key, item.parent
        self._freq[key] = max(1, self._hist.get(key, 0)) if self.history else 1
        if parent is not None:
            n = self._kids.get(parent, 0)
            self._kids[parent] = n + 1
            if n == 0 and parent in self._prio:      # the parent stops being a leaf
                h, s = self._prio[parent]
                self._leaves.discard((h, s, parent))
        self._set_prio(key, item)

    def _access(self, key: Hashable, hit: bool, now: float, item: Item | None) -> None:
        if self.history:
            n = self._count(key)
            if hit:
                self._freq[key] = max(self._freq[key] + 1, n)
                self._set_prio(key, self._items[key])
        elif hit:
            self._freq[key] += 1
            self._set_prio(key, self._items[key])

    def _remove(self, item: Item, reason: Reason) -> None:
        key, parent = item.key, item.parent
        h, s = self._prio.pop(key)
        del self._freq[key]
        if self._kids.get(key, 0) == 0:
            self._leaves.discard((h, s, key))
        if reason in (Reason.EVICTED, Reason.DEMOTED):
            self._L = max(self._L, h)
        if parent is not None and parent in self._kids:
            n = self._kids[parent] - 1
            if n:
                self._kids[parent] = n
            else:
                del self._kids[parent]
                if parent in self._prio:             # the parent becomes a leaf
                    ph, ps = self._prio[parent]
                    self._leaves.add((ph, ps, parent))

    # -- asked ---------------------------------------------------------------------------------
    def victims(self, need: int, protected: Container[Hashable] = ()) -> list[Hashable] | None:
        if need <= 0:
            return []
        out = self._leaf_victims(need, protected)
        if out is None:
            out = self._any_victims(need, protected)
        return out

    def _leaf_victims(self, need: int, protected: Container[Hashable]
                      ) -> list[Hashable] | None:
        """Walk leaves in H order, exposing parents on a private heap as their last child is
        (virtually) taken; soft-pinned leaves are set aside and taken, in H order, only if
        the others do not free enough."""
        out: list[Hashable] = []
        deferred: list[Hashable] = []
        freed = 0
        taken_kids: dict[Hashable, int] = {}
        exposed: list[tuple[float, int, Hashable]] = []
        it = iter(self._leaves)
        nxt = next(it, None)
        while nxt is not None or exposed:
            if exposed and (nxt is None or exposed[0] < nxt):
                key = heapq.heappop(exposed)[2]
            else:
                assert nxt is not None
                key = nxt[2]
                nxt = next(it, None)
            if key in protected:
                continue
            if soft_pinned(self._items[key], self._now):
                deferred.append(key)
                continue
            out.append(key)
            freed += self._items[key].size
            if freed >= need:
                return out
            parent = self._items[key].parent
            if parent is not None and parent in self._prio:
                n = taken_kids.get(parent, 0) + 1
                taken_kids[parent] = n
                if n == self._kids.get(parent, 0):
                    ph, ps = self._prio[parent]
                    heapq.heappush(exposed, (ph, ps, parent))
        for key in deferred:
            out.append(key)
            freed += self._items[key].size
            if freed >= need:
                return out
        return None

    def _any_victims(self, need: int, protected: Container[Hashable]) -> list[Hashable] | None:
        order = sorted((p[0], p[1], k) for k, p in self._prio.items())
        return self.take((k for _, _, k in order), self._items, need, protected)
