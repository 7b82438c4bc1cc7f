"""Segmented LRU: a probationary and a protected LRU segment. O(1) amortized per event.

New items enter the probationary segment at its MRU end. A hit in the probationary segment
promotes the item to the protected segment's MRU end; a hit in the protected segment moves it to
that segment's MRU end. The protected segment holds at most ``protected * capacity`` bytes: when
a promotion overflows it, its LRU items are demoted to the probationary MRU end until it fits.
Victims come from the probationary LRU end first, then from the protected LRU end.

Soft pins (``Item.deadline``) are deferred as in :func:`policies.fifo.take_soft`.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Container, Hashable

from policies.base import EvictionPolicy, Item, PolicyError, Reason, take_soft
from policies.table import register


@register("slru")
class SLRU(EvictionPolicy):
    """Segmented LRU; ``protected`` is the protected segment's share of the capacity bytes."""

    def __init__(self, capacity: int, protected: float = 0.8) -> None:
        super().__init__(capacity)
        if isinstance(protected, bool) or not isinstance(protected, int | float) \
                or not 0.0 <= protected <= 1.0:
            raise PolicyError(f"slru: protected must be a fraction in [0, 1], got {protected!r}")
        self.protected_fraction = float(protected)
        self._protected_cap = self.protected_fraction * capacity
        self._probation: OrderedDict[Hashable, None] = OrderedDict()
        self._protected: OrderedDict[Hashable, None] = OrderedDict()
        self._protected_bytes = 0

    def _insert(self, item: Item, now: float) -> None:
        self._probation[item.key] = None

    def _access(self, key: Hashable, hit: bool, now: float, item: Item | None) -> None:
        if not hit:
            return
        prot = self._protected
        if key in prot:
            prot.move_to_end(key)
            return
        del self._probation[key]
        prot[key] = None
        self._protected_bytes += self._items[key].size
        if self._protected_bytes > self._protected_cap:
            items, probation = self._items, self._probation
            while self._protected_bytes > self._protected_cap and prot:
                old, _ = prot.popitem(last=False)
                self._protected_bytes -= items[old].size
                probation[old] = None

    def _remove(self, item: Item, reason: Reason) -> None:
        key = item.key
        if key in self._probation:
            del self._probation[key]
        else:
            del self._protected[key]
            self._protected_bytes -= item.size

    def victims(self, need: int, protected: Container[Hashable] = ()) -> list[Hashable] | None:
        order = itertools.chain(self._probation, self._protected)
        return take_soft(order, self._items, need, protected, self._now)
