"""``reuse``: LRU over requests, with a learned bonus for blocks predicted to come back.

What the policy sees of a prefix cache, and what it makes of it:

* **Requests.** A lookup walks a prompt's blocks from depth 0, so an access at depth 0 (or
  one whose parent is not the block accessed just before) starts a request. The policy's
  clock counts requests, not references or seconds: recency is "how many requests ago", and
  every block of a request has the same age, the deepest taken first (a chain is eaten from
  its tail, so what is left of it still serves its prefix).
* **Features**, fixed when the request ends (when the next one starts), per block: its place
  from the end of the request (the last block, partial or full; the one before it; the rest),
  the request's turn (one more than the turn of the prefix it extends: a chat's third
  request is turn 3; capped at 6), the request's length (log2 blocks), the block's earlier
  sightings (a history that outlives eviction) and its parent's fan-out (distinct children
  seen), most informative first (the predictor backs off from the end).
* **Prediction.** :class:`policies.predictor.ReusePredictor` learns online, from every
  reference, the share of blocks in each feature cell referenced again within a horizon of
  ``horizon`` x the cache's eviction age (the mean age of its recent victims, in requests).
* **Eviction.** A block's key is ``t + weight x T x ln p``: ``t`` the request it was last
  used in, ``T`` the eviction age, ``p`` its predicted reuse (at least 0.001). The smallest
  key leaves first: a block predicted to come back half as often as another is treated as
  ``weight x T x ln 2`` requests older, so a block predicted dead (a request's partial last
  block: 1-2 % come back) leaves long before it is the oldest, while blocks of similar
  promise keep LRU's order. ``weight = 0`` is LRU over requests. The blocks of the request
  under way are keyed when it ends and leave last; soft pins are taken after everything.

O(log n) per block and request (a sorted list of keys); the predictor adds a few dictionary
operations per reference, the features a few more at each request's end.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Container, Hashable
from typing import Any

from sortedcontainers import SortedList  # type: ignore[import-untyped]

from policies.base import EvictionPolicy, Item, PolicyError, Reason, take_soft
from policies.predictor import Cell, ReusePredictor
from policies.table import register

#: Smoothing of the eviction age: the mean over about the last 256 victims.
_AGE_DECAY = 1.0 / 256
#: Predictions below this are taken as this (a log of 0 has no order).
_P_FLOOR = 1e-3


def _bucket(n: int, top: int) -> int:
    """0, 1, 2-3 -> 2, 4-7 -> 3, ... capped at ``top``."""
    return min(n.bit_length(), top)


@register("reuse")
class ReusePredicting(EvictionPolicy):
    """LRU over requests plus a learned reuse bonus (see the module docstring)."""

    def __init__(self, capacity: int, weight: float = 0.5, horizon: float = 1.0,
                 history: int = 32, memory: float = 4096.0) -> None:
        super().__init__(capacity)
        for name, v in (("weight", weight), ("horizon", horizon), ("memory", memory)):
            if not (isinstance(v, int | float) and math.isfinite(v) and v >= 0):
                raise PolicyError(f"{name} must be a finite number >= 0, got {v!r}")
        if horizon <= 0 or memory <= 0:
            raise PolicyError("horizon and memory must be > 0")
        if not isinstance(history, int) or history < 1:
            raise PolicyError(f"history must be an int >= 1, got {history!r}")
        self.weight = float(weight)
        self.horizon = float(horizon)
        self.history = history
        self.predictor = ReusePredictor(horizon=1.0, memory=memory)
        self._clock = 0                     # requests seen
        self._age = 0.0                     # eviction age (requests), 0: no victim yet
        self._seen: dict[Hashable, int] = {}    # sightings, cached or not (aged)
        self._kids: dict[Hashable, int] = {}    # distinct children seen per parent
        self._turn: dict[Hashable, int] = {}    # the turn of the request that brought a block
        self._ticks = 0
        self._prev: Hashable = None             # the key accessed last
        self._request: list[tuple[Hashable, int, int, bool]] = []  # key, depth, seen, partial
        self._full_cost = 0.0                   # the largest miss cost seen (a full block)
        self._last: dict[Hashable, int] = {}    # cached key -> request it was last used in
        self._p: dict[Hashable, float] = {}     # cached key -> predicted reuse
        self._keys: dict[Hashable, tuple[float, int, int]] = {}
        self._order: Any = SortedList()         # (key value, -depth, seq, key)
        self._seq = itertools.count()
        #: Cached blocks of the request under way (keyed when it ends), in request order.
        self._pending: dict[Hashable, None] = {}

    # -- the order -----------------------------------------------------------------------------
    def _place(self, key: Hashable, item: Item) -> None:
        old = self._keys.get(key)
        if old is not None:
            self._order.discard((*old, key))
        value = self._last[key] + self.weight * self._age * math.log(max(self._p[key], _P_FLOOR))
        new = (value, -item.depth, next(self._seq))
        self._keys[key] = new
        self._order.add((*new, key))

    # -- told ----------------------------------------------------------------------------------
    def _access(self, key: Hashable, hit: bool, now: float, item: Item | None) -> None:
        known = self._items.get(key) if hit else item
        depth = known.depth if known is not None else 0
        parent = known.parent if known is not None else None
        if depth == 0 or parent != self._prev or not self._request:
            self._end_request()
        self._prev = key
        seen = self._seen.get(key, 0)
        if seen == 0 and parent is not None:
            self._kids[parent] = self._kids.get(parent, 0) + 1
        self._seen[key] = seen + 1
        self._ticks += 1
        if self._ticks >= self.history * max(len(self._items), 64):
            self._age_history()
        cost = known.miss_cost if known is not None else 0.0
        if cost > self._full_cost:
            self._full_cost = cost
        self._request.append((key, depth, seen, cost < self._full_cost * 0.999))
        if hit:
            self._last[key] = self._clock
            self._hold(key)

    def _hold(self, key: Hashable) -> None:
        """Take ``key`` out of the order until the request ends (it is the most recent)."""
        old = self._keys.pop(key, None)
        if old is not None:
            self._order.discard((*old, key))
        self._pending[key] = None

    def _age_history(self) -> None:
        """Halve the sightings (old popularity fades) and forget fan-outs of parents no
        longer in the history, so both stay bounded."""
        self._ticks = 0
        self._seen = {k: c >> 1 for k, c in self._seen.items() if c > 1}
        self._kids = {k: c for k, c in self._kids.items() if k in self._seen}
        self._turn = {k: c for k, c in self._turn.items() if k in self._seen}

    def _end_request(self) -> None:
        """Fix the features of the request that just ended, observe them and re-key its
        cached blocks with their predicted reuse."""
        blocks = self._request
        if not blocks:
            self._clock += 1
            return
        now = self._clock
        pred = self.predictor
        pred.horizon = max(1.0, self.horizon * self._age) if self._age else 1e18
        n = len(blocks)
        lead = 0
        while lead < n and blocks[lead][2] > 0:
            lead += 1
        # The request's turn: one more than the turn of the prefix it extends (a new chat
        # after a shared system prompt is turn 1); its new blocks remember it.
        turn = self._turn.get(blocks[lead - 1][0], 0) + 1 if lead else 0
        turns = self._turn
        for key, _, _, _ in blocks[lead:]:
            if key not in turns:
                turns[key] = turn
        turn = min(turn, 6)
        length = _bucket(n, 7)
        memo: dict[Cell, float] = {}
        kids, cached = self._kids, self._items
        for j, (key, _, seen, partial) in enumerate(blocks):
            back = n - 1 - j
            place = (0 if partial else 1) if back == 0 else (2 if back == 1 else 3)
            parent_fan = kids.get(blocks[j - 1][0], 0) if j else 0
            cell: Cell = (place, turn, length, min(seen, 3), _bucket(parent_fan, 3))
            pred.observe(key, cell, now)
            if key in cached:
                p = memo.get(cell)
                if p is None:
                    p = memo[cell] = pred.p(cell, now)
                self._p[key] = p
        for key in self._pending:
            self._place(key, cached[key])
        self._pending = {}
        self._request = []
        self._clock += 1

    def _insert(self, item: Item, now: float) -> None:
        key = item.key
        self._last[key] = self._clock
        self._p[key] = self.predictor.p((3,), self._clock)
        self._hold(key)

    def _remove(self, item: Item, reason: Reason) -> None:
        key = item.key
        if key in self._pending:
            del self._pending[key]
        else:
            value, _, seq = self._keys.pop(key)
            self._order.discard((value, -item.depth, seq, key))
        last = self._last.pop(key)
        del self._p[key]
        if reason in (Reason.EVICTED, Reason.DEMOTED):
            age = self._clock - last
            self._age = float(age) if not self._age else \
                self._age + _AGE_DECAY * (age - self._age)

    # -- asked ---------------------------------------------------------------------------------
    def victims(self, need: int, protected: Container[Hashable] = ()) -> list[Hashable] | None:
        held = reversed(self._pending)           # the request under way, deepest first
        order = itertools.chain((e[3] for e in self._order), held)
        return take_soft(order, self._items, need, protected, self._now)

    def eviction_age(self) -> float:
        """The mean age of recent victims, in requests (0 before the first)."""
        return self._age
