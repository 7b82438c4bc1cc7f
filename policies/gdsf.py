"""GreedyDual-Size-Frequency (Cherkasova 1998).

Each item has a priority ``H = L + freq * miss_cost / size`` computed when it is inserted
(``freq = 1``) and on every hit (``freq`` incremented, ``L`` as it is then); the lowest ``H``
is evicted, ties to the least recently referenced, and ``L`` becomes the evicted item's ``H``
(``L`` never decreases). Cheap-to-refetch, large, rarely used items go first. Items of size 0
are weighted as if their size were 1 byte.

Same machinery as LFU-DA (:class:`policies.lfu.PriorityPolicy`): O(log n) per event, and
``victims`` walks the sorted index from the front without side effects. Soft pins
(``Item.deadline``) are deferred as in :func:`policies.fifo.take_soft`.
"""

from __future__ import annotations

from policies.base import Item
from policies.lfu import PriorityPolicy
from policies.table import register


@register("gdsf")
class GDSF(PriorityPolicy):
    """GreedyDual-Size-Frequency over ``Item.miss_cost`` and ``Item.size``."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity, aging=True)

    def _weight(self, item: Item) -> float:
        size = item.size
        return item.miss_cost / (size if size > 0 else 1)
