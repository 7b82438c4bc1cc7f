"""First in, first out: insertion order, hits do not reorder. O(1) per event.

Also home of the soft-pin helpers the other built-in policies share:

* an item whose ``deadline`` lies after the latest ``now`` the policy has been told (through
  :meth:`~policies.base.EvictionPolicy.on_insert` / ``on_access``) is *soft-pinned*;
* :func:`take_soft` walks a policy's eviction order like ``EvictionPolicy.take`` but defers
  soft-pinned keys: they are returned (in policy order, after every unpinned key) only when the
  unpinned, unprotected keys cannot free ``need`` bytes on their own.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Hashable

from policies.base import EvictionPolicy, Item, Reason, take_soft
from policies.registry import register


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
