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
from collections.abc import Container, Hashable, Iterable, Mapping

from policies.base import EvictionPolicy, Item, Reason
from policies.registry import register

#: ``now`` before the caller has said anything: every deadline lies in its future.
NEVER = float("-inf")


def soft_pinned(item: Item, now: float) -> bool:
    """Whether ``item`` is soft-pinned at time ``now`` (its deadline has not passed)."""
    deadline = item.deadline
    return deadline is not None and deadline > now


def take_soft(order: Iterable[Hashable], items: Mapping[Hashable, Item], need: int,
              protected: Container[Hashable], now: float) -> list[Hashable] | None:
    """The shortest prefix of ``order`` (skipping ``protected``) that frees ``need`` bytes,
    soft-pinned keys deferred to a second pass; ``None`` if even they do not suffice.

    Walks ``order`` only as far as needed: when nothing is soft-pinned it costs what
    ``EvictionPolicy.take`` costs."""
    out: list[Hashable] = []
    if need <= 0:
        return out
    freed = 0
    deferred: list[Hashable] = []
    for key in order:
        if key in protected:
            continue
        item = items[key]
        deadline = item.deadline
        if deadline is not None and deadline > now:
            deferred.append(key)
            continue
        out.append(key)
        freed += item.size
        if freed >= need:
            return out
    for key in deferred:
        out.append(key)
        freed += items[key].size
        if freed >= need:
            return out
    return None


@register("fifo")
class FIFO(EvictionPolicy):
    """Evicts the oldest insertion; hits change nothing. O(1) per event."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._order: OrderedDict[Hashable, None] = OrderedDict()
        self._now = NEVER

    def _insert(self, item: Item, now: float) -> None:
        self._order[item.key] = None
        if now > self._now:
            self._now = now

    def _access(self, key: Hashable, hit: bool, now: float, item: Item | None) -> None:
        if now > self._now:
            self._now = now

    def _remove(self, item: Item, reason: Reason) -> None:
        del self._order[item.key]

    def victims(self, need: int, protected: Container[Hashable] = ()) -> list[Hashable] | None:
        return take_soft(self._order, self._items, need, protected, self._now)
