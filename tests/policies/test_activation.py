"""The activation-aware policy (``policies.activation``) against a brute-force reference: the
victim is the cached key with the lowest decayed activation count times its depth weight;
scores survive eviction; prefetched (inserted, never accessed) keys go first; parameters are
validated; rescaling keeps the order."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_models import policy_step

from policies import Item, PolicyError, Reason, make_policy
from policies.activation import ActivationAware


def reference_scores(history: list[object], halflife: float) -> dict[object, float]:
    """Each key's sum of 2 ** -(age / halflife) over its accesses (age in accesses)."""
    n = len(history)
    out: dict[object, float] = {}
    for i, k in enumerate(history):
        out[k] = out.get(k, 0.0) + 2.0 ** (-(n - 1 - i) / halflife)
    return out


@settings(max_examples=200, deadline=None)
@given(seq=st.lists(st.integers(0, 9), max_size=120), cap=st.integers(1, 6),
       halflife=st.sampled_from([1.0, 3.0, 10.0]), dw=st.sampled_from([0.0, 1.0]))
def test_victims_are_the_lowest_weighted_scores(seq: list[int], cap: int, halflife: float,
                                                dw: float) -> None:
    pol = ActivationAware(cap, halflife=halflife, depth_weight=dw)
    history: list[object] = []
    for i, k in enumerate(seq):
        item = Item(k, depth=k % 3)
        if k not in pol and len(pol) >= cap:
            ref = reference_scores([*history, k], halflife)
            weighted = {c: ref.get(c, 0.0) * (1 + pol.item(c).depth) ** -dw for c in pol}
            victim = pol.victims(1)
            assert victim is not None and len(victim) == 1
            low = min(weighted.values())
            assert weighted[victim[0]] <= low * (1 + 1e-9) + 1e-12
        policy_step(pol, item, i)
        history.append(k)
        ref = reference_scores(history, halflife)
        for c in pol:
            assert pol.score(c) == pytest.approx(ref[c], rel=1e-9, abs=1e-12)


def test_scores_outlive_eviction_and_prefetched_keys_go_first() -> None:
    pol = ActivationAware(2, halflife=1000)
    for i, k in enumerate([1, 1, 1, 2]):
        policy_step(pol, Item(k), i)
    assert pol.victims(1) == [2]
    policy_step(pol, Item(3), 4)           # evicts 2 (one activation) over 1 (three)
    assert set(pol.keys()) == {1, 3}
    assert pol.score(2) == pytest.approx(1.0, rel=1e-3)   # remembered after eviction
    pol.on_remove(3, Reason.EVICTED)
    pol.on_insert(Item(4), 5)              # a prefetch: inserted, never accessed
    assert pol.victims(1) == [4]
    pol.on_remove(4, Reason.DELETED)
    pol.on_access(2, False, 6, Item(2))    # 2 comes back with its history: 2 activations
    pol.on_insert(Item(2), 6)
    assert pol.score(2) == pytest.approx(2.0, rel=1e-2)
    assert pol.victims(1) == [2]           # still below 1's three


def test_rescaling_keeps_order_and_forgets_dead_keys() -> None:
    pol = ActivationAware(3, halflife=0.5)   # the unit grows 4x per access: rescales often
    for i in range(2000):
        policy_step(pol, Item(i % 5 if i % 7 else 99), i)
    assert len(pol._score) <= 5 + 3
    assert pol.victims(1) is not None
    ranked = sorted(pol.keys(), key=pol.score)
    assert pol.victims(len(ranked)) == ranked


def test_registered_and_validated() -> None:
    assert type(make_policy("activation(window=8)", 10)) is ActivationAware
    for bad in ("activation(halflife=0)", "activation(window=-1)",
                "activation(depth_weight=True)", "activation(window=0)",
                "activation(halflife=float('inf'))"):
        with pytest.raises(PolicyError):
            make_policy(bad, 10)
