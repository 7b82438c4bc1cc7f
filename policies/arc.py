"""Adaptive Replacement Cache (Megiddo & Modha, FAST'03), byte-sized.

Four LRU lists: ``T1`` (seen once recently) and ``T2`` (seen at least twice) hold the cached
items; the ghost lists ``B1``/``B2`` remember the keys (and sizes) recently evicted from
``T1``/``T2``. The target ``p`` (bytes wanted in ``T1``) adapts on ghost hits.

With unit sizes this is the paper's algorithm, mapped onto the caller-driven interface:

* a hit (``on_access(hit=True)``) moves the item to the MRU end of ``T2``;
* a miss (``on_access(hit=False)``) on a key in ``B1`` raises ``p`` by
  ``max(|B2| / |B1|, 1) * size`` (capped at the capacity), on a key in ``B2`` lowers it by
  ``max(|B1| / |B2|, 1) * size`` (floored at 0), list sizes in bytes and ``size`` the missed
  item's (from ``item``, else the ghost's record); the key leaves its ghost list and the
  following ``on_insert`` puts it in ``T2``. Any other insert goes to ``T1``;
* ``victims`` is REPLACE repeated until ``need`` bytes are freed: take from ``T1``'s LRU end
  when ``T1`` is not empty and ``|T1| > p`` (or ``|T1| == p`` and the pending miss was a ``B2``
  hit), else from ``T2``'s LRU end; protected keys (and, on the first try, soft-pinned ones) are
  skipped, and a list with nothing evictable left hands over to the other (soft-pinned keys
  become evictable, and are taken the same way, only once nothing else is left). It reads
  ``p`` and the lists without moving anything: REPLACE's only effect, moving the victim to the
  MRU end of its ghost list, is applied by ``on_remove(key, EVICTED or DEMOTED)``; other
  reasons remove the key without a ghost;
* after each insert the ghosts are trimmed from their LRU ends so that
  ``|T1| + |B1| <= c`` and ``|T1| + |T2| + |B1| + |B2| <= 2c`` (the paper's case IV
  deletions; with unit sizes the same keys are dropped).

O(1) per event; ``victims`` walks only as far as needed.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Container, Hashable, Iterator

from policies.base import EvictionPolicy, Item, Reason, soft_pinned
from policies.table import register


class _Missing(enum.Enum):
    """Stands for "no key": keys may be None or falsy, and an enum member survives deepcopy."""

    NONE = 0
    UNSET = 1


_NONE, _UNSET = _Missing.NONE, _Missing.UNSET
_B1, _B2 = 1, 2


@register("arc")
class ARC(EvictionPolicy):
    """Adaptive Replacement Cache over bytes. O(1) per event."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._t1: OrderedDict[Hashable, None] = OrderedDict()  # LRU first
        self._t2: OrderedDict[Hashable, None] = OrderedDict()
        self._b1: OrderedDict[Hashable, int] = OrderedDict()   # key -> size
        self._b2: OrderedDict[Hashable, int] = OrderedDict()
        self._t1_bytes = 0
        self._b1_bytes = 0
        self._b2_bytes = 0
        self.p: float = 0.0
        self._pending: Hashable = _NONE     # key of the last miss that hit a ghost list
        self._pending_from = 0              # _B1 or _B2

    # -- inspection (tests, debugging) -----------------------------------------------------------
    def lists(self) -> tuple[list[Hashable], list[Hashable], list[Hashable], list[Hashable]]:
        """``(T1, T2, B1, B2)``, each LRU first."""
        return list(self._t1), list(self._t2), list(self._b1), list(self._b2)

    # -- told ----------------------------------------------------------------------------------
    def _access(self, key: Hashable, hit: bool, now: float, item: Item | None) -> None:
        if hit:
            t1 = self._t1
            if key in t1:
                del t1[key]
                self._t1_bytes -= self._items[key].size
                self._t2[key] = None
            else:
                self._t2.move_to_end(key)
            return
        self._pending = _NONE
        if key in self._b1:
            self._ghost_hit(key, _B1, item)
        elif key in self._b2:
            self._ghost_hit(key, _B2, item)

    def _ghost_hit(self, key: Hashable, which: int, item: Item | None) -> None:
        b1, b2 = self._b1_bytes, self._b2_bytes
        if which == _B1:
            ghost_size = self._b1.pop(key)
            self._b1_bytes -= ghost_size
            size = item.size if item is not None else ghost_size
            self.p = min(float(self.capacity), self.p + max(b2 / b1 if b1 else 0.0, 1.0) * size)
        else:
            ghost_size = self._b2.pop(key)
            self._b2_bytes -= ghost_size
            size = item.size if item is not None else ghost_size
            self.p = max(0.0, self.p - max(b1 / b2 if b2 else 0.0, 1.0) * size)
        self._pending = key
        self._pending_from = which

    def _insert(self, item: Item, now: float) -> None:
        key = item.key
        if key != self._pending and (key in self._b1 or key in self._b2):
            # an insert without a reported miss (a write): count the ghost hit now
            self._ghost_hit(key, _B1 if key in self._b1 else _B2, item)
        if key == self._pending:
            self._t2[key] = None
        else:
            self._t1[key] = None
            self._t1_bytes += item.size
        self._pending = _NONE
        self._trim()

    def _trim(self) -> None:
        c = self.capacity
        b1, b2 = self._b1, self._b2
        while self._t1_bytes + self._b1_bytes > c and b1:
            self._b1_bytes -= b1.popitem(last=False)[1]
        if self.used + self._b1_bytes + self._b2_bytes > 2 * c:
            while self.used + self._b1_bytes + self._b2_bytes > 2 * c and b2:
                self._b2_bytes -= b2.popitem(last=False)[1]
            while self.used + self._b1_bytes + self._b2_bytes > 2 * c and b1:
                self._b1_bytes -= b1.popitem(last=False)[1]

    def _remove(self, item: Item, reason: Reason) -> None:
        key, size = item.key, item.size
        ghost = reason is Reason.EVICTED or reason is Reason.DEMOTED
        if key in self._t1:
            del self._t1[key]
            self._t1_bytes -= size
            if ghost:
                self._b1[key] = size
                self._b1_bytes += size
        else:
            del self._t2[key]
            if ghost:
                self._b2[key] = size
                self._b2_bytes += size

    # -- asked ---------------------------------------------------------------------------------
    def victims(self, need: int, protected: Container[Hashable] = ()) -> list[Hashable] | None:
        if need <= 0:
            return []
        items, now, p = self._items, self._now, self.p
        from_b2 = self._pending is not _NONE and self._pending_from == _B2
        pins_ok = not self._pinnable
        out: list[Hashable] = []
        taken: set[Hashable] = set()   # when restarted for soft-pinned keys: already chosen

        def first(it: Iterator[Hashable]) -> Hashable:
            """The next key of ``it`` that may go (candidates are found lazily: usually one
            list is looked at, and only as far as its first evictable key)."""
            for k in it:
                if k in protected or k in taken or (
                        not pins_ok and soft_pinned(items[k], now)):
                    continue
                return k
            return _NONE

        it1, it2 = iter(self._t1), iter(self._t2)
        next1: Hashable = _UNSET
        next2: Hashable = _UNSET
        t1_bytes, t1_len = self._t1_bytes, len(self._t1)
        freed = 0
        while freed < need:
            take_t1 = t1_len > 0 and (t1_bytes > p or (from_b2 and t1_bytes == p))
            if take_t1:
                if next1 is _UNSET:
                    next1 = first(it1)
                if next1 is _NONE:
                    take_t1 = False
            if not take_t1:
                if next2 is _UNSET:
                    next2 = first(it2)
                if next2 is _NONE:
                    if next1 is _UNSET:
                        next1 = first(it1)
                    take_t1 = True
            victim = next1 if take_t1 else next2
            if victim is _NONE:
                if pins_ok:
                    return None
                pins_ok = True  # not enough without soft-pinned keys: go on with them
                taken = set(out)
                it1, it2 = iter(self._t1), iter(self._t2)
                next1 = next2 = _UNSET
                continue
            size = items[victim].size
            if take_t1:
                next1 = _UNSET
                t1_bytes -= size
                t1_len -= 1
            else:
                next2 = _UNSET
            out.append(victim)
            freed += size
        return out
