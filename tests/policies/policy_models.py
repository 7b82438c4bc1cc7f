"""Reference models of the eviction policies and the cache simulation that drives them.

Each model is the paper's procedure written as plainly as possible over Python lists (index 0 is
the end things leave from), with no concern for speed. A model's ``access`` does what the
simulation driver does to a policy: on a hit, nothing but bookkeeping; on a miss, evict until
the new item fits (skipping ``protected`` keys; if the unprotected items cannot make room,
nothing is evicted and the item is not admitted), then insert.

Both return ``(hit, victims)``: ``victims`` is the list evicted on a miss (``[]`` if none was
needed) or ``None`` when the miss could not be admitted; on a hit it is ``None``.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence, Set
from typing import Any, Protocol

from policies import EvictionPolicy, Item, Reason

Step = tuple[bool, list[Hashable] | None]
NOTHING: frozenset[Any] = frozenset()


class Model(Protocol):
    def access(self, key: Hashable, size: int, protected: Set[Hashable]) -> Step: ...


def policy_step(policy: EvictionPolicy, item: Item, now: float,
                protected: Set[Hashable] = NOTHING) -> Step:
    """One reference through ``policy``, as a cache built on it would do it."""
    key = item.key
    if key in policy:
        policy.on_access(key, True, now)
        return True, None
    policy.on_access(key, False, now, item)
    need = policy.used + item.size - policy.capacity
    victims: list[Hashable] | None = []
    if need > 0:
        victims = policy.victims(need, protected)
        if victims is None:
            return False, None
        for v in victims:
            policy.on_remove(v, Reason.EVICTED)
    policy.on_insert(item, now)
    assert policy.used <= policy.capacity
    return False, victims


def run_policy(policy: EvictionPolicy, trace: Sequence[tuple[Hashable, Set[Hashable]]],
               make_item: Callable[[Hashable], Item]) -> list[Step]:
    return [policy_step(policy, make_item(k), i, prot) for i, (k, prot) in enumerate(trace)]


def run_model(model: Model, trace: Sequence[tuple[Hashable, Set[Hashable]]],
              sizes: Callable[[Hashable], int]) -> list[Step]:
    return [model.access(k, sizes(k), prot) for k, prot in trace]


class _Sized:
    """Common bookkeeping: sizes of cached items, capacity, the all-or-nothing check."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.size: dict[Hashable, int] = {}

    @property
    def used(self) -> int:
        return sum(self.size.values())

    def can_free(self, need: int, protected: Set[Hashable]) -> bool:
        return sum(s for k, s in self.size.items() if k not in protected) >= need


class ListModel(_Sized):
    """LRU (``lru=True``) or FIFO over one list."""

    def __init__(self, capacity: int, lru: bool) -> None:
        super().__init__(capacity)
        self.lru = lru
        self.q: list[Hashable] = []

    def access(self, key: Hashable, size: int, protected: Set[Hashable]) -> Step:
        if key in self.size:
            if self.lru:
                self.q.remove(key)
                self.q.append(key)
            return True, None
        need = self.used + size - self.capacity
        out: list[Hashable] = []
        if need > 0:
            if not self.can_free(need, protected):
                return False, None
            freed = 0
            for k in list(self.q):
                if freed >= need:
                    break
                if k in protected:
                    continue
                self.q.remove(k)
                freed += self.size.pop(k)
                out.append(k)
        self.q.append(key)
        self.size[key] = size
        return False, out


class SLRUModel(_Sized):
    def __init__(self, capacity: int, protected: float) -> None:
        super().__init__(capacity)
        self.cap = protected * capacity
        self.probation: list[Hashable] = []
        self.prot: list[Hashable] = []

    def access(self, key: Hashable, size: int, protected: Set[Hashable]) -> Step:
        if key in self.size:
            if key in self.prot:
                self.prot.remove(key)
                self.prot.append(key)
            else:
                self.probation.remove(key)
                self.prot.append(key)
                while sum(self.size[k] for k in self.prot) > self.cap and self.prot:
                    self.probation.append(self.prot.pop(0))
            return True, None
        need = self.used + size - self.capacity
        out: list[Hashable] = []
        if need > 0:
            if not self.can_free(need, protected):
                return False, None
            freed = 0
            for k in self.probation + self.prot:
                if freed >= need:
                    break
                if k in protected:
                    continue
                (self.probation if k in self.probation else self.prot).remove(k)
                freed += self.size.pop(k)
                out.append(k)
        self.probation.append(key)
        self.size[key] = size
        return False, out


class PriorityModel(_Sized):
    """LFU-DA / plain LFU / GDSF: priority ``L + count * weight``, min first, ties oldest."""

    def __init__(self, capacity: int, aging: bool,
                 weight: Callable[[Hashable, int], float] = lambda k, s: 1) -> None:
        super().__init__(capacity)
        self.aging = aging
        self.weight = weight
        self.count: dict[Hashable, int] = {}
        self.prio: dict[Hashable, float] = {}
        self.last: dict[Hashable, int] = {}
        self.age: float = 0
        self.clock = 0

    def _touch(self, key: Hashable) -> None:
        self.clock += 1
        self.last[key] = self.clock
        self.prio[key] = self.age + self.count[key] * self.weight(key, self.size[key])

    def access(self, key: Hashable, size: int, protected: Set[Hashable]) -> Step:
        if key in self.size:
            self.count[key] += 1
            self._touch(key)
            return True, None
        need = self.used + size - self.capacity
        out: list[Hashable] = []
        if need > 0:
            if not self.can_free(need, protected):
                return False, None
            freed = 0
            while freed < need:
                v = min((k for k in self.size if k not in protected),
                        key=lambda k: (self.prio[k], self.last[k]))
                if self.aging:
                    self.age = max(self.age, self.prio[v])
                freed += self.size.pop(v)
                del self.count[v], self.prio[v], self.last[v]
                out.append(v)
        self.size[key] = size
        self.count[key] = 1
        self._touch(key)
        return False, out


class SIEVEModel(_Sized):
    """SIEVE (NSDI'24, Algorithm 1): q[0] is the tail (oldest), new items go to the end (head);
    the hand moves from the tail toward the head, ``None`` meaning "start at the tail". The
    hand clears the bit of every item it passes, protected ones included."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.q: list[Hashable] = []
        self.visited: dict[Hashable, bool] = {}
        self.hand: int | None = None

    def _evict(self, protected: Set[Hashable]) -> Hashable:
        i = self.hand if self.hand is not None else 0
        while True:
            k = self.q[i]
            if k not in protected and not self.visited[k]:
                break
            self.visited[k] = False
            i = i + 1 if i + 1 < len(self.q) else 0
        del self.q[i]
        self.hand = i if i < len(self.q) else None
        del self.visited[k]
        return k

    def access(self, key: Hashable, size: int, protected: Set[Hashable]) -> Step:
        if key in self.size:
            self.visited[key] = True
            return True, None
        need = self.used + size - self.capacity
        out: list[Hashable] = []
        if need > 0:
            if not self.can_free(need, protected):
                return False, None
            freed = 0
            while freed < need:
                v = self._evict(protected)
                freed += self.size.pop(v)
                out.append(v)
        self.q.append(key)
        self.visited[key] = False
        self.size[key] = size
        return False, out


class S3FIFOModel(_Sized):
    """S3-FIFO (SOSP'23, Algorithm 1) with byte sizes; see ``policies.s3fifo`` for the
    treatment of protected items (stepped over, left in place)."""

    def __init__(self, capacity: int, small: float, threshold: int) -> None:
        super().__init__(capacity)
        self.small_cap = small * capacity
        self.ghost_cap = capacity - self.small_cap
        self.threshold = threshold
        self.s: list[Hashable] = []
        self.m: list[Hashable] = []
        self.g: list[tuple[Hashable, int]] = []
        self.freq: dict[Hashable, int] = {}

    def _walk_s(self, protected: Set[Hashable]) -> Hashable | None:
        i = 0
        while i < len(self.s):
            t = self.s[i]
            if self.freq[t] >= self.threshold:
                del self.s[i]
                self.m.append(t)
                self.freq[t] = 0
            elif t not in protected:
                del self.s[i]
                self.g.append((t, self.size[t]))
                while sum(sz for _, sz in self.g) > self.ghost_cap:
                    self.g.pop(0)
                return t
            else:
                i += 1
        return None

    def _walk_m(self, protected: Set[Hashable]) -> Hashable | None:
        i = 0
        while i < len(self.m):
            t = self.m[i]
            if self.freq[t] > 0:
                self.freq[t] -= 1
                del self.m[i]
                self.m.append(t)
            elif t not in protected:
                del self.m[i]
                return t
            else:
                i += 1
        return None

    def _evict(self, protected: Set[Hashable]) -> Hashable:
        walks: tuple[Callable[[Set[Hashable]], Hashable | None], ...]
        if sum(self.size[k] for k in self.s) >= self.small_cap:
            walks = (self._walk_s, self._walk_m)
        else:
            walks = (self._walk_m, self._walk_s, self._walk_m)
        for walk in walks:
            v = walk(protected)
            if v is not None:
                return v
        raise AssertionError("nothing evictable")

    def access(self, key: Hashable, size: int, protected: Set[Hashable]) -> Step:
        if key in self.size:
            self.freq[key] = min(self.freq[key] + 1, 3)
            return True, None
        ghost_hit = False
        for i, (k, _) in enumerate(self.g):
            if k == key:
                del self.g[i]
                ghost_hit = True
                break
        need = self.used + size - self.capacity
        out: list[Hashable] = []
        if need > 0:
            if not self.can_free(need, protected):
                return False, None
            freed = 0
            while freed < need:
                v = self._evict(protected)
                freed += self.size.pop(v)
                del self.freq[v]
                out.append(v)
        (self.m if ghost_hit else self.s).append(key)
        self.freq[key] = 0
        self.size[key] = size
        return False, out


class ARCModel:
    """ARC, the paper's pseudo-code (FAST'03, Fig. 4) for unit sizes, cases I-IV literally."""

    def __init__(self, capacity: int) -> None:
        self.c = capacity
        self.p: float = 0
        self.t1: list[Hashable] = []
        self.t2: list[Hashable] = []
        self.b1: list[Hashable] = []
        self.b2: list[Hashable] = []

    def _replace(self, key: Hashable) -> list[Hashable]:
        if self.t1 and ((key in self.b2 and len(self.t1) == self.p) or len(self.t1) > self.p):
            v = self.t1.pop(0)
            self.b1.append(v)
        else:
            v = self.t2.pop(0)
            self.b2.append(v)
        return [v]

    def access(self, key: Hashable, size: int, protected: Set[Hashable]) -> Step:
        assert size == 1 and not protected
        c = self.c
        if key in self.t1:                                    # case I
            self.t1.remove(key)
            self.t2.append(key)
            return True, None
        if key in self.t2:
            self.t2.remove(key)
            self.t2.append(key)
            return True, None
        if key in self.b1:                                    # case II
            d = 1 if len(self.b1) >= len(self.b2) else len(self.b2) / len(self.b1)
            self.p = min(c, self.p + d)
            out = self._replace(key)
            self.b1.remove(key)
            self.t2.append(key)
            return False, out
        if key in self.b2:                                    # case III
            d = 1 if len(self.b2) >= len(self.b1) else len(self.b1) / len(self.b2)
            self.p = max(0, self.p - d)
            out = self._replace(key)
            self.b2.remove(key)
            self.t2.append(key)
            return False, out
        out = []                                              # case IV
        l1 = len(self.t1) + len(self.b1)
        total = l1 + len(self.t2) + len(self.b2)
        if l1 == c:
            if len(self.t1) < c:
                self.b1.pop(0)
                out = self._replace(key)
            else:
                out = [self.t1.pop(0)]
        elif l1 < c and total >= c:
            if total == 2 * c:
                self.b2.pop(0)
            out = self._replace(key)
        self.t1.append(key)
        return False, out
