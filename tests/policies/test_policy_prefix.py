"""The prefix-aware policy against a brute-force model of the same rule, on prefix chains."""

from __future__ import annotations

from collections.abc import Hashable

from hypothesis import given
from hypothesis import strategies as st
from policy_models import policy_step

from policies import Item, make_policy


class PrefixModel:
    """Leaf-only GreedyDual with a frequency history, by scanning everything each time."""

    def __init__(self, capacity: int, depth_weight: float, history: int) -> None:
        self.capacity, self.dw, self.history = capacity, depth_weight, history
        self.items: dict[Hashable, Item] = {}
        self.freq: dict[Hashable, int] = {}
        self.prio: dict[Hashable, tuple[float, int]] = {}
        self.hist: dict[Hashable, int] = {}
        self.ticks = self.seq = 0
        self.L = 0.0

    def _count(self, key: Hashable) -> int:
        n = self.hist[key] = self.hist.get(key, 0) + 1
        self.ticks += 1
        if self.ticks >= self.history * max(len(self.items), 64):
            self.ticks = 0
            self.hist = {k: c // 2 for k, c in self.hist.items() if c // 2}
        return n     # this access's count, before an aging it triggers (the key may be gone)

    def _set(self, key: Hashable) -> None:
        it = self.items[key]
        self.seq += 1
        v = self.freq[key] * it.miss_cost * (1 + it.depth) ** -self.dw / max(it.size, 1)
        self.prio[key] = (self.L + v, self.seq)

    def _leaf(self, key: Hashable, gone: set[Hashable]) -> bool:
        return not any(i.parent == key and k not in gone for k, i in self.items.items())

    def access(self, item: Item, protected: set[Hashable]) -> tuple[bool, list[Hashable] | None]:
        key = item.key
        n = self._count(key)
        if key in self.items:
            self.freq[key] = max(self.freq[key] + 1, n)
            self._set(key)
            return True, None
        need = sum(i.size for i in self.items.values()) + item.size - self.capacity
        out: list[Hashable] = []
        if need > 0:
            gone: set[Hashable] = set()
            freed = 0
            while freed < need:
                cands = [k for k in self.items if k not in protected and k not in gone
                         and self._leaf(k, gone)]
                if not cands:
                    break
                v = min(cands, key=lambda k: self.prio[k])
                gone.add(v)
                out.append(v)
                freed += self.items[v].size
            if freed < need:   # last resort: anything unprotected, by priority
                order = sorted((k for k in self.items if k not in protected),
                               key=lambda k: self.prio[k])
                out, freed = [], 0
                for k in order:
                    out.append(k)
                    freed += self.items[k].size
                    if freed >= need:
                        break
                if freed < need:
                    return False, None
            for v in out:
                self.L = max(self.L, self.prio[v][0])
                del self.items[v], self.freq[v], self.prio[v]
        self.items[key] = item
        self.freq[key] = max(1, self.hist.get(key, 0))
        self._set(key)
        return False, out


PARENT = {k: (None if k < 3 else (k - 3) // 2) for k in range(24)}   # a small forest


def path(node: int) -> list[int]:
    out: list[int] = []
    cur: int | None = node
    while cur is not None:
        out.append(cur)
        cur = PARENT[cur]
    return out[::-1]


@given(st.integers(2, 9), st.lists(st.integers(0, 23), min_size=1, max_size=60),
       st.sampled_from([(0.0, 32), (1.0, 32), (0.0, 1)]))
def test_prefix_matches_brute_force(capacity: int, requests: list[int],
                                    params: tuple[float, int]) -> None:
    dw, history = params
    policy = make_policy(f"prefix(depth_weight={dw}, history={history})", capacity)
    model = PrefixModel(capacity, dw, history)
    now = 0
    for node in requests:
        protected: set[Hashable] = set()
        for depth, key in enumerate(path(node)):
            item = Item(key, 1, parent=PARENT[key], depth=depth)
            got = policy_step(policy, item, now, frozenset(protected))
            want = model.access(item, protected)
            assert got == want, (node, key)
            protected.add(key)
            now += 1


def test_chains_are_eaten_from_the_tail() -> None:
    p = make_policy("prefix", 3)
    for depth, key in enumerate(["a", "b", "c"]):
        policy_step(p, Item(key, 1, parent=None if depth == 0 else "abc"[depth - 1],
                            depth=depth), depth)
    assert p.victims(1) == ["c"] and p.victims(2) == ["c", "b"]
    assert p.victims(1, protected={"c"}) == ["a"]     # last resort: no leaf can go
