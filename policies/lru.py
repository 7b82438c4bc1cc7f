"""Least recently used: the reference policy every other one is measured against."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Hashable

from policies.base import EvictionPolicy, Item, Reason
from policies.registry import register


@register("lru")
class LRU(EvictionPolicy):
    """Evicts the least recently inserted-or-hit item. O(1) per event."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._order: OrderedDict[Hashable, None] = OrderedDict()

    def _insert(self, item: Item, now: float) -> None:
        self._order[item.key] = None

    def _access(self, key: Hashable, hit: bool, now: float, item: Item | None) -> None:
        if hit:
            self._order.move_to_end(key)

    def _remove(self, item: Item, reason: Reason) -> None:
        del self._order[item.key]

    def victims(self, need: int, protected: Container[Hashable] = ()) -> list[Hashable] | None:
        return self.take(iter(self._order), self._items, need, protected)
