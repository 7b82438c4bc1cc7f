"""First in, first out: insertion order, hits do not reorder. O(1) per event.

Soft-pinned items (a ``deadline`` after the latest ``now``) go last, through
:func:`policies.base.take_soft`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Hashable

from policies.base import EvictionPolicy, Item, Reason, take_soft
from policies.table import register


@register("fifo")
class FIFO(EvictionPolicy):
    """Evicts the oldest insertion; hits change nothing. O(1) per event."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._order: OrderedDict[Hashable, None] = OrderedDict()

    def _insert(self, item: Item, now: float) -> None:
        self._order[item.key] = None

    def _access(self, key: Hashable, hit: bool, now: float, item: Item | None) -> None:
        pass   # insertion order only: accesses change nothing

    def _remove(self, item: Item, reason: Reason) -> None:
        del self._order[item.key]

    def victims(self, need: int, protected: Container[Hashable] = ()) -> list[Hashable] | None:
        return take_soft(self._order, self._items, need, protected, self._now)
