"""Least frequently used, with dynamic aging (LFU-DA, Arlitt et al. 2000).

Each item has a priority ``K = L + count`` where ``count`` is the number of references since it
entered the cache (its insertion counts as one) and ``L`` is the cache's *age*: the priority of
the last evicted item (it only grows). The item with the lowest ``K`` goes first; ties go to the
least recently referenced. Aging lets items that were popular long ago leave once newer items
have been referenced about as often since; without it (``lfu(decay=False)``, plain LFU with
``K = count``) a burst of hits pins an item forever.

The priorities live in a sorted index (:class:`SortedList`, a list of sorted sublists as in the
``sortedcontainers`` package, without the dependency): O(log n) per event, and ``victims`` walks
the index in order from the front, O(k) for k victims after an O(1) start, with no side effects.

:class:`PriorityPolicy` is the shared machinery: GDSF (``policies.gdsf``) is the same scheme with
a per-item weight ``miss_cost / size`` in place of 1.

Soft pins (``Item.deadline``) are deferred as in :func:`policies.fifo.take_soft`.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections.abc import Container, Hashable, Iterator
from itertools import chain

from policies.base import EvictionPolicy, Item, PolicyError, Reason, take_soft
from policies.table import register

#: An index entry: (priority, sequence number of its last reference, key). Sequence numbers are
#: unique, so keys are never compared.
Entry = tuple[float, int, Hashable]


class SortedList:
    """A sorted multiset of :data:`Entry` tuples: sorted sublists of at most ``2 * load``
    entries plus the list of their maxima. ``add``/``remove`` cost two bisections and a short
    ``list.insert``/``del`` (C memmove); iteration is in ascending order."""

    def __init__(self, load: int = 256) -> None:
        self._load = load
        self._lists: list[list[Entry]] = []
        self._maxes: list[Entry] = []
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[Entry]:
        return chain.from_iterable(self._lists)

    def add(self, value: Entry) -> None:
        maxes, lists = self._maxes, self._lists
        self._len += 1
        if not maxes:
            lists.append([value])
            maxes.append(value)
            return
        i = bisect_right(maxes, value)
        if i == len(maxes):
            i -= 1
            sub = lists[i]
            sub.append(value)
            maxes[i] = value
        else:
            sub = lists[i]
            insort(sub, value)
        if len(sub) > 2 * self._load:
            half = sub[self._load:]
            del sub[self._load:]
            maxes[i] = sub[-1]
            lists.insert(i + 1, half)
            maxes.insert(i + 1, half[-1])

    def remove(self, value: Entry) -> None:
        maxes, lists = self._maxes, self._lists
        i = bisect_left(maxes, value)
        if i == len(maxes):
            raise ValueError(f"{value!r} is not in the list")
        sub = lists[i]
        j = bisect_left(sub, value)
        if j == len(sub) or sub[j] != value:
            raise ValueError(f"{value!r} is not in the list")
        del sub[j]
        self._len -= 1
        if not sub:
            del lists[i]
            del maxes[i]
        elif j == len(sub):
            maxes[i] = sub[-1]


class PriorityPolicy(EvictionPolicy):
    """Evicts the lowest ``L + count * weight(item)``, ties to the least recently referenced;
    ``L`` becomes the priority of each evicted (or demoted) item when ``aging`` is on."""

    def __init__(self, capacity: int, aging: bool = True) -> None:
        super().__init__(capacity)
        self._aging = aging
        self._index = SortedList()
        self._entry: dict[Hashable, Entry] = {}
        self._count: dict[Hashable, int] = {}
        self._age: float = 0
        self._seq = 0

    @property
    def age(self) -> float:
        """``L``: the priority of the last evicted item (0 before any eviction)."""
        return self._age

    def _weight(self, item: Item) -> float:
        return 1

    def _insert(self, item: Item, now: float) -> None:
        key = item.key
        self._seq += 1
        entry = (self._age + self._weight(item), self._seq, key)
        self._count[key] = 1
        self._entry[key] = entry
        self._index.add(entry)

    def _access(self, key: Hashable, hit: bool, now: float, item: Item | None) -> None:
        if not hit:
            return
        count = self._count[key] + 1
        self._count[key] = count
        self._seq += 1
        entry = (self._age + count * self._weight(self._items[key]), self._seq, key)
        self._index.remove(self._entry[key])
        self._entry[key] = entry
        self._index.add(entry)

    def _remove(self, item: Item, reason: Reason) -> None:
        key = item.key
        entry = self._entry.pop(key)
        del self._count[key]
        self._index.remove(entry)
        if self._aging and (reason is Reason.EVICTED or reason is Reason.DEMOTED) \
                and entry[0] > self._age:
            self._age = entry[0]

    def victims(self, need: int, protected: Container[Hashable] = ()) -> list[Hashable] | None:
        order = (entry[2] for entry in self._index)
        return take_soft(order, self._items, need, protected, self._now)


@register("lfu")
class LFU(PriorityPolicy):
    """LFU with dynamic aging (``decay=True``, the default) or plain LFU (``decay=False``).
    O(log n) per event."""

    def __init__(self, capacity: int, decay: bool = True) -> None:
        if not isinstance(decay, bool):
            raise PolicyError(f"lfu: decay must be True or False, got {decay!r}")
        super().__init__(capacity, aging=decay)
