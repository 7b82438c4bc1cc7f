"""Trace replay: Belady's optimality (against every registered policy and a brute-force optimum),
the next-use precomputation, the infinite-cache ceiling, prefix-token and TTFT accounting on a
hand-made trace, hostile trace files, and the ``rkv replay`` command on the shared trace."""

from __future__ import annotations

import functools
import json
import math
import random
from collections.abc import Container, Hashable, Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rkvtest import prefix_requests

from policies import EvictionPolicy, Item, PolicyError, Reason, available, make_policy
from policies.belady import Belady, InfiniteCache, next_use_positions
from rkv.cli import main
from rkv.errors import ConfigError, InputError
from rkv.eval.replay.simulate import (
    CostModel,
    Trace,
    parse_capacity,
    prepare,
    run_replay,
    simulate,
)
from rkv.format.traces import MAX_LINE_BYTES, Request, read_trace

SHARED_TRACE = Path(__file__).parents[2] / "shared/data/traces/mooncake_synthetic_trace.jsonl"
UNIT = CostModel(block_bytes=1)


def unit_trace(seq: Sequence[Hashable]) -> Trace:
    """Each reference its own one-block request: nothing is ever protected."""
    return prepare([Request(float(i), 1, (k,), 1) for i, k in enumerate(seq)], UNIT)


def hits(trace: Trace, policy: EvictionPolicy, capacity: int) -> int:
    return simulate(trace, policy, capacity, UNIT).hits


@functools.cache
def optimum(seq: tuple[int, ...], capacity: int, i: int = 0,
            cache: frozenset[int] = frozenset()) -> int:
    """Most hits any policy that caches every miss can get: every eviction choice tried."""
    if i == len(seq):
        return 0
    key = seq[i]
    if key in cache:
        return 1 + optimum(seq, capacity, i + 1, cache)
    if len(cache) < capacity:
        return optimum(seq, capacity, i + 1, cache | {key})
    return max(optimum(seq, capacity, i + 1, (cache - {v}) | {key}) for v in cache)


# -- Belady ----------------------------------------------------------------------------------------
@settings(max_examples=150)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=10), st.integers(1, 3))
def test_belady_equals_brute_force_optimum(seq: list[int], capacity: int) -> None:
    trace = unit_trace(seq)
    got = hits(trace, Belady(capacity, trace.next_use), capacity)
    assert got == optimum(tuple(seq), capacity)


@settings(max_examples=200)
@given(st.lists(st.integers(0, 11), min_size=1, max_size=80), st.integers(1, 8))
def test_belady_is_never_beaten(seq: list[int], capacity: int) -> None:
    trace = unit_trace(seq)
    best = hits(trace, Belady(capacity, trace.next_use), capacity)
    ceiling = hits(trace, InfiniteCache(len(seq)), len(seq))
    assert best <= ceiling
    for name in available():
        pol = make_policy(name, capacity)
        if type(pol).admits is EvictionPolicy.admits:   # bypassing ones: test_admission_queue
            assert hits(trace, pol, capacity) <= best, name


def test_belady_beats_lru_and_fifo_strictly_somewhere() -> None:
    # a loop one larger than the cache: LRU and FIFO never hit, MIN misses one in three
    seq = [0, 1, 2, 3] * 10
    trace = unit_trace(seq)
    assert hits(trace, make_policy("lru", 3), 3) == 0
    assert hits(trace, make_policy("fifo", 3), 3) == 0
    assert hits(trace, Belady(3, trace.next_use), 3) == optimum(tuple(seq), 3) == 24


@settings(max_examples=40)
@given(st.lists(st.integers(0, 9), min_size=1, max_size=60), st.integers(1, 5))
def test_belady_with_a_function_matches_the_array(seq: list[int], capacity: int) -> None:
    trace = unit_trace(seq)
    nu = trace.next_use
    fn = Belady(capacity, lambda key, now: math.inf if nu[now] >= len(nu) else nu[now])
    assert hits(trace, fn, capacity) == hits(trace, Belady(capacity, nu), capacity)


@settings(max_examples=60)
@given(st.lists(st.tuples(st.integers(0, 9), st.integers(1, 4)), min_size=1, max_size=60),
       st.integers(1, 10), st.randoms(use_true_random=False))
def test_belady_victims_contract(refs: list[tuple[int, int]], capacity: int,
                                 rnd: random.Random) -> None:
    """Variable sizes, random protection: victims are all-or-nothing, never protected, and
    asking twice (or not acting) changes nothing."""
    keys = [k for k, _ in refs]
    size = {k: s for k, s in refs}
    nu = next_use_positions(keys)
    pol = Belady(capacity, nu)
    for i, k in enumerate(keys):
        for _ in range(2):
            need = rnd.randint(-1, capacity + 2)
            cached = list(pol.keys())
            prot = {x for x in cached if rnd.random() < 0.3}
            first = pol.victims(need, prot)
            assert pol.victims(need, prot) == first
            if first is None:
                assert sum(pol.item(x).size for x in cached if x not in prot) < need
            else:
                assert not set(first) & prot and len(set(first)) == len(first)
                assert need <= 0 or sum(pol.item(x).size for x in first) >= need
                if need > 0:   # the farthest next use goes first
                    nexts = [pol.next_use(x) for x in first]
                    rest = [pol.next_use(x) for x in cached if x not in prot
                            and x not in first]
                    assert not rest or min(nexts) >= max(rest)
        if k in pol:
            pol.on_access(k, True, i)
            continue
        pol.on_access(k, False, i, Item(k, size[k]))
        out = pol.victims(pol.used + size[k] - capacity, {k})
        if out is None:
            continue
        for v in out:
            pol.on_remove(v, Reason.EVICTED)
        pol.on_insert(Item(k, size[k]), i)
        assert pol.used <= capacity or size[k] > capacity


def test_belady_rejects_a_wrong_position() -> None:
    nu = next_use_positions(["a", "b", "a", "b"])
    pol = Belady(2, nu)
    pol.on_insert(Item("a"), 0)
    with pytest.raises(PolicyError):
        pol.on_insert(Item("b"), 0)    # position 0 is a reference to "a"
    with pytest.raises(PolicyError):
        pol.on_insert(Item("c"), 7)
    with pytest.raises(PolicyError):
        pol.on_access("zz", True, 1)


@given(st.lists(st.integers(0, 6), max_size=80))
def test_next_use_positions_against_naive(seq: list[int]) -> None:
    n = len(seq)
    naive = [next((j for j in range(i + 1, n) if seq[j] == seq[i]), n) for i in range(n)]
    assert next_use_positions(seq) == naive
    assert next_use_positions(iter(seq)) == naive


@given(st.lists(st.integers(0, 20), min_size=1, max_size=100))
def test_infinite_cache_hits_exactly_the_repeats(seq: list[int]) -> None:
    trace = unit_trace(seq)
    assert hits(trace, InfiniteCache(len(seq)), len(seq)) == len(seq) - len(set(seq))


@settings(max_examples=100)
@given(prefix_requests(max_requests=25), st.integers(1, 12))
def test_every_policy_keeps_the_contract_on_prefix_requests(reqs: list[tuple[int, ...]],
                                                            capacity: int) -> None:
    """Multi-block requests protect their touched blocks; the driver checks every answer, and
    no policy beats the infinite cache."""
    trace = prepare([Request(0.0, 512 * len(b), b, 512) for b in reqs], UNIT)
    top = simulate(trace, InfiniteCache(trace.unique), trace.unique, UNIT)
    for name in [*available(), "belady"]:
        pol = (Belady(capacity, trace.next_use) if name == "belady"
               else make_policy(name, capacity))
        r = simulate(trace, pol, capacity, UNIT)
        assert r.hits <= top.hits and r.prefix_hit_tokens <= top.prefix_hit_tokens, name


# -- accounting ------------------------------------------------------------------------------------
class Preference(EvictionPolicy):
    """Evicts cached keys in a fixed order of preference (for hand-made golden numbers)."""

    def __init__(self, capacity: int, order: Sequence[Hashable]) -> None:
        super().__init__(capacity)
        self.order = list(order)

    def _insert(self, item: Item, now: float) -> None: ...

    def _access(self, key: Hashable, hit: bool, now: float, item: Item | None) -> None: ...

    def _remove(self, item: Item, reason: Reason) -> None: ...

    def victims(self, need: int, protected: Container[Hashable] = ()) -> list[Hashable] | None:
        return self.take(iter([k for k in self.order if k in self._items]), self._items, need,
                         protected)


def test_prefix_token_accounting_golden() -> None:
    # 0.1 s to load a block, 1 s to recompute 512 tokens; capacity 4 blocks.
    cost = CostModel(block_bytes=1, bandwidth=10, latency=0, recompute_tps=512)
    reqs = [Request(0.0, 1536, (1, 2, 3)),   # 3 misses                       TTFT 3.0
            Request(1.0, 1024, (4, 5)),      # 2 misses, evicts 1             TTFT 2.0
            Request(2.0, 1300, (1, 2, 3)),   # 1 misses (evicts 5), 2 and 3 hit: no prefix
            Request(3.0, 1100, (1, 2, 6))]   # 1, 2 hit (prefix 1024 tokens), 6 evicts 4
    trace = prepare(reqs, cost)
    assert trace.items[0] == Item(1, size=1, group=1, depth=0, parent=None, miss_cost=1.0)
    assert trace.items[4] == Item(5, size=1, group=4, depth=1, parent=4, miss_cost=1.0)
    assert trace.items[5] is trace.items[0]
    r = simulate(trace, Preference(4, [1, 5, 4, 2, 3, 6]), 4, cost, label="pref")
    assert (r.requests, r.references, r.hits, r.evictions) == (4, 11, 4, 3)
    assert (r.tokens, r.prefix_hit_tokens) == (4960, 1024)
    assert r.hit_ratio == pytest.approx(4 / 11)
    assert r.prefix_token_hit_ratio == pytest.approx(1024 / 4960)
    ttft = sorted([3.0, 2.0, 1300 / 512, 0.2 + 76 / 512])
    assert r.ttft_mean == pytest.approx(sum(ttft) / 4)
    assert r.ttft_p50 == pytest.approx((ttft[1] + ttft[2]) / 2)
    assert r.capacity_blocks == 4 and r.capacity_fraction == pytest.approx(4 / 6)


def test_partial_blocks_puts_and_uncached_tail() -> None:
    cost = CostModel(block_bytes=1, bandwidth=1e30, latency=0, recompute_tps=100)
    reqs = [Request(0.0, 300, ("a", "b"), 256, "put"),   # a write: replayed, not counted
            Request(1.0, 700, ("a", "b"), 256)]          # both hit; 188 tokens past the blocks
    r = simulate(prepare(reqs, cost), InfiniteCache(10), 10, cost)
    assert (r.requests, r.references, r.hits, r.tokens, r.prefix_hit_tokens) == \
        (1, 2, 2, 700, 512)
    assert r.ttft_mean == pytest.approx(188 / 100)


def test_run_replay_rows_and_capacities() -> None:
    seq = [0, 1, 2, 0, 1, 3, 0, 4, 1, 2] * 3
    trace = unit_trace(seq)
    caps = [parse_capacity("0.4"), parse_capacity("60%"), parse_capacity("3B")]
    assert [c.resolve(trace, UNIT) for c in caps] == [2, 3, 3]
    res = run_replay(trace, ["lru", "fifo"], caps, UNIT)
    assert [(r.policy, r.capacity) for r in res] == [
        (p, c) for p in ("lru", "fifo", "belady", "infinite") for c in ("0.4", "60%", "3B")]
    by = {(r.policy, r.capacity): r for r in res}
    for c in ("0.4", "60%"):
        assert by["lru", c].hits <= by["belady", c].hits <= by["infinite", c].hits
    assert by["infinite", "0.4"].hits == len(seq) - 5
    with pytest.raises(ConfigError):
        run_replay(trace, ["no-such-policy"], caps, UNIT)
    for bad in ("0", "150%", "-3", "abc", "5 parsecs", "0.1B"):
        with pytest.raises(ConfigError):
            parse_capacity(bad)


# -- trace files -----------------------------------------------------------------------------------
GOOD = '{"timestamp": 5, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]}'
BAD_MOONCAKE = [
    "not json", "[1, 2]", '"text"', "{}",
    '{"timestamp": 0, "input_length": 5, "hash_ids": "1,2"}',
    '{"timestamp": 0, "input_length": "5", "hash_ids": [1]}',
    '{"timestamp": 0, "input_length": true, "hash_ids": [1]}',
    '{"timestamp": 0, "input_length": -5, "hash_ids": [1]}',
    '{"timestamp": -1, "input_length": 5, "hash_ids": [1]}',
    '{"timestamp": NaN, "input_length": 5, "hash_ids": [1]}',
    '{"timestamp": Infinity, "input_length": 5, "hash_ids": [1]}',
    '{"timestamp": 1' + "0" * 400 + ', "input_length": 5, "hash_ids": [1]}',
    '{"timestamp": 0, "input_length": 5, "hash_ids": [1, -2]}',
    '{"timestamp": 0, "input_length": 5, "hash_ids": [1, 2.5]}',
    '{"timestamp": 0, "input_length": 5, "hash_ids": [[1]]}',
    '{"timestamp": 0, "input_length": 5, "output_length": -1, "hash_ids": [1]}',
    '{"timestamp": 0, "input_length": 5}',
    '{"timestamp": 0, "input_length": 1' + "0" * 300 + ', "hash_ids": [1]}',
    '{"timestamp": 0, "input_length": 1' + "0" * 5000 + ', "hash_ids": [1]}',
    "[" * 100_000,
]
GOOD_LOG = '{"t": 1.5, "op": "get", "model": "ab12", "chunks": ["00ff", "A1"], "tokens": 300}'
BAD_LOG = [
    '{"t": 1, "op": "delete", "model": "ab", "chunks": [], "tokens": 0}',
    '{"t": 1, "op": "get", "model": "xyz", "chunks": [], "tokens": 0}',
    '{"t": 1, "op": "get", "chunks": [], "tokens": 0}',
    '{"t": 1, "op": "get", "model": "ab", "chunks": ["ab", 7], "tokens": 0}',
    '{"t": 1, "op": "get", "model": "ab", "chunks": "ab", "tokens": 0}',
    '{"t": 1, "op": "get", "model": "ab", "chunks": ["ab"], "tokens": -3}',
    '{"t": 1, "op": "get", "model": "ab", "chunks": ["ab"], "tokens": 3, "chunk_tokens": 0}',
    '{"t": 1, "op": "get", "model": "ab", "chunks": ["ab"], "tokens": 3, "chunk_tokens": 1e9}',
    '{"t": 1, "op": "get", "model": "ab", "chunks": ["ab"], "tokens": 3,'
    ' "chunk_tokens": 2000000}',
    '{"t": "1", "op": "get", "model": "ab", "chunks": ["ab"], "tokens": 3}',
]


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_readers_parse_good_lines(tmp_path: Path) -> None:
    p = _write(tmp_path / "m.jsonl", [GOOD, "", GOOD.replace("600", "1024")])
    got = list(read_trace(p))
    assert got[0] == Request(0.005, 600, (1, 2), 512, "get")
    assert got[0].block_token_counts() == [512, 88]
    assert len(got) == 2 and len(list(read_trace(p, limit=1))) == 1
    assert list(read_trace(p, limit=0)) == []
    log = _write(tmp_path / "a.jsonl", [GOOD_LOG, GOOD_LOG.replace('"get"', '"put"')
                                        .replace('"tokens"', '"chunk_tokens": 512, "tokens"')])
    a, b = read_trace(log, "accesslog")
    assert a == Request(1.5, 300, ("00ff", "a1"), 256, "get")
    assert (b.op, b.block_tokens) == ("put", 512)


@pytest.mark.parametrize("fmt,line", [("mooncake", x) for x in BAD_MOONCAKE]
                         + [("accesslog", x) for x in BAD_LOG])
def test_readers_reject_hostile_lines_with_file_and_line(tmp_path: Path, fmt: str,
                                                         line: str) -> None:
    good = GOOD if fmt == "mooncake" else GOOD_LOG
    p = _write(tmp_path / "t.jsonl", [good, "", line, good])
    with pytest.raises(InputError, match=r"t\.jsonl:3: "):
        list(read_trace(p, fmt))


def test_readers_reject_bad_files(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"missing\.jsonl"):
        list(read_trace(tmp_path / "missing.jsonl"))
    with pytest.raises(InputError, match="cannot open"):
        list(read_trace(tmp_path))
    p = tmp_path / "bin.jsonl"
    p.write_bytes(GOOD.encode() + b"\n\xff\xfe{}\n")
    with pytest.raises(InputError, match=r"bin\.jsonl:2: not UTF-8"):
        list(read_trace(p))
    big = tmp_path / "big.jsonl"
    with big.open("wb") as f:
        f.write(GOOD.encode() + b"\n" + b" " * (MAX_LINE_BYTES + 10) + b"{}\n")
    with pytest.raises(InputError, match=r"big\.jsonl:2: line longer than 16 MiB"):
        list(read_trace(big))
    with pytest.raises(InputError, match="unknown trace format"):
        read_trace(p, "csv")
    with pytest.raises(InputError, match="limit"):
        read_trace(p, limit=-1)
    with pytest.raises(InputError, match="no block references"):
        prepare(read_trace(_write(tmp_path / "empty.jsonl", [])))


@settings(max_examples=80)
@given(st.lists(st.one_of(st.binary(max_size=60), st.text(max_size=60).map(str.encode),
                          st.sampled_from([GOOD.encode(), GOOD_LOG.encode()])), max_size=6),
       st.sampled_from(["mooncake", "accesslog"]))
def test_readers_fuzz_raise_only_input_error(tmp_path_factory: pytest.TempPathFactory,
                                             lines: list[bytes], fmt: str) -> None:
    p = tmp_path_factory.mktemp("fuzz") / "f.jsonl"
    p.write_bytes(b"\n".join(lines))
    try:
        for req in read_trace(p, fmt):
            assert isinstance(req, Request)
    except InputError as exc:
        assert "f.jsonl:" in str(exc)


# -- the command line ------------------------------------------------------------------------------
needs_trace = pytest.mark.skipif(not SHARED_TRACE.is_file(), reason="shared trace not present")


@needs_trace
def test_cli_replay_writes_table_json_and_plot(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    rc = main(["replay", str(SHARED_TRACE), "--limit", "200", "--capacity", "0.05",
               "--capacity", "0.2", "--json", str(out), "--plot", str(png), "--quiet"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "prefix-token hit %" in text and "belady" in text and "infinite" in text
    doc = json.loads(out.read_text())
    assert doc["requests"] == 200 and doc["unique_blocks"] > 0
    rows = doc["results"]
    names = {r["policy"] for r in rows}
    assert names == {*available(), "belady", "infinite"}
    assert len(rows) == 2 * len(names)
    for cap in ("0.05", "0.2"):
        at = {r["policy"]: r for r in rows if r["capacity"] == cap}
        for name in available():
            assert at[name]["hits"] <= at["infinite"]["hits"]
            assert 0 <= at[name]["prefix_token_hit_ratio"] <= 1
        assert at["belady"]["prefix_token_hit_ratio"] >= at["lru"]["prefix_token_hit_ratio"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@needs_trace
def test_cli_replay_policy_and_format_options(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["replay", str(SHARED_TRACE), "--limit", "50", "--policy", "lru",
               "--capacity", "2GiB", "--block-bytes", "4096", "--recompute-tps", "1000",
               "--quiet"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "lru" in text and "2.0 GiB" in text and "1000 tokens/s" in text


@pytest.mark.parametrize("args,msg", [
    (["--policy", "nope"], "unknown policy"),
    (["--policy", "lru(size=3)"], "bad parameters"),
    (["--capacity", "7 parsecs"], "bad capacity"),
    (["--limit", "0"], "--limit"),
    (["--recompute-tps", "0"], "recompute_tps"),
    (["--format", "accesslog"], "t.jsonl:1:"),
    (["--plot", "out.notanimageformat"], "cannot write the plot"),
])
def test_cli_replay_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                        args: list[str], msg: str) -> None:
    trace = _write(tmp_path / "t.jsonl", [GOOD])
    assert main(["replay", str(trace), "--quiet", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("rkv: error:") and msg in err


def test_cli_replay_missing_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", str(tmp_path / "nope.jsonl")]) == 2
    assert "nope.jsonl" in capsys.readouterr().err


def test_second_sighting_admission_golden() -> None:
    """Capacity 2: with after(n=2) a first-sighted block never pushes a cached one out."""
    from policies import AdmitAfter

    cost = CostModel(block_bytes=1, bandwidth=1e30, latency=0, recompute_tps=512)
    reqs = [Request(float(i), 512, (k,)) for i, k in enumerate([1, 2, 3, 1, 3, 3, 4, 1])]
    trace = prepare(reqs, cost)
    plain = simulate(trace, make_policy("lru", 2), 2, cost)
    gated = simulate(trace, make_policy("lru", 2), 2, cost, admission=AdmitAfter(n=2))
    # plain LRU: 1 2 3(evicts 1) 1(evicts 2) 3 hit 3 hit 4(evicts 1) 1(evicts 3) -> 2 hits
    # gated:     1 2 3(refused) 1 hit, 3(admitted, evicts 2) 3 hit 4(refused) 1 hit -> 3 hits
    assert (plain.hits, gated.hits) == (2, 3)
    assert gated.evictions == 1


@given(st.lists(st.integers(0, 12), min_size=1, max_size=80), st.integers(1, 6))
def test_admit_after_one_is_no_admission(seq: list[int], capacity: int) -> None:
    from policies import AdmitAfter

    cost = CostModel(block_bytes=1, bandwidth=1e30, latency=0, recompute_tps=512)
    trace = prepare([Request(float(i), 512, (k,)) for i, k in enumerate(seq)], cost)
    a = simulate(trace, make_policy("prefix", capacity), capacity, cost)
    b = simulate(trace, make_policy("prefix", capacity), capacity, cost,
                 admission=AdmitAfter(n=1))
    assert (a.hits, a.evictions) == (b.hits, b.evictions)


def test_admission_specs() -> None:
    from policies import make_admission, split_spec

    assert split_spec("prefix+after(n=3)") == ("prefix", "after(n=3)")
    assert split_spec("lru") == ("lru", "all")
    assert make_admission("after(n=3)").admit(Item("x"), 0) is False
    with pytest.raises(PolicyError):
        make_admission("sometimes")
    with pytest.raises(PolicyError):
        make_admission("after(n=0)")
    trace = prepare([Request(0.0, 512, (1,))], CostModel(block_bytes=1))
    with pytest.raises(ConfigError):
        run_replay(trace, ["lru+never"], [parse_capacity("0.5")])


def test_engine_access_log_replays(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The engine writes the accesslog format; replaying it sees the engine's own chunks."""
    import numpy as np
    from rkvtest import SMALL, local_config

    from rkv import Engine
    from rkv.eval.demo import synthetic_kv
    from rkv.format.keys import as_token_array, chunk_keys

    log = tmp_path / "access.jsonl"
    base = np.arange(48)
    seqs = [np.concatenate([base, np.arange(100 * i, 100 * i + 20)]) for i in range(3)]
    with Engine.open(tmp_path / "s", local_config(16), access_log=log) as e:
        for s in seqs:
            e.put(s, synthetic_kv(SMALL, s), model=SMALL)
        for s in seqs:
            assert e.get(s, model=SMALL).n_tokens == len(s)
    reqs = list(read_trace(log, "accesslog"))
    assert [r.op for r in reqs] == ["put"] * 3 + ["get"] * 3
    want = chunk_keys(as_token_array(seqs[0]), SMALL.fingerprint(), 16, partial=True)
    assert reqs[0].blocks == tuple(k.hex() for k in want)
    assert reqs[0].block_tokens == 16 and reqs[0].tokens == 68
    cost = CostModel(block_bytes=1)
    r = simulate(prepare(reqs, cost), InfiniteCache(100), 100, cost)
    assert r.requests == 3 and r.prefix_hit_tokens == r.tokens == 3 * 68   # gets all hit
    assert main(["replay", str(log), "--format", "accesslog", "--policy", "lru",
                 "--capacity", "0.5", "--quiet"]) == 0
    assert "lru" in capsys.readouterr().out


def test_lookahead_protects_queued_blocks() -> None:
    """Capacity 1: [a] [b] [a]. Knowing the queue, b does not push out the a that comes next."""
    cost = CostModel(block_bytes=1, bandwidth=1e30, latency=0, recompute_tps=512)
    trace = prepare([Request(float(i), 512, (k,)) for i, k in enumerate("aba")], cost)
    blind = simulate(trace, make_policy("lru", 1), 1, cost)
    queue = simulate(trace, make_policy("lru", 1), 1, cost, lookahead=1)
    assert (blind.hits, queue.hits) == (0, 1)
    longer = prepare([Request(float(i), 512, (k,)) for i, k in enumerate("abcab")], cost)
    # blind LRU: c evicts a, a evicts b -> 0 hits; a queue of 1 keeps a (c evicts b) -> 1;
    # a queue of 3 keeps a and b, and c is not cached at all -> 2
    hits = [simulate(longer, make_policy("lru", 2), 2, cost, lookahead=n).hits
            for n in (0, 1, 3)]
    assert hits == [0, 1, 2]
    with pytest.raises(ConfigError):
        run_replay(trace, ["lru"], [parse_capacity("0.5")], cost, lookaheads=[-1])
