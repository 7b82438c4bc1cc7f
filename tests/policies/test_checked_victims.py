"""``policies.base.checked_victims``, the one check of the victim contract every caller asks
through: each clause a policy can break is caught with a PolicyError naming the policy and the
place, and a correct answer (or ``None``) comes back as the policy gave it."""

from __future__ import annotations

from collections.abc import Container, Hashable

import pytest

from policies import EvictionPolicy, Item, PolicyError, Reason, make_policy
from policies.base import checked_victims


class Scripted(EvictionPolicy):
    """Answers ``victims`` with whatever the test put in ``answer``."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.answer: list[Hashable] | None = None

    def _insert(self, item: Item, now: float) -> None: ...

    def _access(self, key: Hashable, hit: bool, now: float, item: Item | None) -> None: ...

    def _remove(self, item: Item, reason: Reason) -> None: ...

    def victims(self, need: int, protected: Container[Hashable] = ()) -> list[Hashable] | None:
        return self.answer


def scripted(answer: list[Hashable] | None) -> Scripted:
    """A policy holding a (2 bytes), b (3) and c (4) that answers ``answer``."""
    p = Scripted(10)
    for i, (key, size) in enumerate([("a", 2), ("b", 3), ("c", 4)]):
        p.on_insert(Item(key, size=size), i)
    p.answer = answer
    return p


@pytest.mark.parametrize("answer,need,match", [
    (["a", "nowhere"], 2, r"victim 'nowhere' is not in tier dram \(the policy does not hold"),
    (["b", "a"], 4, r"victim 'a' in tier dram is protected"),
    (["a", "a"], 4, r"a victim in tier dram is named twice"),
    (["a", "b"], 6, r"victims free less than the 6 bytes asked for in tier dram \(5\)"),
    ([], 1, r"victims free less than the 1 bytes asked for in tier dram \(0\)"),
])
def test_each_broken_clause_is_caught(answer: list[Hashable], need: int, match: str) -> None:
    with pytest.raises(PolicyError, match=match) as caught:
        checked_victims(scripted(answer), need, {"a"} if "protected" in match else (),
                        "tier dram")
    assert str(caught.value).startswith("policy Scripted: ")


def test_a_correct_answer_and_none_pass_unchanged() -> None:
    p = scripted(["b", "a"])
    assert checked_victims(p, 5, {"c"}) == ["b", "a"]
    assert checked_victims(p, 1) == ["b", "a"]        # freeing more than asked is allowed
    assert len(p) == 3 and p.used == 9                 # asking removed nothing
    p.answer = None
    assert checked_victims(p, 100) is None


def test_registered_policies_pass_and_are_named() -> None:
    lru = make_policy("lru", 10)
    for i, key in enumerate("xyz"):
        lru.on_insert(Item(key, size=3), i)
    assert checked_victims(lru, 4, {"x"}) == ["y", "z"]
    assert checked_victims(lru, 7, {"x"}) is None
    lru.victims = lambda need, protected=(): ["x"]  # type: ignore[method-assign]
    with pytest.raises(PolicyError, match=r"^policy lru: victim 'x' in the cache is protected"):
        checked_victims(lru, 1, {"x"})
