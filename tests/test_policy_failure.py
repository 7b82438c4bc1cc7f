"""A policy that breaks its contract inside a real Engine: the put fails with the typed
PolicyContractError (not the policies package's PolicyError), nothing of it is written, the
store stays as it was (an eviction planned earlier in the same put is rolled back too), and
the next put works."""

from __future__ import annotations

from collections.abc import Container, Hashable
from pathlib import Path

import numpy as np
import pytest
from rkvtest import SMALL, random_kv
from test_decisions import one_tier, toks

import policies.table
from policies import PolicyError
from policies.lru import LRU
from rkv import Engine
from rkv.errors import ConfigError, PolicyContractError, RkvError


class Broken(LRU):
    """LRU, except that while ``lie`` is set its ``honest``-th and later answers break the
    contract (shared by every instance: the engine rebuilds its policies after a failure)."""

    name = "test-broken"      # what register() would set
    lie: str | None = None
    honest = 0

    def victims(self, need: int, protected: Container[Hashable] = ()) -> list[Hashable] | None:
        out = super().victims(need, protected)
        if Broken.lie is None or Broken.honest > 0:
            Broken.honest -= 1
            return out
        if Broken.lie == "protected":
            return [k for k in self.keys() if k in protected][:1]
        if Broken.lie == "unknown":
            return [b"not a chunk of this tier"]
        return []                                  # "short": frees nothing


@pytest.fixture(autouse=True)
def broken_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    """``test-broken`` is registered for these tests only: registered at import it would be
    in every worker's table for the whole run, and tests that try every available policy
    would meet it."""
    monkeypatch.setitem(policies.table._TABLE, "test-broken", Broken)


@pytest.mark.parametrize("lie,match", [("protected", "is protected"),
                                       ("unknown", "is not in tier dram"),
                                       ("short", "free less")])
def test_a_broken_policy_fails_the_put_typed_and_changes_nothing(
        tmp_path: Path, lie: str, match: str) -> None:
    a, b, long = toks(16, seed=1), toks(16, seed=2), toks(48, seed=3)
    with Engine.open(tmp_path / "s", one_tier(3, "test-broken")) as e:
        e.put(a, random_kv(SMALL, 16, seed=1), model=SMALL)
        e.put(b, random_kv(SMALL, 16, seed=2), model=SMALL)
        # ``long``'s first chunk fits, its second evicts ``a`` (an honest answer), its third
        # gets the broken one: the whole put fails, the eviction of ``a`` with it.
        Broken.lie, Broken.honest = lie, 1
        try:
            with pytest.raises(PolicyContractError, match=match) as caught:
                e.put(long, random_kv(SMALL, 48, seed=3), model=SMALL)
        finally:
            Broken.lie = None
        assert Broken.honest == 0                   # the honest answer came first
        assert isinstance(caught.value, ConfigError) and isinstance(caught.value, RkvError)
        assert isinstance(caught.value.__cause__, PolicyError)
        assert "policy test-broken" in str(caught.value)
        assert e.lookup(long, model=SMALL) == 0
        assert e.lookup(a, model=SMALL) == 16 and e.lookup(b, model=SMALL) == 16
        assert np.array_equal(e.get(a, model=SMALL).kv, random_kv(SMALL, 16, seed=1))
        assert e.verify().clean
        res = e.put(long, random_kv(SMALL, 48, seed=3), model=SMALL)
        assert (res.chunks_written, res.evicted_chunks) == (3, 2)
        assert e.lookup(long, model=SMALL) == 48 and e.lookup(a, model=SMALL) == 0
        assert np.array_equal(e.get(long, model=SMALL).kv, random_kv(SMALL, 48, seed=3))
        assert e.verify().clean
