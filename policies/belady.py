"""Offline references: Belady's MIN (knows the future) and an infinite cache (never evicts).

Neither is registered with :func:`policies.make_policy`: Belady needs the future of the trace
it is replayed on, and the infinite cache is a ceiling, not a policy.
``rkv.eval.replay.simulate`` adds both to every comparison.

**Belady's MIN** evicts the cached key whose next use is farthest in the future (keys never used
again first). For unit-size objects and a cache that admits every miss it is optimal: no
policy gets more hits on the same reference sequence. With variable sizes (or miss costs) the
same rule is only the standard approximation; the exact optimum is NP-hard and bounded by
flow formulations (FOO/PFOO), which this module does not compute. MIN is optimal among
policies that cache every miss, which is what the :class:`~policies.base.EvictionPolicy`
interface and the replay driver model; a cache that may decline to store a miss (bypass) can
get more hits.

Time is the position of the reference in the trace: the caller passes ``now = i`` for the
``i``-th reference (``on_access`` and ``on_insert`` of that reference), and the policy reads the
next use of the key from the precomputed :func:`next_use_positions` of the sequence. That
array answers "the next use of the key referenced at ``i``", so it is only right for the key of
reference ``i``: a cache that inserts a key *ahead* of its reference (a prefetch) must pass the
function of :func:`next_use_after` instead, with ``now`` = the position of the last reference
already replayed (the prefetched key's next use is then its first reference after ``now``).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import OrderedDict
from collections.abc import Callable, Container, Hashable, Iterable, Sequence
from typing import Any

from sortedcontainers import SortedList  # type: ignore[import-untyped]

from policies.base import EvictionPolicy, Item, PolicyError, Reason

#: ``next_use(key, now)`` -> position of the next reference of ``key`` after ``now``
#: (``math.inf`` when there is none).
NextUseFn = Callable[[Hashable, int], float]


def next_use_positions(refs: Iterable[Hashable]) -> list[int]:
    """For each position ``i`` of ``refs``, the position of the next reference to the same key,
    or ``len(refs)`` when the key is never referenced again. One backward pass, O(n)."""
    seq = refs if isinstance(refs, Sequence) else list(refs)
    n = len(seq)
    out = [n] * n
    last: dict[Hashable, int] = {}
    get = last.get
    for i in range(n - 1, -1, -1):
        key = seq[i]
        out[i] = get(key, n)
        last[key] = i
    return out


def next_use_after(refs: Iterable[Hashable]) -> NextUseFn:
    """``next_use(key, now)`` over ``refs``: the position of the first reference to ``key``
    after position ``now``, ``math.inf`` when there is none (any key, referenced at ``now`` or
    not). Positions per key, then a binary search: O(log n) a call."""
    at: dict[Hashable, list[int]] = {}
    for i, key in enumerate(refs):
        at.setdefault(key, []).append(i)

    def next_use(key: Hashable, now: int) -> float:
        ps = at.get(key)
        if ps is None:
            return math.inf
        j = bisect.bisect_right(ps, now)
        return ps[j] if j < len(ps) else math.inf

    return next_use


class Belady(EvictionPolicy):
    """Belady's MIN over a known future.

    ``next_use`` is either the list from :func:`next_use_positions` (then ``now`` must be the
    integer position of the reference being reported, and any value ``>= len(next_use)`` means
    "never again") or a function ``(key, now) -> position`` returning ``math.inf`` for never.

    Keys never used again wait in an insertion-ordered list (any of them is an optimal victim,
    the oldest is taken first); the others sit in a ``SortedList`` of their next uses, updated on
    every hit, insert and removal (O(log n)). :meth:`victims` only reads: it walks the never-used
    keys, then the sorted next uses from the farthest, skipping protected keys.
    """

    name = "belady"

    def __init__(self, capacity: int, next_use: Sequence[int] | NextUseFn) -> None:
        super().__init__(capacity)
        if callable(next_use):
            self._fn: NextUseFn | None = next_use
            self._arr: Sequence[int] = ()
            self._never_at: float = math.inf
        elif isinstance(next_use, Sequence):
            self._fn = None
            self._arr = next_use
            self._never_at = len(next_use)
        else:
            raise PolicyError("next_use must be a sequence of positions or a function")
        self._never: OrderedDict[Hashable, None] = OrderedDict()  # cached, never used again
        # Sort tokens: the next use itself with an array (a position has one key, so tokens
        # are unique), (next use, sequence number) with a function.
        self._sorted: Any = SortedList()
        self._owner: dict[Any, Hashable] = {}     # token -> key
        self._token: dict[Hashable, Any] = {}     # key -> token (None: never used again)
        self._seq = itertools.count()

    def next_use(self, key: Hashable) -> float:
        """The next use of a cached key (``math.inf``: never)."""
        tok = self._token[key]
        if tok is None:
            return math.inf
        return float(tok[0] if self._fn is not None else tok)

    # -- told ------------------------------------------------------------------------------------
    def _place(self, key: Hashable, now: float) -> None:
        tok: Any
        if self._fn is None:
            try:
                tok = self._arr[int(now)]
            except IndexError:
                raise PolicyError(f"reference position {now!r} is outside the known future "
                                  f"(0..{len(self._arr) - 1})") from None
            never = tok >= self._never_at
            if not never and tok in self._owner:
                raise PolicyError(f"position {now!r} is not a reference to {key!r} "
                                  "(now must be the position of the reference in the trace)")
        else:
            nu = self._fn(key, int(now))
            never = nu == math.inf
            tok = (nu, next(self._seq))
        if never:
            self._token[key] = None
            self._never[key] = None
        else:
            self._token[key] = tok
            self._owner[tok] = key
            self._sorted.add(tok)

    def _forget(self, key: Hashable) -> None:
        tok = self._token.pop(key)
        if tok is None:
            del self._never[key]
        else:
            del self._owner[tok]
            self._sorted.remove(tok)

    def _insert(self, item: Item, now: float) -> None:
        self._place(item.key, now)

    def on_access(self, key: Hashable, hit: bool, now: float, item: Item | None = None
                  ) -> None:
        # Inlined from the base class (the hot path of a replay); same contract.
        if not hit:
            return
        if key not in self._items:
            raise PolicyError(f"hit on {key!r}, which is not in the cache")
        self._forget(key)
        self._place(key, now)

    def _access(self, key: Hashable, hit: bool, now: float, item: Item | None) -> None:
        pass  # on_access does the work

    def _remove(self, item: Item, reason: Reason) -> None:
        self._forget(item.key)

    # -- asked -----------------------------------------------------------------------------------
    def victims(self, need: int, protected: Container[Hashable] = ()) -> list[Hashable] | None:
        if need <= 0:
            return []
        items = self._items
        out: list[Hashable] = []
        freed = 0
        for key in self._never:                  # never used again: any of them is optimal
            if key not in protected:
                out.append(key)
                freed += items[key].size
                if freed >= need:
                    return out
        owner = self._owner
        for tok in reversed(self._sorted):       # farthest next use first
            key = owner[tok]
            if key not in protected:
                out.append(key)
                freed += items[key].size
                if freed >= need:
                    return out
        return None


class InfiniteCache(EvictionPolicy):
    """Never evicts: every key stays once inserted. Its hits are the ceiling for any policy on a
    trace (every reference but the first of each key). ``victims`` answers ``[]`` when nothing
    needs freeing and ``None`` otherwise, so give it a capacity of at least the trace's unique
    bytes."""

    name = "infinite"

    def _insert(self, item: Item, now: float) -> None:
        pass

    def _access(self, key: Hashable, hit: bool, now: float, item: Item | None) -> None:
        pass

    def _remove(self, item: Item, reason: Reason) -> None:
        pass

    def victims(self, need: int, protected: Container[Hashable] = ()) -> list[Hashable] | None:
        return [] if need <= 0 else None
