"""Drive the engine and a plain-dict model of its semantics side by side."""

from __future__ import annotations

import shutil
import tempfile
from typing import Any

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)
from rkvtest import SMALL, local_config

from rkv import Engine
from rkv.eval.demo import synthetic_kv

CHUNK = 2
seqs = st.lists(st.integers(0, 2), min_size=0, max_size=7).map(tuple)


def chunk_prefixes(seq: tuple[int, ...]) -> list[tuple[int, ...]]:
    return [seq[: min(i + CHUNK, len(seq))] for i in range(0, len(seq), CHUNK)]


class DictModel:
    """The reference: chunk prefixes with children, end marks and pins."""

    def __init__(self) -> None:
        self.nodes: dict[tuple[int, ...], dict[str, Any]] = {}

    def stored(self, seq: tuple[int, ...]) -> list[tuple[int, ...]]:
        out = []
        for p in chunk_prefixes(seq):
            if p not in self.nodes:
                break
            out.append(p)
        return out

    def lookup(self, seq: tuple[int, ...]) -> int:
        s = self.stored(seq)
        return len(s[-1]) if s else 0

    def put(self, seq: tuple[int, ...]) -> None:
        parent = None
        for p in chunk_prefixes(seq):
            if p not in self.nodes:
                self.nodes[p] = {"kids": set(), "end": False, "pins": 0}
                if parent is not None:
                    self.nodes[parent]["kids"].add(p)
            parent = p
        if parent is not None:
            self.nodes[parent]["end"] = True

    def delete(self, seq: tuple[int, ...]) -> int:
        cs = chunk_prefixes(seq)
        if not cs or self.stored(seq) != cs:
            return 0
        self.nodes[cs[-1]]["end"] = False
        freed = 0
        for i in range(len(cs) - 1, -1, -1):
            node = self.nodes[cs[i]]
            if node["kids"] or node["end"] or node["pins"]:
                break
            del self.nodes[cs[i]]
            if i:
                self.nodes[cs[i - 1]]["kids"].discard(cs[i])
            freed += 1
        return freed

    def pin(self, seq: tuple[int, ...], delta: int) -> int:
        changed = 0
        for p in self.stored(seq):
            new = max(0, self.nodes[p]["pins"] + delta)
            changed += new != self.nodes[p]["pins"]
            self.nodes[p]["pins"] = new
        return changed


@settings(max_examples=100, stateful_step_count=30, deadline=None)
class EngineVsDict(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp()
        self.engine = Engine.open(self.dir, local_config(CHUNK))
        self.model = DictModel()

    def teardown(self) -> None:
        self.engine.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    stored = Bundle("stored")

    @rule(target=stored, seq=seqs)
    def put(self, seq: tuple[int, ...]) -> tuple[int, ...]:
        arr = np.array(seq, dtype=np.int64)
        self.engine.put(arr, synthetic_kv(SMALL, arr), model=SMALL)
        self.model.put(seq)
        return seq

    @rule(target=stored, seq=stored, cut=st.integers(0, 7), tail=seqs)
    def put_related(self, seq: tuple[int, ...], cut: int, tail: tuple[int, ...]
                    ) -> tuple[int, ...]:
        """A prefix of a stored sequence, or a branch off it: where sharing happens."""
        return self.put(seq[:cut] + tail[: cut % 3])

    @rule(seq=stored | seqs)
    def get(self, seq: tuple[int, ...]) -> None:
        arr = np.array(seq, dtype=np.int64)
        got = self.engine.get(arr, model=SMALL)
        n = self.model.lookup(seq)
        assert got.n_tokens == n and got.ok
        assert np.array_equal(got.kv, synthetic_kv(SMALL, arr[:n]))

    @rule(seq=stored | seqs)
    def lookup(self, seq: tuple[int, ...]) -> None:
        assert self.engine.lookup(list(seq), model=SMALL) == self.model.lookup(seq)

    @rule(seq=stored | seqs)
    def delete(self, seq: tuple[int, ...]) -> None:
        assert self.engine.delete(list(seq), model=SMALL) == self.model.delete(seq)

    @rule(seq=stored | seqs, pin=st.booleans())
    def pin(self, seq: tuple[int, ...], pin: bool) -> None:
        fn = self.engine.pin if pin else self.engine.unpin
        assert fn(list(seq), model=SMALL) == self.model.pin(seq, 1 if pin else -1)

    @rule()
    def reopen(self) -> None:
        self.engine.close()
        self.engine = Engine.open(self.dir)

    @precondition(lambda self: len(self.model.nodes) > 0)
    @rule()
    def clear(self) -> None:
        self.engine.clear()
        self.model.nodes.clear()

    @invariant()
    def counts_agree(self) -> None:
        st_ = self.engine.stats()
        assert st_["chunks"] == len(self.model.nodes)
        assert st_["pinned_chunks"] == sum(1 for n in self.model.nodes.values() if n["pins"])
        assert st_["tiers"]["dram"]["blocks"] == len(self.model.nodes) * SMALL.n_layers


TestEngineVsDict = EngineVsDict.TestCase
