"""The replay's queue given as a time window (``--lookahead 75s``): parsing, the queue bounds
against a brute-force count, known answers where a time and a count differ, a differential
against a from-scratch LRU that recomputes the queue at every request, the same results as
a count when arrivals are evenly spaced (one tier, several tiers, a real store), and the
command line."""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from itertools import pairwise
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rkvtest import prefix_requests

from policies import EvictionPolicy, make_policy
from rkv.cli import main
from rkv.errors import ConfigError
from rkv.eval.replay.queue import MAX_WINDOW_S, Lookahead, parse_lookahead, queue_lengths
from rkv.eval.replay.simulate import (
    CostModel,
    Trace,
    parse_capacity,
    prepare,
    run_replay,
    simulate,
)
from rkv.eval.replay.store import replay_on_store
from rkv.eval.replay.tiers import Tier, simulate_tiers
from rkv.format.traces import Request

UNIT = CostModel(block_bytes=1, bandwidth=1.0, latency=0.5, recompute_tps=512)


def timed_trace(reqs: Sequence[Sequence[Hashable]], times: Sequence[float]) -> Trace:
    return prepare([Request(float(t), 512 * len(b) - 100, tuple(b), 512)
                    for t, b in zip(times, reqs, strict=True)], UNIT)


# -- parsing ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, want", [
    (0, Lookahead()), ("0", Lookahead()), (256, Lookahead(requests=256)),
    ("256", Lookahead(requests=256)), (" 16 ", Lookahead(requests=16)),
    ("75s", Lookahead(seconds=75.0)), ("1.5s", Lookahead(seconds=1.5)),
    ("500ms", Lookahead(seconds=0.5)), ("2min", Lookahead(seconds=120.0)),
    ("0s", Lookahead()),
])
def test_parse_lookahead(text: object, want: Lookahead) -> None:
    got = parse_lookahead(text)
    assert got == want and parse_lookahead(got) is got
    assert bool(got) == bool(want.requests or want.seconds)


@pytest.mark.parametrize("bad", [
    -1, "-2", "1.5", "s", "75 sec", "inf", "nans", "1e3s", "", True, None, 2.5, [4],
    "9" * 13, f"{MAX_WINDOW_S + 1:.0f}s", "75s " * 3,
])
def test_parse_lookahead_refuses(bad: object) -> None:
    with pytest.raises(ConfigError):
        parse_lookahead(bad)


def test_lookahead_is_a_count_or_a_time() -> None:
    with pytest.raises(ConfigError, match="not both"):
        Lookahead(requests=3, seconds=1.0)
    for bad in ({"requests": -1}, {"seconds": -0.5}, {"seconds": float("nan")},
                {"seconds": float("inf")}, {"requests": True}):
        with pytest.raises(ConfigError):
            Lookahead(**bad)  # type: ignore[arg-type]
    assert [Lookahead(requests=3).text, Lookahead(seconds=0.25).text, Lookahead().text] == \
        ["3", "0.25s", ""]


# -- the queue's bounds ----------------------------------------------------------------------------
@settings(max_examples=200)
@given(st.lists(st.floats(0, 100, allow_nan=False), max_size=40), st.floats(0.001, 50),
       st.booleans())
def test_ends_match_a_brute_force_count(times: list[float], window: float,
                                        in_order: bool) -> None:
    if in_order:
        times = sorted(times)
    ends = Lookahead(seconds=window).ends(len(times), times)
    n = len(times)
    clock = [max(times[:i + 1]) for i in range(n)]     # what the engine saw by then
    for r in range(n):
        queued = [q for q in range(r + 1, n) if clock[q] <= clock[r] + window]
        assert queued == list(range(r + 1, r + 1 + len(queued)))   # contiguous
        assert ends[r] == r + 1 + len(queued)
    assert all(a <= b for a, b in pairwise(ends))
    assert queue_lengths(ends) == [e - r - 1 for r, e in enumerate(ends)]


def test_ends_of_a_count_and_of_no_queue() -> None:
    assert Lookahead(requests=2).ends(5) == [3, 4, 5, 5, 5]
    assert Lookahead().ends(3) == [1, 2, 3]
    # a burst then a lull: the window holds the whole burst and nothing across the lull
    assert Lookahead(seconds=1).ends(6, [0, 0.1, 0.2, 9, 9.5, 30]) == [3, 3, 3, 5, 5, 6]


def test_a_time_window_follows_arrivals_where_a_count_does_not() -> None:
    """Capacity 1: a b a. With a, b, a arriving at 0, 0.5 and 10 s, a 1 s window does not see
    the second a while b is served (b evicts a: no hit), a 20 s window does (a is kept and
    b is not cached: one hit); a count of 1 sees it whenever it arrives."""
    reqs = [("a",), ("b",), ("a",)]
    late = timed_trace(reqs, [0, 0.5, 10])
    soon = timed_trace(reqs, [0, 0.5, 1.0])

    def lru() -> EvictionPolicy:
        return make_policy("lru", 1)

    assert simulate(late, lru(), 1, UNIT, lookahead="1s").hits == 0
    assert simulate(late, lru(), 1, UNIT, lookahead="20s").hits == 1
    assert simulate(soon, lru(), 1, UNIT, lookahead="1s").hits == 1
    assert simulate(late, lru(), 1, UNIT, lookahead=1).hits == 1
    r = simulate(late, lru(), 1, UNIT, lookahead="20s")
    assert (r.lookahead, r.lookahead_s) == (0, 20.0)


def reference_lru(reqs: Sequence[Sequence[Hashable]], times: Sequence[float],
                  capacity: int, window: float) -> int:
    """Hits of an LRU of ``capacity`` unit blocks that, at every request, recomputes the
    queue from scratch (requests after it that the engine has seen by ``window`` seconds
    later) and never evicts a queued block or one the request has touched; a miss that
    finds nothing to evict is not cached, and a queued block is admitted like any other."""
    cache: OrderedDict[Hashable, None] = OrderedDict()
    hits = 0
    n = len(reqs)
    clock = [max(times[:i + 1]) for i in range(n)]
    for r, blocks in enumerate(reqs):
        # the queue: every later request up to the first the engine has not seen yet
        first_out = next((q for q in range(r + 1, n) if clock[q] > clock[r] + window), n)
        queued = {k for q in range(r + 1, first_out) for k in reqs[q]}
        touched: set[Hashable] = set()
        for key in blocks:
            if key in cache:
                cache.move_to_end(key)
                hits += 1
            elif len(cache) < capacity:
                cache[key] = None
            else:
                victim = next((k for k in cache if k not in queued and k not in touched), None)
                if victim is not None:
                    del cache[victim]
                    cache[key] = None
            touched.add(key)
    return hits


@settings(max_examples=150, deadline=None)
@given(prefix_requests(), st.data(), st.integers(1, 8), st.sampled_from([0.5, 1.0, 3.0, 40.0]))
def test_one_tier_window_equals_a_from_scratch_queue(reqs: list[tuple[int, ...]],
                                                     data: st.DataObject, capacity: int,
                                                     window: float) -> None:
    times = data.draw(st.lists(st.sampled_from([0.0, 0.4, 1.0, 2.5, 6.0]), min_size=len(reqs),
                               max_size=len(reqs)))
    times = [sum(times[:i + 1]) for i in range(len(times))]    # gaps -> arrival times
    if data.draw(st.booleans()):                               # an access log steps back
        times = [t - (3.0 if i % 3 == 2 else 0.0) for i, t in enumerate(times)]
    trace = timed_trace(reqs, times)
    got = simulate(trace, make_policy("lru", capacity), capacity, UNIT,
                   lookahead=Lookahead(seconds=window))
    assert got.hits == reference_lru(reqs, times, capacity, window)


# -- evenly spaced arrivals: a window of N gaps is a count of N ------------------------------------
@settings(max_examples=40, deadline=None)
@given(prefix_requests(), st.integers(1, 10), st.integers(1, 5),
       st.sampled_from(["lru", "prefix", "reuse", "adaptive", "s3fifo"]))
def test_even_arrivals_make_a_window_a_count(reqs: list[tuple[int, ...]], capacity: int,
                                             n: int, spec: str) -> None:
    trace = timed_trace(reqs, [2.0 * i for i in range(len(reqs))])
    window = Lookahead(seconds=2.0 * n)
    assert trace.queue_ends(window) == trace.queue_ends(Lookahead(requests=n))
    a = simulate(trace, make_policy(spec, capacity), capacity, UNIT, lookahead=n)
    b = simulate(trace, make_policy(spec, capacity), capacity, UNIT, lookahead=window)
    assert (a.hits, a.prefix_hit_tokens, a.evictions) == (b.hits, b.prefix_hit_tokens,
                                                          b.evictions)
    caps = [max(1, capacity // 2), capacity]

    def tiers() -> list[Tier]:
        return [Tier(f"t{j}", make_policy(spec, c), c) for j, c in enumerate(caps)]

    ta = simulate_tiers(trace, tiers(), UNIT, lookahead=n, prefetch_budget=1)
    tb = simulate_tiers(trace, tiers(), UNIT, lookahead=window, prefetch_budget=1)
    assert [t.row() for t in ta.tiers] == [t.row() for t in tb.tiers]
    assert (ta.hits, ta.prefix_hit_tokens) == (tb.hits, tb.prefix_hit_tokens)
    assert (tb.lookahead, tb.lookahead_s) == (0, 2.0 * n)


def test_even_arrivals_make_a_window_a_count_on_a_store(tmp_path: Path) -> None:
    reqs = [(0, 1), (2,), (0, 1, 3), (4,), (5,), (0, 1, 3, 6), (2, 7), (0, 1)]
    trace = timed_trace(reqs, [float(i) for i in range(len(reqs))])
    cost = CostModel()
    cap = 3 * cost.block_bytes
    a = replay_on_store(trace, tmp_path / "a", "lru", cap, cost, lookahead=2)
    b = replay_on_store(trace, tmp_path / "b", "lru", cap, cost, lookahead="2s")
    blind = replay_on_store(trace, tmp_path / "c", "lru", cap, cost)
    assert (a.hits, a.prefix_hit_tokens) == (b.hits, b.prefix_hit_tokens)
    assert b.prefix_hit_tokens > blind.prefix_hit_tokens      # the queue kept something


def test_run_replay_labels_a_window() -> None:
    trace = timed_trace([(0,), (1,), (0,)], [0, 1, 2])
    res = run_replay(trace, ["lru"], [parse_capacity("0.5")], UNIT, lookaheads=["5s", 1],
                     references=False)
    assert [r.policy for r in res] == ["lru +queue 5s", "lru +queue 1"]
    with pytest.raises(ConfigError):
        run_replay(trace, ["lru"], [parse_capacity("0.5")], UNIT, lookaheads=["5 parsecs"])


# -- the command line ------------------------------------------------------------------------------
def test_cli_time_window(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.jsonl"
    rows = [{"timestamp": 1000 * i // 2, "input_length": 1000, "output_length": 1,
             "hash_ids": [0, 1 + i % 3]} for i in range(30)]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out_json = tmp_path / "r.json"
    assert main(["replay", str(trace), "--policy", "lru", "--capacity", "0.5",
                 "--lookahead", "2s", "--lookahead", "0", "--quiet",
                 "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    # arrivals every 0.5 s: a 2 s window holds 4 requests, fewer near the end
    assert "queue 2s: 4 requests on average (median 4, p90 4, max 4)" in out
    assert "lru +queue 2s" in out
    doc = json.loads(out_json.read_text())
    win = next(r for r in doc["results"] if r["policy"] == "lru +queue 2s")
    assert (win["lookahead"], win["lookahead_s"]) == (0, 2.0)
    assert main(["replay", str(trace), "--policy", "lru", "--lookahead", "1.5",
                 "--quiet"]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--lookahead" in err and "75s" in err
