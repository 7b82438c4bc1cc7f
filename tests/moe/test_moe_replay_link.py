"""Expert replay (``rkv.moe.replay``): link contention (``cancel_chunk``), interference, the
traffic charged, the oracle prefetch and the prefetch-aware reference (Belady + oracle).

Hand-computed timings on tiny traces; properties on random ones; and a differential test
against the model before link contention (tests/moe/legacy_replay.py, a frozen copy).
"""

from __future__ import annotations

import itertools
import json
import math
import random
from pathlib import Path
from typing import Any

import legacy_replay as old
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from replay_helpers import SLOW, write

from policies.base import Item, Reason
from policies.belady import Belady, next_use_after, next_use_positions
from rkv.cli import main
from rkv.errors import ConfigError
from rkv.moe import replay as R
from rkv.moe.trace import TraceHeader


def random_trace(seed: int, layers: int = 2, experts: int = 5, top_k: int = 2,
                 tokens: int = 30, hints: bool = True, expert_bytes: int = 100) -> R.MoETrace:
    rng = random.Random(seed)
    tr = R.MoETrace(TraceHeader("m", "", layers, experts, top_k, expert_bytes), [])
    tr.routes = [[tuple(rng.sample(range(experts), top_k)) for _ in range(layers)]
                 for _ in range(tokens)]
    if hints:
        tr.hints = [[tuple(rng.sample(range(experts), rng.randrange(top_k + 1)))
                     for _ in range(layers)] for _ in range(tokens)]
    return tr


# -- hand-computed timings -------------------------------------------------------------------------
@pytest.fixture
def dropped(tmp_path: Path) -> R.MoETrace:
    """One token, 2 layers: layer 1 needs expert 1, the hint says 2 (a wrong prefetch)."""
    return R.read_trace(write(tmp_path / "t.jsonl", [[[0], [1]]], hints=[[[], [2]]]))


@pytest.mark.parametrize(("chunk", "moved", "stall"), [
    (0, 60, 1.0 + 1.0),        # cancelled at the router (0.6 s): 60 bytes moved
    (25, 75, 1.0 + 1.15),      # the third 25-byte chunk was in progress: link free at 0.75
    (40, 80, 1.0 + 1.2),       # the second 40-byte chunk: free at 0.8
    (None, 100, 1.0 + 1.4),    # the default, one copy of the whole expert: free at 1.0
    (1000, 100, 1.0 + 1.4),    # a chunk above the expert is the whole expert
])
def test_a_dropped_prefetch_holds_the_link_to_its_chunk_end(
        dropped: R.MoETrace, chunk: int | None, moved: int, stall: float) -> None:
    r = R.simulate(dropped, "lru", 4, prefetch=R.HINTS, source=SLOW, compute=0.6,
                   cancel_chunk=chunk)
    # layer 0: a miss, 1 s; the prefetch of (1, 2) runs from 0; layer 1's miss waits for it
    assert (r.hits, r.prefetched, r.prefetch_used, r.misses) == (0, 1, 0, 2)
    assert r.prefetch_bytes == moved
    assert r.stall == pytest.approx(stall)
    assert r.cancel_chunk == min(100, 1000 if chunk is None else chunk) or chunk is None


@pytest.fixture
def carried(tmp_path: Path) -> R.MoETrace:
    """Two tokens of 2 layers; the prefetch of (0, 3) is wrong and token 1's layer 0 hits,
    so the dropped copy stays on the link into that layer's compute, up to layer 1's miss."""
    return R.read_trace(write(tmp_path / "t.jsonl", [[[0], [1]], [[0], [2]]],
                              hints=[[[], [1]], [[3], []]]))


@pytest.mark.parametrize(("chunk", "moved", "stall", "slowed"), [
    # steps: 1.0 (miss) + 0.8 (the right prefetch arrives at 1.0) + 0 (hit) + layer 1's miss
    (0, 120, 1.0 + 0.8 + 0.0 + 1.0, 0.2 + 0.2),           # cut at 0.2 s: 20 bytes
    (60, 160, 1.0 + 0.8 + 0.0 + 1.2, 0.2 + 0.2 + 0.2),    # link free 0.4 s into the frame
    (None, 200, 1.0 + 0.8 + 0.0 + 1.6, 0.2 + 0.2 + 0.2),  # free 0.8 s in: the miss waits
])
def test_a_dropped_copy_carries_into_the_next_layer(
        carried: R.MoETrace, chunk: int | None, moved: int, stall: float,
        slowed: float) -> None:
    kw: dict[str, Any] = {"prefetch": R.HINTS, "source": SLOW, "compute": 0.2,
                          "cancel_chunk": chunk}
    r = R.simulate(carried, "lru", 4, **kw)
    assert (r.prefetched, r.prefetch_used, r.misses) == (2, 1, 2)
    assert r.prefetch_bytes == moved
    assert r.stall == pytest.approx(stall)
    assert r.interference_stall == 0.0
    # interference 1: every copy second within a 0.2 s compute adds a second
    f = R.simulate(carried, "lru", 4, interference=1.0, **kw)
    assert f.interference_stall == pytest.approx(slowed)
    assert f.stall == pytest.approx(stall + slowed)
    assert (f.hits, f.prefetch_bytes) == (r.hits, r.prefetch_bytes)


def test_interference_adds_the_overlapped_copy_time(tmp_path: Path) -> None:
    tr = R.read_trace(write(tmp_path / "t.jsonl", [[[0], [1]]], hints=[[[], [1]]]))
    kw: dict[str, Any] = {"prefetch": R.HINTS, "source": SLOW, "compute": 0.6}
    base = R.simulate(tr, "lru", 4, **kw)
    assert base.stall == pytest.approx(1.0 + 0.4)      # the right prefetch lands at 1.0
    r = R.simulate(tr, "lru", 4, interference=0.5, **kw)
    assert r.interference_stall == pytest.approx(0.5 * 0.6)   # copy over all of compute
    assert r.stall == pytest.approx(1.0 + 0.4 + 0.3)
    lat = R.Source("lat", bandwidth=100.0, latency=0.5)
    r = R.simulate(tr, "lru", 4, interference=1.0, **{**kw, "source": lat})
    assert r.interference_stall == pytest.approx(0.6 - 0.5)   # the latency moves no bytes
    none = R.simulate(tr, "lru", 4, interference=3.0, source=SLOW, compute=0.6)
    assert none.interference_stall == 0.0 and none.stall == pytest.approx(2.0)


# -- properties ------------------------------------------------------------------------------------
def _decisions(r: R.MoEResult) -> tuple[int, ...]:
    return (r.hits, r.prefetched, r.prefetch_used, r.evictions)


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 10**6), budget=st.integers(1, 8), per_layer=st.booleans(),
       prefetch=st.sampled_from([R.HINTS, "cooccur", R.ORACLE]),
       compute=st.sampled_from([0.2, 0.6, 1.5]))
def test_stall_grows_with_the_chunk_and_the_interference(
        seed: int, budget: int, per_layer: bool, prefetch: str, compute: float) -> None:
    """More interference never stalls less (it changes no decision). A coarser chunk (each
    a multiple of the finer, so its chunk ends come no earlier) never stalls less between
    runs that made the same decisions; it can change them (a busy link issues fewer
    prefetches), and then it may stall less: test_a_busy_link_can_block_a_wrong_prefetch."""
    tr = random_trace(seed)
    kw: dict[str, Any] = {"per_layer": per_layer, "prefetch": prefetch, "source": SLOW,
                          "compute": compute}
    runs = [R.simulate(tr, "lru", budget, cancel_chunk=c, **kw) for c in (0, 25, 50, None)]
    for a, b in itertools.pairwise(runs):
        if _decisions(a) == _decisions(b):
            assert a.stall <= b.stall, (a.cancel_chunk, b.cancel_chunk)
    f_runs = [R.simulate(tr, "lru", budget, interference=f, **kw) for f in (0.0, 0.1, 1.0)]
    assert len({_decisions(r) for r in f_runs}) == 1
    assert [r.stall for r in f_runs] == sorted(r.stall for r in f_runs)


def test_a_busy_link_can_block_a_wrong_prefetch() -> None:
    """Found by the property above: with whole-expert copies, a dropped copy still holds the
    link when the next layer would issue a (wrong) prefetch, so it is not issued; with
    50-byte chunks it is, and is dropped again. The whole expert stalls less here."""
    kw: dict[str, Any] = {"per_layer": False, "prefetch": R.HINTS, "source": SLOW,
                          "compute": 0.6}
    half, whole = (R.simulate(random_trace(6273), "lru", 7, cancel_chunk=c, **kw)
                   for c in (50, None))
    assert whole.prefetched == half.prefetched - 1 and whole.hits == half.hits
    assert whole.stall < half.stall


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), budget=st.integers(1, 10), per_layer=st.booleans(),
       policy=st.sampled_from(["lru", "lfu", "activation", R.BELADY]),
       prefetch=st.sampled_from([R.NONE, R.HINTS, "cooccur"]),
       compute=st.sampled_from([0.0, 0.3, 2.0]), latency=st.sampled_from([0.0, 0.25]))
def test_instant_cancel_without_interference_is_the_old_model(
        seed: int, budget: int, per_layer: bool, policy: str, prefetch: str, compute: float,
        latency: float) -> None:
    if policy == R.BELADY and prefetch != R.NONE:
        return
    tr = random_trace(seed, layers=3)
    src = R.Source("s", bandwidth=100.0, latency=latency)
    kw: dict[str, Any] = {"per_layer": per_layer, "prefetch": prefetch, "source": src,
                          "compute": compute}
    want = old.simulate(tr, policy, budget, **kw)
    got = R.simulate(tr, policy, budget, cancel_chunk=0, interference=0.0, **kw)
    assert got.stall == want["stall"]                  # exactly: the same arithmetic
    for name in ("hits", "demand_bytes", "prefetched", "prefetch_used", "evictions",
                 "stall_no_hide"):
        assert getattr(got, name) == want[name], name
    if latency == 0:
        assert got.prefetch_bytes == want["prefetch_bytes"]
    else:   # the old count took the latency of a dropped copy for bytes moved
        assert got.prefetch_bytes <= want["prefetch_bytes"]


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), budget=st.integers(1, 10), per_layer=st.booleans(),
       chunk=st.sampled_from([0, 50, None]), compute=st.sampled_from([0.2, 0.6, 1.5]),
       width=st.sampled_from([1, 2]))
def test_the_oracle_is_precise_and_helps_belady(
        seed: int, budget: int, per_layer: bool, chunk: int | None, compute: float,
        width: int) -> None:
    tr = random_trace(seed, layers=3, hints=False)
    kw: dict[str, Any] = {"per_layer": per_layer, "source": SLOW, "compute": compute,
                          "cancel_chunk": chunk}
    ref = R.simulate(tr, R.BELADY, budget, prefetch=R.ORACLE, width=width, **kw)
    opt = R.simulate(tr, R.BELADY, budget, **kw)
    assert ref.precision in (None, 1.0)
    assert ref.stall <= opt.stall + 1e-9
    assert ref.misses + ref.prefetch_used <= opt.misses   # it loads no expert Belady skips
    lru = R.simulate(tr, "lru", budget, prefetch=R.ORACLE, width=width, **kw)
    assert lru.precision in (None, 1.0)


# -- Belady with insertions ahead of their reference -----------------------------------------------
def test_belady_reads_a_prefetched_keys_own_next_use() -> None:
    refs = ["a", "b", "c", "a", "x", "b"]
    arr, fn = next_use_positions(refs), next_use_after(refs)
    assert [fn(k, i) for i, k in enumerate(refs)] == [
        math.inf if n == len(refs) else n for n in arr]
    assert fn("x", 2) == 4 and fn("x", 4) == math.inf and fn("zz", 0) == math.inf
    b = Belady(2, fn)
    for i in range(3):                           # a and b cached after reference 1 ...
        if i < 2:
            b.on_access(refs[i], False, i, Item(refs[i], 1))
            b.on_insert(Item(refs[i], 1), i)
    # ... then "x" prefetched after reference 1, ahead of its use at 4: a is next used at 3,
    # b at 5, so b goes. The array would have given "x" the next use of reference 1's key
    # (b, at 5) and a wrong rank.
    assert b.victims(1) == ["b"]
    b.on_remove("b", Reason.EVICTED)
    b.on_insert(Item("x", 1), 1)
    assert b.next_use("x") == 4 and b.next_use("a") == 3
    assert b.victims(1) == ["x"]


def test_belady_demand_only_is_the_same_by_array_or_lookup() -> None:
    tr = random_trace(7, layers=3, tokens=60, hints=False)
    refs = tr.refs
    for per_layer in (True, False):
        a = R.simulate(tr, R.BELADY, 5, per_layer=per_layer, compute=0.0)
        pols = R._policies(R.BELADY, [5], 100, refs, ahead=True)
        assert type(pols[0]) is Belady
        b = R.simulate(tr, R.BELADY, 5, per_layer=per_layer, prefetch=R.ORACLE, width=1,
                       compute=0.0)                # no compute: the oracle issues nothing
        assert b.prefetched == 0
        assert (a.hits, a.evictions, a.stall) == (b.hits, b.evictions, b.stall)


# -- the report ------------------------------------------------------------------------------------
def test_traffic_and_both_gaps_in_the_matrix() -> None:
    tr = random_trace(3, layers=2, tokens=40)
    res = R.run_matrix(tr, ["lru", "lfu"], ["50%"], [R.NONE, R.HINTS], [R.GLOBAL],
                       source=SLOW, compute=0.6)
    by = {r.label: r for r in res}
    for lay in (R.GLOBAL, R.PER_LAYER):
        assert by[f"lru ({lay})"].traffic == 1.0
        assert by[f"belady +oracle ({lay})"].gap_prefetch == pytest.approx(1.0)
        assert by[f"belady +oracle ({lay})"].precision in (None, 1.0)
    for r in res:
        assert r.traffic is not None and r.traffic > 0, r.label
        lru = by[f"lru ({r.layout})"]
        assert r.traffic == pytest.approx(
            (r.demand_bytes + r.prefetch_bytes) / lru.demand_bytes)
    pf = by["lru +hints (global)"]
    assert pf.gap_closed is None and pf.gap_prefetch is not None
    row = pf.row()
    assert {"traffic", "gap_prefetch", "cancel_chunk", "interference"} <= set(row)


@pytest.mark.parametrize("kw", [
    {"cancel_chunk": -1}, {"cancel_chunk": "lots"}, {"cancel_chunk": True},
    {"cancel_chunk": "1.5B"}, {"interference": -0.1}, {"interference": math.nan},
    {"interference": math.inf}, {"interference": "0.1"},
    {"policy": R.BELADY, "prefetch": "cooccur"},
])
def test_bad_parameters_are_config_errors(dropped: R.MoETrace, kw: dict[str, Any]) -> None:
    kw = {"policy": "lru", **kw}
    with pytest.raises(ConfigError):
        R.simulate(dropped, kw.pop("policy"), 2, **kw)
    if "policy" not in kw and "prefetch" not in kw:
        with pytest.raises(ConfigError):
            R.run_matrix(dropped, ["lru"], ["50%"], **kw)


def test_cancel_chunk_sizes() -> None:
    assert R.cancel_bytes("1MiB") == 2**20 and R.cancel_bytes("4096") == 4096
    assert R.cancel_bytes("0") == 0 and R.cancel_bytes(None) is None
    assert R.cancel_bytes("expert", 300) == 300 and R.cancel_bytes("1MiB", 300) == 300


def test_cli_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = write(tmp_path / "t.jsonl", [[[i % 3], [(i * 7) % 4]] for i in range(30)],
              hints=[[[], [(i * 7) % 4]] for i in range(30)])
    out = tmp_path / "r.json"
    assert main(["replay", "--moe", str(p), "--policy", "lru", "--budget", "50%",
                 "--prefetch", "none,hints,oracle", "--cancel-chunk", "25B",
                 "--interference", "0.1", "--quiet", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "traffic x" in text and "gap vs pf ref %" in text and "belady +oracle" in text
    doc = json.loads(out.read_text())
    assert doc["cancel_chunk"] == 25 and doc["interference"] == 0.1
    assert all(r["cancel_chunk"] == 25 for r in doc["results"])
    assert {r["traffic"] for r in doc["results"] if r["label"] == "lru (global)"} == {1.0}
    for bad in (["--cancel-chunk", "-5"], ["--cancel-chunk", "big"],
                ["--interference", "nan"], ["--interference", "-1"]):
        assert main(["replay", "--moe", str(p), "--policy", "lru", "--quiet", *bad]) == 2
    assert main(["replay", str(p), "--cancel-chunk", "0"]) == 2      # only with --moe
    assert main(["replay", str(p), "--interference", "0.1"]) == 2
    capsys.readouterr()
