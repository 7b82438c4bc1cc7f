"""The contract of ``policies.base`` for every built-in policy: asking ``victims`` has no side
effects, answers are all-or-nothing, protected keys are never returned, soft-pinned keys only
when nothing else frees enough; and the registry builds them by spec."""

from __future__ import annotations

import copy
from collections.abc import Hashable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_models import NOTHING, policy_step

from policies import EvictionPolicy, Item, PolicyError, Reason, available, make_policy
from policies.arc import ARC
from policies.s3fifo import S3FIFO

SPECS = ["lru", "fifo", "slru", "slru(protected=0.3)", "lfu", "lfu(decay=False)", "gdsf",
         "sieve", "s3fifo", "s3fifo(small=0.3, threshold=2)", "arc", "prefix",
         "prefix(depth_weight=1.0, history=1)", "activation",
         "activation(halflife=3, depth_weight=1.0)", "reuse",
         "reuse(weight=2, horizon=0.5, history=1, memory=8)", "adaptive",
         "adaptive(candidates=lru|s3fifo+after|reuse(weight=0), horizon=0.01, margin=0)"]
KEYS = 10


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[int, list[Item], list[tuple[int, frozenset[int]]]]:
    """(capacity, the item of each key, [(key, protected set)]). Some items carry deadlines
    (reference ``i`` happens at time ``i``), so some are soft-pinned at times."""
    capacity = draw(st.integers(1, 12))
    items = [Item(k, size=draw(st.integers(1, capacity)),
                  miss_cost=draw(st.sampled_from([0.0, 1.0, 3.0])),
                  deadline=draw(st.one_of(st.none(), st.floats(0, 80))))
             for k in range(KEYS)]
    prot = st.one_of(st.just(NOTHING), st.sets(st.integers(0, KEYS - 1), max_size=3)
                     .map(frozenset))
    trace = draw(st.lists(st.tuples(st.integers(0, KEYS - 1), prot), max_size=80))
    return capacity, items, trace


queries = st.lists(st.tuples(st.integers(-1, 30),
                             st.sets(st.integers(0, KEYS - 1), max_size=4).map(frozenset)),
                   min_size=1, max_size=4)


def cached(policy: EvictionPolicy) -> list[Hashable]:
    return list(policy.keys())


def pinned(item: Item, now: float) -> bool:
    return item.deadline is not None and item.deadline > now


def check_answer(policy: EvictionPolicy, need: int, protected: frozenset[int], now: float,
                 answer: list[Hashable] | None) -> None:
    free = [k for k in cached(policy) if k not in protected]
    size = {k: policy.item(k).size for k in cached(policy)}
    if need <= 0:
        assert answer == []
        return
    if sum(size[k] for k in free) < need:
        assert answer is None
        return
    assert answer is not None
    assert len(set(answer)) == len(answer)
    assert all(k in policy and k not in protected for k in answer)
    assert sum(size[k] for k in answer) >= need
    assert sum(size[k] for k in answer[:-1]) < need  # no more than needed
    unpinned = sum(size[k] for k in free if not pinned(policy.item(k), now))
    if unpinned >= need and policy.name != "lru":  # LRU ignores deadlines
        assert not any(pinned(policy.item(k), now) for k in answer)


@pytest.mark.parametrize("spec", SPECS)
@settings(max_examples=100, deadline=None)
@given(scenario=scenarios(), asks=queries, split=st.integers(0, 80))
def test_victims_has_no_side_effects(spec: str, scenario: tuple[int, list[Item], list[
        tuple[int, frozenset[int]]]], asks: list[tuple[int, frozenset[int]]], split: int
                                     ) -> None:
    capacity, items, trace = scenario
    policy = make_policy(spec, capacity)
    for i, (k, prot) in enumerate(trace[:split]):
        policy_step(policy, items[k], i, prot)
    twin = copy.deepcopy(policy)  # never asked anything
    for i, (k, prot) in enumerate(trace[split:], start=min(split, len(trace))):
        for need, qprot in asks:
            assert policy.victims(need, qprot) == twin.victims(need, qprot)
            policy.victims(need, qprot)
        assert policy_step(policy, items[k], i, prot) == policy_step(twin, items[k], i, prot)
        assert (policy.used, len(policy)) == (twin.used, len(twin))


@pytest.mark.parametrize("spec", SPECS)
@settings(max_examples=100, deadline=None)
@given(scenario=scenarios(), asks=queries)
def test_victims_all_or_nothing(spec: str, scenario: tuple[int, list[Item], list[
        tuple[int, frozenset[int]]]], asks: list[tuple[int, frozenset[int]]]) -> None:
    capacity, items, trace = scenario
    policy = make_policy(spec, capacity)
    now = float("-inf")
    for i, (k, prot) in enumerate(trace):
        for need, qprot in asks:
            check_answer(policy, need, qprot, now, policy.victims(need, qprot))
        policy_step(policy, items[k], i, prot)
        now = i
        assert policy.used == sum(policy.item(k).size for k in cached(policy)) <= capacity


@pytest.mark.parametrize("spec", SPECS)
@settings(max_examples=100, deadline=None)
@given(scenario=scenarios(), asks=queries)
def test_removing_victims_follows_the_plan(spec: str, scenario: tuple[int, list[Item], list[
        tuple[int, frozenset[int]]]], asks: list[tuple[int, frozenset[int]]]) -> None:
    """``on_remove`` replays what ``victims`` simulated: once the first victim is gone, the
    rest of the answer is the answer for the rest of the need."""
    capacity, items, trace = scenario
    policy = make_policy(spec, capacity)
    for i, (k, prot) in enumerate(trace):
        policy_step(policy, items[k], i, prot)
        need, qprot = asks[i % len(asks)]
        answer = policy.victims(need, qprot)
        trial = copy.deepcopy(policy)
        while answer:
            need -= trial.item(answer[0]).size
            trial.on_remove(answer[0], Reason.EVICTED)
            answer = answer[1:]
            assert trial.victims(need, qprot) == answer


@pytest.mark.parametrize("spec", SPECS)
def test_other_removals_and_empty_cache(spec: str) -> None:
    policy = make_policy(spec, 10)
    assert policy.victims(1) is None
    assert policy.victims(0) == []
    for k in range(5):
        policy.on_access(k, False, k, Item(k, size=2))
        policy.on_insert(Item(k, size=2), k)
    policy.on_access(1, True, 5)
    policy.on_remove(3, Reason.DELETED)
    policy.on_remove(0, Reason.UNCORRECTABLE)
    policy.on_remove(4, Reason.PROMOTED)
    assert sorted(cached(policy)) == [1, 2] and policy.used == 4  # type: ignore[type-var]
    assert sorted(policy.victims(4)) == [1, 2]  # type: ignore[type-var, arg-type]
    assert policy.victims(5) is None
    assert policy.victims(4, protected={1}) is None
    for k in (1, 2):
        policy.on_remove(k, Reason.EVICTED)
    assert len(policy) == 0 and policy.used == 0 and policy.victims(1) is None


@pytest.mark.parametrize("spec", [s for s in SPECS if s != "lru"])
def test_soft_pins_go_last(spec: str) -> None:
    policy = make_policy(spec, 4)
    for k in range(4):
        item = Item(k, deadline=100.0 if k < 2 else None)
        policy.on_access(k, False, k, item)
        policy.on_insert(item, k)
    assert set(policy.victims(2) or ()) == {2, 3}
    answer = policy.victims(3)
    assert answer is not None and len(answer) == 3 and {2, 3} <= set(answer)
    assert policy.victims(2, protected={3}) is not None
    policy.on_access(3, True, 101)  # the deadlines have passed
    assert policy.victims(4) is not None and len(policy.victims(2) or ()) == 2


# -- policy-specific behaviour ---------------------------------------------------------------


def test_s3fifo_ghost_hit_goes_to_main() -> None:
    p = make_policy("s3fifo(small=0.25)", 4)
    assert isinstance(p, S3FIFO)
    for k in range(4):
        policy_step(p, Item(k), k)
    assert p.queues() == ([0, 1, 2, 3], [], [])
    policy_step(p, Item(9), 4)          # S is over its share: its tail, 0, becomes a ghost
    assert p.queues() == ([1, 2, 3, 9], [], [0])
    policy_step(p, Item(1), 5)          # hit: 1 will be promoted
    assert policy_step(p, Item(0), 6) == (False, [2])  # 1 moves to M, 2 is evicted
    s, m, g = p.queues()
    assert m == [1, 0] and 0 not in g and s == [3, 9]


def test_arc_adapts_p() -> None:
    p = make_policy("arc", 4)
    assert isinstance(p, ARC)
    for t, k in enumerate([0, 1, 2, 3, 0, 1]):
        policy_step(p, Item(k), t)
    assert p.lists() == ([2, 3], [0, 1], [], [])
    assert policy_step(p, Item(4), 6) == (False, [2])   # T1's LRU goes to B1
    assert p.lists()[2] == [2] and p.p == 0
    assert policy_step(p, Item(2), 7) == (False, [3])   # B1 hit: p grows, 2 enters T2
    assert p.p == 1 and p.lists() == ([4], [0, 1, 2], [3], [])


def test_lfu_aging_lets_old_favourites_go() -> None:
    aged, plain = make_policy("lfu", 2), make_policy("lfu(decay=False)", 2)
    for p in (aged, plain):
        for t in range(4):
            policy_step(p, Item("old"), t)         # "old": 4 references
        for t, k in enumerate(["a", "b", "a", "b", "a", "b", "a", "b"], start=4):
            policy_step(p, Item(k), t)
    assert "old" in plain and "old" not in aged


def test_gdsf_prefers_cheap_big_items() -> None:
    p = make_policy("gdsf", 10)
    policy_step(p, Item("cheap-big", size=5, miss_cost=1.0), 0)
    policy_step(p, Item("dear-small", size=1, miss_cost=5.0), 1)
    policy_step(p, Item("dear-big", size=4, miss_cost=8.0), 2)
    assert p.victims(1) == ["cheap-big"]


def test_registry() -> None:
    p = make_policy("s3fifo(small=0.2)", 100)
    assert isinstance(p, S3FIFO) and p.small == 0.2 and p.name == "s3fifo"
    assert p.capacity == 100
    for name in ["arc", "fifo", "gdsf", "lfu", "lru", "s3fifo", "sieve", "slru"]:
        assert name in available()
        assert make_policy(name, 10).name == name
    for spec in SPECS:
        make_policy(spec, 0)
    for bad in ["nosuch", "fifo(x=1)", "s3fifo(small=2)", "s3fifo(small='a')",
                "s3fifo(threshold=0)", "s3fifo(threshold=1.5)", "slru(protected=-0.1)",
                "slru(protected=True)", "lfu(decay=1)", "arc(p=3)", "gdsf(aging=False)",
                "sieve(1)", "lfu(decay=x)"]:
        with pytest.raises(PolicyError):
            make_policy(bad, 10)
