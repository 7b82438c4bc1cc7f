"""The co-occurrence prefetch policy (``policies.prefetch.CoOccurrence``): steps are the
accesses sharing a ``now``; it predicts the next step's keys from the latest step's by
``P(b | a)`` averaged over the latest step; asking changes nothing."""

from __future__ import annotations

import copy

import pytest

from policies import CoOccurrence, PolicyError, make_prefetch
from policies.base import Item


def feed(pf: CoOccurrence, steps: list[list[object]]) -> None:
    for s, keys in enumerate(steps):
        for k in keys:
            pf.on_access(k, False, s)


def test_learns_what_follows() -> None:
    pf = make_prefetch("cooccur")
    assert isinstance(pf, CoOccurrence)
    # a -> x three times, a -> y once; b -> y twice
    feed(pf, [["a"], ["x"], ["a"], ["x"], ["a"], ["x"], ["a"], ["y"], ["b"], ["y"], ["b"],
              ["y"], ["a"]])
    p = pf.probabilities()
    assert p["x"] == pytest.approx(3 / 4) and p["y"] == pytest.approx(1 / 4)
    cands = [Item("y", size=1), Item("x", size=1), Item("z", size=1)]
    assert pf.hints(cands, 5) == ["x", "y"]        # z never followed a: not offered
    assert pf.hints(cands, 1) == ["x"]
    assert make_prefetch("cooccur(min_p=0.5)").hints(cands, 5) == []   # nothing learned
    strict = CoOccurrence(min_p=0.5)
    feed(strict, [["a"], ["x"], ["a"], ["x"], ["a"], ["x"], ["a"], ["y"], ["a"]])
    assert strict.hints(cands, 5) == ["x"]


def test_mean_over_the_latest_step_and_asking_changes_nothing() -> None:
    pf = CoOccurrence()
    feed(pf, [["a", "b"], ["x", "y"], ["a", "c"], ["x"], ["a", "b"]])
    # P(x|a) = 2/2, P(x|b) = 1/1 -> 1.0; P(y|a) = 1/2, P(y|b) = 1/1 -> 0.75
    p = pf.probabilities()
    assert p["x"] == pytest.approx(1.0) and p["y"] == pytest.approx(0.75)
    twin = copy.deepcopy(pf)
    cands = [Item("y", size=2), Item("x", size=3)]
    assert pf.hints(cands, 4) == ["x"]       # best first; y does not fit after x
    assert pf.hints(cands, 2) == ["y"]       # x does not fit: skipped
    assert pf.probabilities() == twin.probabilities()


def test_bad_parameters() -> None:
    for bad in ("cooccur(min_p=1)", "cooccur(min_p=-0.1)", "cooccur(min_p=True)",
                "cooccur(k=2)"):
        with pytest.raises(PolicyError):
            make_prefetch(bad)
