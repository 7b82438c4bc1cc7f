"""S3-FIFO (Yang et al., SOSP'23): a small FIFO, a main FIFO and a ghost FIFO.

* ``S`` (``small * capacity`` bytes) takes new items; ``M`` takes the rest of the capacity;
  ``G`` remembers the keys (and sizes) of items evicted from ``S``, up to ``M``'s capacity in
  bytes (with unit sizes: as many keys as ``M`` holds items).
* Every item has a 2-bit frequency: 0 on insertion, ``min(freq + 1, 3)`` on a hit.
* A miss on a key in ``G`` (told through ``on_access``, or an ``on_insert`` of such a key)
  removes it from ``G`` and the item is inserted into ``M``; other items go to ``S``.
* Evicting one item: if ``S`` holds at least its share of bytes, walk ``S`` from its tail: an
  item with ``freq >= threshold`` moves to the head of ``M`` with its frequency cleared, the
  first other item is evicted (its key enters ``G``). If that walk evicts nothing, or ``S`` is
  under its share, walk ``M`` from its tail: an item with ``freq > 0`` is reinserted at the head
  with ``freq - 1``, the first item with ``freq == 0`` is evicted. (When ``S`` was under its
  share and ``M`` yields nothing, ``S`` is walked, then ``M`` again.) Protected keys (and, on
  the first try, soft-pinned ones) are never evicted: a walk steps over them without moving
  them, though they are still promoted or reinserted as their frequency says, like any other.

Side-effect-free ``victims`` and lazy bookkeeping: ``victims`` runs that procedure on a
*virtual* state (cursors over the real queues, lists of the keys the walks stepped over, a FIFO
of the keys the simulation appended to ``M``, a dict of changed frequencies and the simulated
byte count of ``S``) and never writes to the real state. The caller then reports each victim
with ``on_remove(key, EVICTED or DEMOTED)``, which *recomputes* the real procedure
deterministically with "``key`` is the only evictable item" as the rule: the walks promote,
reinsert and decrement exactly what the simulation did on its way to ``key``, step over (leave
in place) whatever it stepped over, and evict ``key``. Removing the keys of a ``victims`` answer
in the returned order therefore leaves exactly the state the real procedure would have left,
and no plan needs to be stored between the two calls. Other reasons (DELETED, ...) just unlink
the key and feed no ghost.

Soft-pinned keys are stepped over like protected ones at first; if the others cannot free
``need`` bytes, the simulation is rerun with those evictions forced and soft-pinned keys
evictable after them, so they come last and only as many as needed.

Cost: O(1) per hit/insert; an eviction costs the items its walks move (each promotion or
reinsertion consumes frequency, so O(1) amortized) plus any protected items stepped over.
"""

from __future__ import annotations

import enum
from collections import OrderedDict, deque
from collections.abc import Container, Hashable, Iterator, Sequence

from policies.base import Item, PlannedEviction, PolicyError, Reason, soft_pinned
from policies.table import register


class _Missing(enum.Enum):
    """Stands for "no key": keys may be None or falsy, and an enum member survives deepcopy."""

    NONE = 0


_NONE = _Missing.NONE
_MAX_FREQ = 3


def _put_back(queue: OrderedDict[Hashable, None], skipped: list[Hashable]) -> None:
    """Return keys a walk stepped over to the tail, in their order (they stay next to go)."""
    for t in reversed(skipped):
        queue[t] = None
        queue.move_to_end(t, last=False)


@register("s3fifo")
class S3FIFO(PlannedEviction):
    """S3-FIFO. ``small``: share of the capacity bytes for the small FIFO; ``threshold``: the
    frequency at which an item leaving the small FIFO is promoted to the main one."""

    def __init__(self, capacity: int, small: float = 0.1, threshold: int = 1) -> None:
        super().__init__(capacity)
        if isinstance(small, bool) or not isinstance(small, int | float) \
                or not 0.0 <= small <= 1.0:
            raise PolicyError(f"s3fifo: small must be a fraction in [0, 1], got {small!r}")
        if isinstance(threshold, bool) or not isinstance(threshold, int) \
                or not 1 <= threshold <= _MAX_FREQ:
            raise PolicyError(f"s3fifo: threshold must be an int in [1, {_MAX_FREQ}], "
                              f"got {threshold!r}")
        self.small = float(small)
        self.threshold = threshold
        self._small_cap = self.small * capacity
        self._ghost_cap = capacity - self._small_cap
        self._s: OrderedDict[Hashable, None] = OrderedDict()   # tail (oldest) first
        self._m: OrderedDict[Hashable, None] = OrderedDict()
        self._g: OrderedDict[Hashable, int] = OrderedDict()    # key -> size
        self._freq: dict[Hashable, int] = {}
        self._s_bytes = 0
        self._g_bytes = 0
        self._ghost_hit: Hashable = _NONE

    # -- inspection (tests, debugging) -----------------------------------------------------------
    def queues(self) -> tuple[list[Hashable], list[Hashable], list[Hashable]]:
        """``(S, M, G)``, each tail (next to leave) first."""
        return list(self._s), list(self._m), list(self._g)

    # -- told ----------------------------------------------------------------------------------
    def _insert(self, item: Item, now: float) -> None:
        key = item.key
        if key == self._ghost_hit:
            to_main = True
        elif key in self._g:
            self._g_bytes -= self._g.pop(key)
            to_main = True
        else:
            to_main = False
        self._ghost_hit = _NONE
        if to_main:
            self._m[key] = None
        else:
            self._s[key] = None
            self._s_bytes += item.size
        self._freq[key] = 0

    def _access(self, key: Hashable, hit: bool, now: float, item: Item | None) -> None:
        if hit:
            f = self._freq[key]
            if f < _MAX_FREQ:
                self._freq[key] = f + 1
            return
        size = self._g.pop(key, None)
        if size is not None:
            self._g_bytes -= size
            self._ghost_hit = key
        else:
            self._ghost_hit = _NONE

    def _remove(self, item: Item, reason: Reason) -> None:
        key = item.key
        if reason is Reason.EVICTED or reason is Reason.DEMOTED:
            self._evict(item)
        elif key in self._s:
            del self._s[key]
            self._s_bytes -= item.size
        else:
            del self._m[key]
        del self._freq[key]

    # -- the real procedure, with ``victim`` as the only evictable item --------------------------
    def _evict(self, victim: Item) -> None:
        if self._s_bytes >= self._small_cap:
            if not self._walk_s(victim):
                self._walk_m(victim.key)
        elif not self._walk_m(victim.key) and not self._walk_s(victim):
            self._walk_m(victim.key)

    def _walk_s(self, victim: Item) -> bool:
        """Walk S from its tail until ``victim`` is evicted (True) or S is exhausted."""
        s, m, freq, items, threshold = self._s, self._m, self._freq, self._items, self.threshold
        key = victim.key
        skipped: list[Hashable] = []
        found = False
        moved = 0                     # bytes promoted to M (written back once: a hot loop)
        pop = s.popitem
        while s:
            t = pop(last=False)[0]
            if freq[t] >= threshold:
                # ``victim`` has already left self._items (the base class pops it first)
                moved += victim.size if t == key else items[t].size
                freq[t] = 0
                m[t] = None
            elif t == key:
                found = True
                break
            else:
                skipped.append(t)
        self._s_bytes -= moved
        _put_back(s, skipped)
        if found:
            self._s_bytes -= victim.size
            g = self._g
            g[key] = victim.size
            self._g_bytes += victim.size
            while self._g_bytes > self._ghost_cap and g:
                self._g_bytes -= g.popitem(last=False)[1]
        return found

    def _walk_m(self, key: Hashable) -> bool:
        """Walk M from its tail until ``key`` is evicted (True) or every item was seen with
        frequency 0."""
        m, freq = self._m, self._freq
        skipped: list[Hashable] = []
        found = False
        while m:
            t, _ = m.popitem(last=False)
            f = freq[t]
            if f > 0:
                freq[t] = f - 1
                m[t] = None
            elif t == key:
                found = True
                break
            else:
                skipped.append(t)
        _put_back(m, skipped)
        return found

    # -- asked: the same procedure on a virtual state --------------------------------------------
    def victims(self, need: int, protected: Container[Hashable] = ()) -> list[Hashable] | None:
        """The plan of :meth:`_plan`; the common case (one victim, no soft pins) is answered
        by a direct scan: the first key the walk would evict is the first unprotected one,
        from the tail, with frequency below the threshold (S) or 0 (M): promoted and
        second-chance keys move behind every key the walk has not reached."""
        if need > 0 and not self._pinnable:
            items, freq = self._items, self._freq
            if self._s_bytes >= self._small_cap:
                threshold = self.threshold
                for t in self._s:
                    if freq[t] < threshold and t not in protected:
                        if items[t].size >= need:
                            return [t]
                        break
            else:
                for t in self._m:
                    if not freq[t] and t not in protected:
                        if items[t].size >= need:
                            return [t]
                        break
        return super().victims(need, protected)

    # -- asked: the same procedure on a virtual state --------------------------------------------
    def _plan(self, need: int, protected: Container[Hashable], pins_ok: bool,
              forced: Sequence[Hashable]) -> tuple[list[Hashable], bool]:
        """The keys the procedure would evict, in order, until ``need`` bytes are freed (True)
        or nothing more can go (False); the first ``len(forced)`` evictions are ``forced``.

        Virtual state: each queue is ``skipped + rest of the real queue (a cursor) + keys the
        simulation appended``; ``skipped`` are the keys a walk stepped over, which stay at the
        tail and are looked at again by the next walk, as the real walks do."""
        items, freq, threshold, now = self._items, self._freq, self.threshold, self._now
        out: list[Hashable] = []
        s_skipped: list[Hashable] = []
        s_rest: Iterator[Hashable] = iter(self._s)
        m_skipped: list[Hashable] = []
        m_rest: Iterator[Hashable] = iter(self._m)
        m_appended: deque[Hashable] = deque()
        vfreq: dict[Hashable, int] = {}  # frequencies the simulation changed
        s_bytes = self._s_bytes

        def evictable(k: Hashable) -> bool:
            n = len(out)
            if n < len(forced):
                return k == forced[n]
            return k not in protected and (pins_ok or not soft_pinned(items[k], now))

        simple = pins_ok and not forced     # then evictable(k) is just "not protected"

        def walk_s() -> Hashable:
            nonlocal s_bytes
            for i, t in enumerate(s_skipped):
                if evictable(t):
                    del s_skipped[i]
                    s_bytes -= items[t].size
                    return t
            for t in s_rest:
                if freq[t] >= threshold:
                    s_bytes -= items[t].size
                    vfreq[t] = 0
                    m_appended.append(t)
                elif (t not in protected) if simple else evictable(t):
                    s_bytes -= items[t].size
                    return t
                else:
                    s_skipped.append(t)
            return _NONE

        def walk_m() -> Hashable:
            for i, t in enumerate(m_skipped):
                if evictable(t):
                    del m_skipped[i]
                    return t
            while True:
                t = next(m_rest, _NONE)
                if t is _NONE:
                    if not m_appended:
                        return _NONE
                    t = m_appended.popleft()
                f = vfreq.get(t)
                if f is None:
                    f = freq[t]
                if f > 0:
                    vfreq[t] = f - 1
                    m_appended.append(t)
                elif (t not in protected) if simple else evictable(t):
                    return t
                else:
                    m_skipped.append(t)

        s_first = (walk_s, walk_m)
        m_first = (walk_m, walk_s, walk_m)
        freed = 0
        while freed < need:
            walks = s_first if s_bytes >= self._small_cap else m_first
            for walk in walks:
                victim = walk()
                if victim is not _NONE:
                    break
            else:
                return out, False
            out.append(victim)
            freed += items[victim].size
        return out, True
