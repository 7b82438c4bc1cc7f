"""Least recently used: the reference policy every other one is measured against."""

from __future__ import annotations

from collections.abc import Container, Hashable

from policies.base import Item
from policies.fifo import FIFO
from policies.table import register


@register("lru")
class LRU(FIFO):
    """Evicts the least recently inserted-or-hit item: FIFO whose hits move to the back.
    Ignores soft pins (the plain reference). O(1) per event."""

    def _access(self, key: Hashable, hit: bool, now: float, item: Item | None) -> None:
        if hit:
            self._order.move_to_end(key)

    def victims(self, need: int, protected: Container[Hashable] = ()) -> list[Hashable] | None:
        return self.take(iter(self._order), self._items, need, protected)
