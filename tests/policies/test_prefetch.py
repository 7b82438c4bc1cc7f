"""Prefetch policies against a brute-force reference: what fits the budget, in what order."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies import PolicyError, available_prefetch, make_prefetch
from policies.base import Item

items = st.lists(st.tuples(st.integers(0, 12), st.integers(0, 40), st.integers(0, 5)),
                 max_size=30).map(
    lambda xs: [Item(k, size=s, depth=d) for k, s, d in xs])


def reference(upcoming: list[Item], budget: int, order: str) -> list[int]:
    """The first sighting of each key; ``queue``: take in order until one does not fit;
    ``shallow``: sort by (depth, position), take everything that still fits."""
    firsts: dict[object, tuple[int, int, Item]] = {}
    for pos, it in enumerate(upcoming):
        firsts.setdefault(it.key, (it.depth, pos, it))
    out: list[int] = []
    if order == "queue":
        for _, _, it in sorted(firsts.values(), key=lambda e: e[1]):
            if it.size > budget:
                break
            budget -= it.size
            out.append(it.key)  # type: ignore[arg-type]
    else:
        for _, _, it in sorted(firsts.values(), key=lambda e: (e[0], e[1])):
            if it.size <= budget:
                budget -= it.size
                out.append(it.key)  # type: ignore[arg-type]
    return out


@settings(max_examples=300, deadline=None)
@given(items, st.integers(0, 200), st.sampled_from(["queue", "shallow"]))
def test_hints_match_the_reference(upcoming: list[Item], budget: int, order: str) -> None:
    pol = make_prefetch(order)
    got = pol.hints(upcoming, budget)
    assert got == reference(upcoming, budget, order)
    size: dict[object, int] = {}
    for it in upcoming:
        size.setdefault(it.key, it.size)          # an object's first sighting counts
    assert sum(size[k] for k in got) <= budget
    assert len(set(got)) == len(got)
    assert pol.hints(upcoming, budget) == got        # asking changes nothing


def test_shallow_serves_every_queued_request_before_the_tails() -> None:
    a = [Item(("a", d), size=1, depth=d) for d in range(4)]
    b = [Item(("b", d), size=1, depth=d) for d in range(4)]
    assert make_prefetch("queue").hints(a + b, 4) == [it.key for it in a]
    assert make_prefetch("shallow").hints(a + b, 4) == [("a", 0), ("b", 0), ("a", 1), ("b", 1)]
    assert make_prefetch("shallow(max_depth=0)").hints(a + b, 8) == [("a", 0), ("b", 0)]


@pytest.mark.parametrize("spec", ["nope", "queue(n=1)", "shallow(max_depth=-1)",
                                  "shallow(max_depth=True)"])
def test_bad_prefetch_specs(spec: str) -> None:
    with pytest.raises(PolicyError):
        make_prefetch(spec)
    assert available_prefetch() == ["cooccur", "queue", "shallow"]
