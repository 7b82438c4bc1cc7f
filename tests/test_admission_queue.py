"""Admission against the queue and a policy's own ``admits``, in all three drivers: the
one-tier replay, the tiers replay and the engine's decision site."""

from __future__ import annotations

import math
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from rkvtest import SMALL, chunk_bytes, random_kv

from policies import AdmitAfter, EvictionPolicy, available, make_policy
from policies.belady import Belady
from rkv import Engine, EngineConfig, TierConfig
from rkv.eval.replay.simulate import CostModel, Trace, prepare, simulate
from rkv.eval.replay.tiers import Tier, simulate_tiers
from rkv.format.traces import Request

COST = CostModel(block_bytes=1, bandwidth=1e30, latency=0, recompute_tps=512)


def trace_of(seq: str | list[int]) -> Trace:
    return prepare([Request(float(i), 512, (k,)) for i, k in enumerate(seq)], COST)


def test_a_queued_block_is_admitted_whatever_the_rule() -> None:
    """Capacity 1, requests [a] [b] [b]. Blind, after(n=2) refuses b's first sighting and
    admits the second, which then has nothing left to hit; with a queue of 1, b is wanted by
    the next request, so it is admitted at once (a is not queued) and hit."""
    trace = trace_of("abb")
    blind = simulate(trace, make_policy("lru", 1), 1, COST, admission=AdmitAfter(n=2))
    queued = simulate(trace, make_policy("lru", 1), 1, COST, admission=AdmitAfter(n=2),
                      lookahead=1)
    assert (blind.hits, queued.hits) == (0, 1)
    # The tiers replay decides the same for its top tier; below it, a refused block waits.
    one = [simulate_tiers(trace, [Tier("t", make_policy("lru", 1), 1)], COST,
                          admission=AdmitAfter(n=2), lookahead=n) for n in (0, 1)]
    assert [r.hits for r in one] == [0, 1]
    two = simulate_tiers(trace, [Tier("t", make_policy("lru", 1), 1),
                                 Tier("u", make_policy("lru", 4), 4)], COST,
                         admission=AdmitAfter(n=2), lookahead=1, prefetch_budget=0)
    assert [t.hits for t in two.tiers] == [1, 0]     # served from the top, not from below


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 9), min_size=1, max_size=60), st.integers(1, 5),
       st.sampled_from([0, 2]))
def test_a_policys_own_admission_is_asked(seq: list[int], cap: int, lookahead: int) -> None:
    """``adaptive`` with the one candidate ``lru+after(n=2)`` judges admission through
    ``EvictionPolicy.admits``: the replays must give what LRU with that admission policy
    gives (if ``admits`` were not asked, it would be plain LRU)."""
    trace = trace_of(seq)
    ref = simulate(trace, make_policy("lru", cap), cap, COST, admission=AdmitAfter(n=2),
                   lookahead=lookahead)
    mine = simulate(trace, make_policy("adaptive(candidates=lru+after(n=2))", cap), cap,
                    COST, lookahead=lookahead)
    assert (mine.hits, mine.evictions) == (ref.hits, ref.evictions)
    tiers = simulate_tiers(trace, [Tier("t", make_policy("adaptive(candidates=lru+after(n=2))",
                                                         cap), cap)], COST,
                           lookahead=lookahead)
    assert (tiers.hits, tiers.evictions) == (ref.hits, ref.evictions)


def test_a_policys_own_admission_bites_somewhere() -> None:
    """The property above is not vacuous: on this trace admission changes the hits."""
    trace = trace_of([1, 2, 3, 1, 3, 3, 4, 1])
    plain = simulate(trace, make_policy("lru", 2), 2, COST)
    mine = simulate(trace, make_policy("adaptive(candidates=lru+after(n=2))", 2), 2, COST)
    assert (plain.hits, mine.hits) == (2, 3)


def _one_tier(cap_chunks: int, policy: str, size: int) -> EngineConfig:
    return EngineConfig(chunk_tokens=16, promote="never", tiers=(
        TierConfig("dram", medium="memory", path="t/dram", capacity_bytes=cap_chunks * size,
                   policy=policy),))


def _toks(seed: int) -> list[int]:
    return [(seed * 7919 + i * 31) % 30000 + 1 for i in range(16)]


def test_the_engine_admits_a_chunk_held_for_a_queued_request(tmp_path: Path) -> None:
    """Full tier, ``lru+after(n=2)`` (and ``adaptive`` led by it): a first-sighted chunk is
    refused, unless a queued request announced by ``prefetch`` wants it."""
    size = chunk_bytes()
    for policy in ("lru+after(n=2)", "adaptive(candidates=lru+after(n=2))"):
        with Engine.open(tmp_path / policy, _one_tier(2, policy, size)) as e:
            for i in range(2):
                assert e.put(_toks(i), random_kv(SMALL, 16, seed=i),
                             model=SMALL).chunks_written == 1
            refused = e.put(_toks(2), random_kv(SMALL, 16, seed=2), model=SMALL)
            assert (refused.chunks_written, refused.chunks_refused) == (0, 1), policy
            e.prefetch(_toks(3), model=SMALL).result(timeout=30)
            held = e.put(_toks(3), random_kv(SMALL, 16, seed=3), model=SMALL)
            assert (held.chunks_written, held.evicted_chunks) == (1, 1), policy
            assert e.lookup(_toks(3), model=SMALL) == 16


def test_the_admission_plus_is_the_first_outside_parentheses() -> None:
    from policies import split_spec

    assert split_spec("adaptive(candidates=lru+after(n=2))") == \
        ("adaptive(candidates=lru+after(n=2))", "all")
    assert split_spec("adaptive(candidates=lru|prefix+after(n=2))+after(n=3)") == \
        ("adaptive(candidates=lru|prefix+after(n=2))", "after(n=3)")
    assert split_spec(" prefix + after(n=2) ") == ("prefix", "after(n=2)")


def _bypass_min(seq: list[int], capacity: int) -> int:
    """Hits of Belady's MIN allowed to decline a miss: on a miss in a full cache, of the
    cached keys and the new one, the one used farthest ahead is dropped (perhaps the new one).
    For unit sizes this is optimal among caches that may bypass."""
    nxt: list[float] = [math.inf] * len(seq)
    last: dict[int, int] = {}
    for i in range(len(seq) - 1, -1, -1):
        nxt[i], last[seq[i]] = last.get(seq[i], math.inf), i
    cached: dict[int, float] = {}              # key -> its next use
    hits = 0
    for i, k in enumerate(seq):
        if k in cached:
            hits += 1
        elif len(cached) >= capacity:
            far = max(cached, key=cached.__getitem__)
            if cached[far] <= nxt[i]:
                continue                           # the new key is the farthest: bypass
            del cached[far]
        cached[k] = nxt[i]
    return hits


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 11), min_size=1, max_size=80), st.integers(1, 8))
def test_policies_that_may_bypass_never_beat_min_with_bypass(seq: list[int], cap: int) -> None:
    """A policy with its own admission (``adaptive``: a candidate with ``+after``) may beat
    plain MIN, which caches every miss, but never MIN allowed to bypass."""
    trace = trace_of(seq)
    best = _bypass_min(seq, cap)
    assert simulate(trace, Belady(cap, trace.next_use), cap, COST).hits <= best
    for name in available():
        pol = make_policy(name, cap)
        if type(pol).admits is not EvictionPolicy.admits:
            assert simulate(trace, pol, cap, COST).hits <= best, name


def test_bypass_can_beat_plain_min() -> None:
    """[1, 0, 1, 2, 1] in one slot: plain MIN must cache 0 and loses 1; declining 0 keeps it."""
    seq = [1, 0, 1, 2, 1]
    trace = trace_of(seq)
    assert simulate(trace, Belady(1, trace.next_use), 1, COST).hits == 0
    assert _bypass_min(seq, 1) == 2
    assert simulate(trace, make_policy("adaptive", 1), 1, COST).hits == 1
