"""SIEVE (Zhang et al., NSDI'24): a FIFO queue, one visited bit per item and a moving hand.

New items enter at the head; a hit only sets the item's visited bit. To evict, the hand moves
from where it stopped toward the head, clearing the bit of every item it passes, and evicts the
first item whose bit is already clear; past the head it wraps to the tail. O(1) per event,
amortized (every step of the hand clears a bit or, for protected items only, skips one).

Representation: the queue, tail to head, is ``behind + ahead`` (two ``OrderedDict``\\ s): the
hand points at the first key of ``ahead``; ``behind`` holds what it has passed since it last
wrapped. Passing a key moves it from the front of ``ahead`` to the end of ``behind``; wrapping
makes ``behind`` the new ``ahead``. ``ahead`` is never empty while ``behind`` is not.

Side-effect-free ``victims``: it runs the hand over the real queue with a private set of the
bits it has cleared and of the keys it has evicted, and never writes to the real state. It walks
only as far as the hand would (at most two turns per victim). Protected keys are passed like
visited ones; soft-pinned keys too, at first: if the other keys cannot free ``need`` bytes, the
simulation is rerun from the start with those evictions forced and soft-pinned keys evictable
after them, so soft-pinned keys come last and only as many as needed.

``on_remove(key, EVICTED or DEMOTED)`` then performs the hand movement that evicting ``key``
implies: the hand advances to ``key`` (wrapping if ``key`` is behind it), clearing the bits it
passes; if ``key``'s own bit is set, the real hand would have cleared it and gone once round the
whole queue before taking it, so every bit is cleared. Removing the keys of a ``victims`` answer
in the returned order therefore leaves exactly the state the real procedure would. Other
reasons (DELETED, ...) just unlink the key; the hand, if on it, moves to the next key.

A protected key the hand passes loses its visited bit, as any passed key does (``on_remove`` is
not told which keys were protected).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Hashable, Sequence
from itertools import chain

from policies.base import Item, PlannedEviction, Reason, soft_pinned
from policies.table import register


@register("sieve")
class SIEVE(PlannedEviction):
    """SIEVE eviction. O(1) amortized per event."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._ahead: OrderedDict[Hashable, None] = OrderedDict()   # hand .. head
        self._behind: OrderedDict[Hashable, None] = OrderedDict()  # tail .. hand (exclusive)
        self._visited: set[Hashable] = set()

    # -- told ----------------------------------------------------------------------------------
    def _insert(self, item: Item, now: float) -> None:
        self._ahead[item.key] = None

    def _access(self, key: Hashable, hit: bool, now: float, item: Item | None) -> None:
        if hit:
            self._visited.add(key)

    def _remove(self, item: Item, reason: Reason) -> None:
        key = item.key
        if reason is Reason.EVICTED or reason is Reason.DEMOTED:
            self._advance_to(key)
        self._visited.discard(key)
        if key in self._ahead:
            del self._ahead[key]
            if not self._ahead:
                self._wrap()
        else:
            del self._behind[key]

    def _wrap(self) -> None:
        """The hand ran past the head: it restarts at the tail."""
        self._ahead, self._behind = self._behind, self._ahead

    def _advance_to(self, key: Hashable) -> None:
        """Move the hand onto ``key``, clearing the bits of the keys it passes (and all bits
        if ``key`` is visited: the hand went full circle before evicting it)."""
        ahead, behind, visited = self._ahead, self._behind, self._visited
        if key not in ahead:
            for k in ahead:
                visited.discard(k)
            behind.update(ahead)
            ahead.clear()
            self._wrap()
            ahead, behind = self._ahead, self._behind
        while True:
            k = next(iter(ahead))
            if k == key:
                break
            ahead.popitem(last=False)
            visited.discard(k)
            behind[k] = None
        if key in visited:
            visited.clear()

    # -- asked ---------------------------------------------------------------------------------
    def _plan(self, need: int, protected: Container[Hashable], pins_ok: bool,
              forced: Sequence[Hashable]) -> tuple[list[Hashable], bool]:
        """Run the hand on a virtual copy of the bits (``cleared``) and of the queue
        (``removed``): the keys it would evict, in order, until ``need`` bytes are freed (True)
        or nothing more can go (False). The first ``len(forced)`` evictions are ``forced``."""
        items, visited, now = self._items, self._visited, self._now
        out: list[Hashable] = []
        removed: set[Hashable] = set()
        cleared: set[Hashable] = set()
        freed = idle = 0
        while len(removed) < len(items):
            for key in chain(self._ahead, self._behind):  # one turn of the hand
                if key in removed:
                    continue
                n = len(out)
                if n < len(forced):
                    evictable = key == forced[n]
                else:
                    evictable = key not in protected and (
                        pins_ok or not soft_pinned(items[key], now))
                if evictable and (key not in visited or key in cleared):
                    out.append(key)
                    removed.add(key)
                    freed += items[key].size
                    if freed >= need:
                        return out, True
                    idle = 0
                    continue
                if key in visited:
                    cleared.add(key)
                idle += 1
                if idle > 2 * (len(items) - len(removed)):  # two turns: nothing can go
                    return out, False
        return out, False
