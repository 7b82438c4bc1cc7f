"""Multi-tier replay (``rkv.eval.replay.tiers``): one tier is exactly ``simulate``; demotion,
promotion and prefetch on hand-built traces with known answers; conservation of blocks and
bytes; protection of the running and queued requests; layouts and the command line."""

from __future__ import annotations

import json
from collections.abc import Container, Hashable, Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rkvtest import prefix_requests

from policies import (
    AdmitAfter,
    EvictionPolicy,
    Item,
    PolicyError,
    Reason,
    available,
    make_policy,
)
from rkv.cli import main
from rkv.errors import ConfigError
from rkv.eval.replay.layout import parse_budget, parse_layout
from rkv.eval.replay.report import format_table
from rkv.eval.replay.simulate import CostModel, Result, Trace, parse_capacity, prepare, simulate
from rkv.eval.replay.tiers import Tier, replay_all, run_layouts, simulate_tiers
from rkv.format.traces import Request, read_trace

SHARED_TRACE = Path(__file__).parents[2] / "shared/data/traces/mooncake_synthetic_trace.jsonl"
UNIT = CostModel(block_bytes=1, bandwidth=1.0, latency=0.5, recompute_tps=512)


def chain_trace(reqs: Sequence[Sequence[Hashable]], cost: CostModel = UNIT) -> Trace:
    return prepare([Request(float(i), 512 * len(b) - 100, tuple(b), 512)
                    for i, b in enumerate(reqs)], cost)


def one_tier(trace: Trace, spec: str, capacity: int, cost: CostModel, lookahead: int
             ) -> tuple[Result, Result]:
    evict, _, admit = spec.partition("+")
    adm = (lambda: AdmitAfter(n=2)) if admit else (lambda: None)
    a = simulate(trace, make_policy(evict, capacity), capacity, cost, admission=adm(),
                 lookahead=lookahead)
    b = simulate_tiers(trace, [Tier("t", make_policy(evict, capacity), capacity,
                                    cost.bandwidth, cost.latency)],
                       cost, admission=adm(), lookahead=lookahead)
    return a, b


def same(a: Result, b: Result) -> None:
    fields = ("requests", "references", "hits", "tokens", "prefix_hit_tokens", "evictions",
              "ttft_mean", "ttft_p50", "ttft_p90", "ttft_p99", "capacity_bytes")
    assert [getattr(a, f) for f in fields] == [getattr(b, f) for f in fields]
    assert b.tiers[0].hits == b.hits


# -- one tier is simulate() ------------------------------------------------------------------------
@settings(max_examples=60)
@given(prefix_requests(), st.integers(1, 12), st.sampled_from([0, 1, 3]),
       st.booleans())
def test_one_tier_equals_simulate(reqs: list[tuple[int, ...]], capacity: int, lookahead: int,
                                  admit: bool) -> None:
    trace = chain_trace(reqs)
    for name in available():
        a, b = one_tier(trace, name + ("+after" if admit else ""), capacity, UNIT, lookahead)
        same(a, b)


@pytest.mark.skipif(not SHARED_TRACE.is_file(), reason="shared trace not present")
def test_one_tier_equals_simulate_on_the_real_trace() -> None:
    cost = CostModel()
    trace = prepare(read_trace(SHARED_TRACE, limit=300), cost)
    for cap in ("0.02", "0.1"):
        nbytes = parse_capacity(cap).resolve(trace, cost)
        for name in [*available(), "lru+after"]:
            for ahead in (0, 8):
                a, b = one_tier(trace, name, nbytes, cost, ahead)
                same(a, b)
                assert a.hits > 0


# -- semantics on hand-built traces ------------------------------------------------------------
def two_tiers(top: int, low: int, spec: str = "lru") -> list[Tier]:
    """A top tier that loads a block in 1 s and a lower one that takes 10 s (block_bytes 1)."""
    return [Tier("fast", make_policy(spec, top), top, 1.0, 0.0),
            Tier("slow", make_policy(spec, low), low, 0.1, 0.0)]


def requests(*blocks: str) -> Trace:
    return prepare([Request(float(i), 512 * len(b), tuple(b), 512)
                    for i, b in enumerate(blocks)], UNIT)


def test_lower_tier_hit_is_counted_there_and_promoted() -> None:
    trace = requests("a", "b", "a", "a")
    tiers = two_tiers(1, 4)
    r = simulate_tiers(trace, tiers, UNIT)
    fast, slow = r.tiers
    # a; b demotes a; a hits in slow (10 s), is promoted and demotes b; a hits in fast (1 s)
    assert (fast.hits, slow.hits, r.hits) == (1, 1, 2)
    assert (fast.promoted_in, slow.promoted_out) == (1, 1)
    assert (fast.demoted_out, slow.demoted_in) == (2, 2)
    assert list(tiers[0].policy.keys()) == ["a"] and list(tiers[1].policy.keys()) == ["b"]
    assert r.evictions == 0
    recompute = 1.0                           # 512 tokens at 512 tokens/s
    assert r.ttft_mean == pytest.approx((recompute + recompute + 10.0 + 1.0) / 4)

    tiers = two_tiers(1, 4)
    never = simulate_tiers(trace, tiers, UNIT, promote="never")
    assert (never.tiers[0].hits, never.tiers[1].hits) == (0, 2)
    assert never.tiers[0].promoted_in == 0
    assert list(tiers[0].policy.keys()) == ["b"] and list(tiers[1].policy.keys()) == ["a"]


def test_demotion_cascades_and_the_last_tier_evicts() -> None:
    trace = requests("a", "b", "c", "d")
    tiers = [Tier(n, make_policy("lru", 1), 1) for n in ("x", "y", "z")]
    r = simulate_tiers(trace, tiers, UNIT)
    assert [list(t.policy.keys()) for t in tiers] == [["d"], ["c"], ["b"]]
    assert r.evictions == 1 and r.tiers[2].evicted == 1
    assert [t.demoted_out for t in r.tiers] == [3, 2, 0]
    assert [t.written for t in r.tiers] == [4, 0, 0]


def test_prefetch_moves_queued_blocks_up_ahead_of_use() -> None:
    # fast holds 2, slow 10. After a, b, c: a sits in slow. Before d runs, the queue (a) is
    # known: prefetch lifts a into fast (pushing b down), and d pushes c, not a, down.
    trace = requests("a", "b", "c", "d", "a")
    blind = simulate_tiers(trace, two_tiers(2, 10), UNIT)
    queue = simulate_tiers(trace, two_tiers(2, 10), UNIT, lookahead=1, prefetch_budget=0)
    tiers = two_tiers(2, 10)
    ahead = simulate_tiers(trace, tiers, UNIT, lookahead=1)
    assert (blind.tiers[0].hits, blind.tiers[1].hits) == (0, 1)
    assert (queue.tiers[0].hits, queue.tiers[1].hits) == (0, 1)     # protection alone
    assert (ahead.tiers[0].hits, ahead.tiers[1].hits) == (1, 0)
    assert ahead.tiers[0].prefetched_in == ahead.tiers[1].prefetched_out == 1
    assert ahead.prefetch_budget == 1       # a quarter of the top tier, at least one block
    assert sorted(tiers[0].policy.keys()) == ["a", "d"]
    # the prefetched block loads at the fast tier's cost: 1 s instead of 10 s
    assert blind.ttft_mean - ahead.ttft_mean == pytest.approx(9.0 / 5)


def test_prefetch_budget_and_queue_order() -> None:
    # p, q, s end up in slow; when the request "pqs" joins the queue, a budget of two blocks
    # lifts p and q (queue order) but not s, which is then a slow hit, promoted on use
    trace = requests("p", "q", "s", "d", "e", "f", "x", "pqs")
    r = simulate_tiers(trace, two_tiers(3, 10), UNIT, lookahead=1, prefetch_budget=2)
    assert (r.tiers[0].hits, r.tiers[1].hits) == (2, 1)
    assert (r.tiers[0].prefetched_in, r.tiers[0].promoted_in) == (2, 1)
    assert r.lookahead == 1 and r.prefetch_budget == 2 and r.promote == "hit"
    with pytest.raises(ConfigError):
        simulate_tiers(trace, two_tiers(3, 10), UNIT, lookahead=3, prefetch_budget=-1)
    with pytest.raises(ConfigError):
        simulate_tiers(trace, two_tiers(3, 10), UNIT, promote="sometimes")
    with pytest.raises(ConfigError):
        simulate_tiers(trace, [], UNIT)
    with pytest.raises(ConfigError):
        Tier("bad", make_policy("lru", 1), 1, bandwidth=0.0)


def test_admission_guards_the_top_tier_only() -> None:
    # b is refused by the full top tier at its first sighting and stored in slow; its second
    # use hits there and promotes it
    trace = requests("a", "b", "b")
    r = simulate_tiers(trace, two_tiers(1, 4), UNIT, admission=AdmitAfter(n=2))
    assert (r.tiers[0].written, r.tiers[1].written) == (1, 1)
    assert (r.tiers[0].hits, r.tiers[1].hits, r.tiers[0].promoted_in) == (0, 1, 1)


def test_new_block_goes_below_when_the_top_tier_is_all_protected() -> None:
    # fast holds 1 block; the running request's first block pins it, so its second block is
    # written to slow instead of not being cached at all
    trace = requests("ab", "ab")
    r = simulate_tiers(trace, two_tiers(1, 4), UNIT)
    assert (r.tiers[0].written, r.tiers[1].written) == (1, 1)
    assert (r.tiers[0].hits, r.tiers[1].hits) == (1, 1)


# -- invariants on random traces -----------------------------------------------------------------
class Spy(EvictionPolicy):
    """Delegates to a registered policy and logs every event into a shared list."""

    def __init__(self, capacity: int, spec: str, tier: int, log: list[tuple[object, ...]]
                 ) -> None:
        super().__init__(capacity)
        self.inner = make_policy(spec, capacity)
        self.tier, self.log = tier, log

    def _insert(self, item: Item, now: float) -> None:
        self.log.append(("insert", self.tier, item.key, now))
        self.inner.on_insert(item, now)

    def _access(self, key: Hashable, hit: bool, now: float, item: Item | None) -> None:
        self.log.append(("access", self.tier, key, now))
        self.inner.on_access(key, hit, now, item)

    def _remove(self, item: Item, reason: Reason) -> None:
        self.log.append(("remove", self.tier, item.key, reason))
        self.inner.on_remove(item.key, reason)

    def victims(self, need: int, protected: Container[Hashable] = ()) -> list[Hashable] | None:
        return self.inner.victims(need, protected)


@settings(max_examples=60)
@given(prefix_requests(), st.lists(st.integers(1, 6), min_size=2, max_size=3),
       st.sampled_from(sorted(available())), st.sampled_from([0, 1, 4]),
       st.sampled_from(["hit", "never"]), st.sampled_from([None, 0, 1, 3]), st.booleans())
def test_conservation_and_protection(reqs: list[tuple[int, ...]], caps: list[int], spec: str,
                                     lookahead: int, promote: str, budget: int | None,
                                     admit: bool) -> None:
    trace = chain_trace(reqs)
    log: list[tuple[object, ...]] = []
    tiers = [Tier(f"t{j}", Spy(c, spec, j, log), c) for j, c in enumerate(caps)]
    r = simulate_tiers(trace, tiers, UNIT, lookahead=lookahead, promote=promote,
                       prefetch_budget=budget, admission=AdmitAfter(n=2) if admit else None)
    # every stored block is in exactly one tier, within its capacity
    keys = [set(t.policy.keys()) for t in tiers]
    assert sum(len(k) for k in keys) == len(set().union(*keys))
    for t, s in zip(tiers, r.tiers, strict=True):
        assert t.policy.used == s.used_at_end <= t.capacity
        assert s.written + s.moved_in - s.moved_out - s.evicted == s.used_at_end
    # what leaves a tier downward arrives in the next; what goes up arrives at the top
    for up, down in zip(r.tiers, r.tiers[1:], strict=False):
        assert up.demoted_out == down.demoted_in
    assert r.tiers[-1].demoted_out == 0
    assert r.tiers[0].promoted_in == sum(s.promoted_out for s in r.tiers)
    assert r.tiers[0].prefetched_in == sum(s.prefetched_out for s in r.tiers)
    if promote == "never":
        assert r.tiers[0].promoted_in == 0
    if not lookahead or budget == 0:
        assert r.tiers[0].prefetched_in == 0
    assert sum(s.written for s in r.tiers) == sum(s.evicted + s.used_at_end for s in r.tiers)
    assert r.evictions == sum(s.evicted for s in r.tiers)
    assert r.hits == sum(s.hits for s in r.tiers)
    # a block leaves a tier downward or out only if neither the running request (the blocks
    # it has touched) nor a queued one needs it
    refs, starts = trace.refs, trace.starts
    request_of = [q for q in range(trace.requests) for _ in range(starts[q], starts[q + 1])]
    last_access = -1
    for n, ev in enumerate(log):
        if ev[0] == "access":
            last_access = int(str(ev[3]))
        elif ev[0] == "remove" and ev[3] in (Reason.DEMOTED, Reason.EVICTED):
            now = next(int(str(e[3])) for e in log[n:] if e[0] == "insert")
            q = request_of[now]
            if last_access == now:          # while reference ``now`` is being served
                pinned = set(refs[starts[q]:now + 1])
                first_queued = q + 1
            else:                           # prefetch before request q starts
                pinned = set()
                first_queued = q
            end = starts[min(q + lookahead + 1, trace.requests)] if lookahead else 0
            pinned |= set(refs[starts[first_queued]:end]) if lookahead else set()
            assert ev[2] not in pinned, (ev, now)


class Liar(EvictionPolicy):
    """Returns whatever ``answer`` says, to check that the driver catches it."""

    def __init__(self, capacity: int, answer: str) -> None:
        super().__init__(capacity)
        self.answer = answer

    def _insert(self, item: Item, now: float) -> None: ...

    def _access(self, key: Hashable, hit: bool, now: float, item: Item | None) -> None: ...

    def _remove(self, item: Item, reason: Reason) -> None: ...

    def victims(self, need: int, protected: Container[Hashable] = ()) -> list[Hashable] | None:
        keys = list(self._items)
        if self.answer == "protected":
            return [k for k in keys if k in protected][:1] or keys[:1]
        if self.answer == "unknown":
            return ["nowhere"]
        return []


@pytest.mark.parametrize("answer,match", [("protected", "protected"),
                                          ("unknown", "not in tier"),
                                          ("short", "free less")])
def test_driver_rejects_bad_victims(answer: str, match: str) -> None:
    trace = requests("ab", "c", "d")
    tiers = [Tier("x", Liar(1, answer), 1), Tier("y", make_policy("lru", 1), 1)]
    with pytest.raises(PolicyError, match=match):
        simulate_tiers(trace, tiers, UNIT)


# -- layouts, runs and the command line ------------------------------------------------------------
def test_parse_layout_defaults_and_custom_figures() -> None:
    lay = parse_layout("dram=2%, cxl=0.05,nvme=2GiB")
    assert [t.name for t in lay.tiers] == ["dram", "cxl", "nvme"]
    assert [(t.bandwidth, t.latency) for t in lay.tiers] == [
        (20e9, pytest.approx(0.1e-6)), (12e9, pytest.approx(0.25e-6)),
        (6.5e9, pytest.approx(80e-6))]
    assert lay.tiers[2].capacity.nbytes == 2 << 30
    hbm = parse_layout("hbm=1%@900/0.05,nvme=10%@3/100").tiers
    assert (hbm[0].bandwidth, hbm[1].bandwidth) == (900e9, 3e9)
    assert hbm[1].latency == pytest.approx(100e-6)
    for bad in ("", "dram", "dram=", "foo=1%", "dram=1%,dram=2%", "dram=7 parsecs",
                "x=1%@0/1", "x=1%@-1/1", "x=1%@abc/1", "x=1%@1/nan", "x=1%@1", "1x=1%"):
        with pytest.raises(ConfigError):
            parse_layout(bad)
    assert parse_budget("0").nbytes == 0 and parse_budget("25%").fraction == 0.25
    with pytest.raises(ConfigError, match="prefetch budget"):
        parse_budget("lots")


def test_run_layouts_labels_and_references() -> None:
    trace = chain_trace([(0, 1, 2), (0, 1, 3), (4,), (0, 1, 2), (4, 5)] * 3)
    lays = [parse_layout("a=0.2@1/0,b=0.4@0.5/0"), parse_layout("a=0.5@1/0")]
    res = run_layouts(trace, ["lru"], lays, UNIT, lookaheads=[0, 2])
    got = [(r.policy, r.capacity) for r in res]
    assert got == [("lru", lays[0].text), ("lru", lays[1].text),
                   ("lru +prefetch 2", lays[0].text), ("lru +queue 2", lays[1].text),
                   ("infinite", lays[0].text), ("belady", lays[1].text),
                   ("infinite", lays[1].text)]
    quiet = run_layouts(trace, ["lru"], lays[:1], UNIT, lookaheads=[2], references=False,
                        prefetch_budget=parse_budget("0"))
    assert [r.policy for r in quiet] == ["lru +queue 2"]
    with pytest.raises(ConfigError):
        run_layouts(trace, ["nope"], lays, UNIT)
    mixed = replay_all(trace, ["lru"], [parse_capacity("0.5")], lays[:1], UNIT)
    assert [r.policy for r in mixed] == ["lru", "lru", "belady", "infinite", "infinite"]
    text = format_table(mixed)
    assert "block hits % by tier" in text and "GiB moved in / out" in text


MOONCAKE = '{{"timestamp": {t}, "input_length": {n}, "output_length": 1, "hash_ids": {ids}}}'


def small_trace(path: Path) -> Path:
    reqs = [[0, 1, 2], [0, 1, 3], [4], [0, 1, 2, 5], [4, 6], [0, 7], [0, 1, 2]] * 4
    path.write_text("".join(MOONCAKE.format(t=i, n=512 * len(b), ids=b) + "\n"
                            for i, b in enumerate(reqs)))
    return path


def test_cli_tiers_table_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace, out = small_trace(tmp_path / "t.jsonl"), tmp_path / "r.json"
    rc = main(["replay", str(trace), "--policy", "lru", "--tiers", "dram=0.25,nvme=0.5",
               "--tiers", "dram=0.5", "--lookahead", "0", "--lookahead", "2",
               "--prefetch-budget", "0.5", "--block-bytes", "1000", "--json", str(out),
               "--quiet"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "tiers dram=0.25,nvme=0.5: dram 2 blocks" in text
    assert "block hits % by tier, dram=0.25,nvme=0.5" in text and "lru +prefetch 2" in text
    doc = json.loads(out.read_text())
    assert doc["layouts"] == ["dram=0.25,nvme=0.5", "dram=0.5"] and doc["promote"] == "hit"
    rows = {(r["policy"], r["capacity"]): r for r in doc["results"]}
    two = rows["lru +prefetch 2", "dram=0.25,nvme=0.5"]
    assert [t["name"] for t in two["tiers"]] == ["dram", "nvme"]
    assert sum(t["hits"] for t in two["tiers"]) == two["hits"]
    assert two["prefetch_budget"] == 1000 and two["lookahead"] == 2
    assert {"moved_in", "moved_out", "prefix_hits"} <= set(two["tiers"][0])
    assert ("belady", "dram=0.5") in rows and ("belady", "dram=0.25,nvme=0.5") not in rows
    rc = main(["replay", str(trace), "--policy", "lru", "--tiers", "dram=0.25,nvme=0.5",
               "--promote", "never", "--quiet"])
    assert rc == 0 and "promote on never" in capsys.readouterr().out


@pytest.mark.parametrize("args,msg", [
    (["--tiers", "dram=1%,foo=2%"], "not a default tier"),
    (["--tiers", "dram"], "bad tier"),
    (["--tiers", "dram=1%,dram=2%"], "twice"),
    (["--tiers", "x=1%@0/1"], "bandwidth"),
    (["--tiers", "dram=9 parsecs"], "bad capacity"),
    (["--tiers", "dram=1%", "--promote", "sometimes"], "--promote"),
    (["--promote", "never"], "apply to --tiers"),
    (["--prefetch-budget", "0"], "apply to --tiers"),
    (["--tiers", "dram=1%", "--prefetch-budget", "lots"], "prefetch budget"),
    (["--tiers", "dram=1%", "--lookahead", "-2"], "--lookahead"),
    (["--tiers", "dram=1%", "--policy", "nope"], "unknown policy"),
])
def test_cli_tier_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                      args: list[str], msg: str) -> None:
    trace = small_trace(tmp_path / "t.jsonl")
    assert main(["replay", str(trace), "--quiet", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("rkv: error:") and msg in err, err
