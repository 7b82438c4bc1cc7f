"""Expert replay (``rkv.moe.replay``): metrics on hand-made traces with known answers, Belady
as the limit, per-layer and global budgets, hostile trace files, the shared policy classes,
the presets' sizes, synthetic traces and the ``rkv replay --moe`` command."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from replay_helpers import SLOW, write

import policies
from policies.belady import Belady
from policies.prefetch import CoOccurrence, QueueOrder
from rkv.cli import main
from rkv.errors import ConfigError, InputError
from rkv.moe import replay as R
from rkv.moe.presets import PRESETS, preset, synthetic_routes, synthetic_trace
from rkv.moe.trace import TraceHeader


# -- known answers ---------------------------------------------------------------------------------
def test_hits_bytes_and_stall_without_prefetch(tmp_path: Path) -> None:
    tr = R.read_trace(write(tmp_path / "t.jsonl", [[[0]], [[1]], [[0]], [[2]], [[0]]]))
    src = R.Source("s", bandwidth=100.0, latency=0.5)
    r = R.simulate(tr, "lru", 2, source=src)
    assert (r.accesses, r.hits, r.misses, r.evictions) == (5, 2, 3, 1)
    assert r.hit_ratio == pytest.approx(0.4)
    assert r.demand_bytes == 300 and r.bytes_per_token == pytest.approx(60)
    assert r.stall == pytest.approx(3 * 1.5) and r.stall_per_token == pytest.approx(0.9)
    assert r.precision is None and r.prefetched == 0


def test_hint_prefetch_precision_recall_and_hidden_stall(tmp_path: Path) -> None:
    routes = [[[0], [1]], [[0], [2]]]
    hints = [[[], [1]], [[0], [3]]]
    tr = R.read_trace(write(tmp_path / "t.jsonl", routes, hints=hints))
    kw: dict[str, Any] = {"source": SLOW, "compute": 2.0}
    base = R.simulate(tr, "lru", 4, prefetch=R.NONE, **kw)
    r = R.simulate(tr, "lru", 4, prefetch=R.HINTS, **kw)
    assert base.misses == 3 and base.stall == pytest.approx(3.0)
    # (1,1) prefetched in time and used; (0,0) hinted but cached; (1,3) prefetched, unused
    assert (r.hits, r.misses, r.prefetched, r.prefetch_used) == (2, 2, 2, 1)
    assert r.precision == pytest.approx(0.5)
    assert r.demand_bytes == 200 and r.prefetch_bytes == 200
    assert r.bytes_per_token == pytest.approx(200)
    assert r.stall == pytest.approx(2.0)          # the prefetched load hid behind compute
    (s_base, s_pf) = R.summarize([base, r])
    assert s_pf.recall == pytest.approx(1 / 3) and s_base.recall is None


def test_late_prefetch_hides_part_and_a_wrong_one_in_flight_is_dropped(tmp_path: Path) -> None:
    kw: dict[str, Any] = {"source": SLOW, "compute": 0.5, "prefetch": R.HINTS}
    right = R.read_trace(write(tmp_path / "a.jsonl", [[[0], [1]]], hints=[[[], [1]]]))
    r = R.simulate(right, "lru", 4, **kw)
    assert (r.hits, r.prefetch_used) == (1, 1)
    assert r.stall == pytest.approx(1.0 + 0.5)    # layer 0's miss, then 0.5 s of lateness
    wrong = R.read_trace(write(tmp_path / "b.jsonl", [[[0], [1]]], hints=[[[], [2]]]))
    w = R.simulate(wrong, "lru", 4, cancel_chunk=0, **kw)      # cancelled at once
    assert (w.hits, w.prefetched, w.prefetch_used) == (0, 1, 0)
    assert w.prefetch_bytes == 50                 # dropped half way, at the router
    assert w.stall == pytest.approx(1.0 + 1.0)    # demand load starts when compute ends
    whole = R.simulate(wrong, "lru", 4, **kw)     # the default: an expert is one copy
    assert whole.prefetch_bytes == 100            # it runs to the end, at 1 s
    assert whole.stall == pytest.approx(1.0 + 1.5)   # the demand load waits for it


def test_cooccur_learns_a_fixed_successor(tmp_path: Path) -> None:
    rng = random.Random(1)
    routes = []
    for _ in range(200):
        e = rng.randrange(8)
        routes.append([[e], [e]])                 # layer 1 always follows layer 0
    tr = R.read_trace(write(tmp_path / "t.jsonl", routes, experts=8))
    base = R.simulate(tr, "lru", 8, source=SLOW, compute=2.0)
    r = R.simulate(tr, "lru", 8, prefetch="cooccur(min_p=0.5)", width=1, source=SLOW,
                   compute=2.0)        # the token-to-token step is random: not prefetched
    assert r.precision is not None and r.precision > 0.9
    assert r.misses < base.misses and r.stall < base.stall


# -- Belady, budgets -------------------------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), budget=st.integers(1, 12), per_layer=st.booleans())
def test_belady_has_the_fewest_misses(seed: int, budget: int, per_layer: bool) -> None:
    shape = R.MoETrace(TraceHeader("m", "", 3, 6, 2, 1), [])
    rng = random.Random(seed)
    shape.routes = [[tuple(rng.sample(range(6), 2)) for _ in range(3)] for _ in range(40)]
    opt = R.simulate(shape, R.BELADY, budget, per_layer=per_layer)
    for spec in policies.available():
        r = R.simulate(shape, spec, budget, per_layer=per_layer)
        assert opt.misses <= r.misses, spec
    for pf in ("cooccur",):
        assert R.simulate(shape, "lru", budget, per_layer=per_layer, prefetch=pf).accesses == 240


def test_budgets_split_per_layer(tmp_path: Path) -> None:
    assert R.split_budget(26, 32) == [1] * 26 + [0] * 6
    assert R.split_budget(10, 3) == [4, 3, 3]
    tr = R.read_trace(write(tmp_path / "t.jsonl", [[[0], [0]]] * 10, experts=2))
    assert R.budget_experts("50%", tr) == 2 and R.budget_experts("0.25", tr) == 1
    assert R.budget_experts("250B", tr) == 2
    with pytest.raises(ConfigError):
        R.budget_experts("99B", tr)
    per = R.simulate(tr, "lru", 1, per_layer=True)     # layer 0 keeps its expert, 1 streams
    glob = R.simulate(tr, "lru", 1, per_layer=False)   # one slot, the layers take turns
    assert (per.hits, glob.hits) == (9, 0)
    assert per.budget_experts == glob.budget_experts == 1
    assert per.budget_fraction == pytest.approx(0.25)


def test_matrix_adds_the_references_and_the_gap(tmp_path: Path) -> None:
    routes = [[[i % 3], [(i * 7) % 4]] for i in range(60)]
    tr = R.read_trace(write(tmp_path / "t.jsonl", routes))
    res = R.run_matrix(tr, ["lfu"], ["50%"], [R.NONE, "cooccur", R.HINTS], [R.GLOBAL])
    labels = [r.label for r in res]
    assert labels == ["lfu (global)", "lfu +cooccur (global)", "lru (per-layer)",
                      "lru (global)", "belady (global)", "belady (per-layer)",
                      "belady +oracle (global)",
                      "belady +oracle (per-layer)"]    # no hints in this trace
    by = {r.label: r for r in res}
    assert by["lru (per-layer)"].gap_closed == pytest.approx(0.0)
    assert by["belady (per-layer)"].gap_closed == pytest.approx(1.0)
    assert by["lru (global)"].gap_closed == pytest.approx(0.0)    # each layout's own ends
    assert by["belady (global)"].gap_closed == pytest.approx(1.0)
    assert by["lfu +cooccur (global)"].gap_closed is None        # no prefetching optimum
    for r in res:                                   # the prefetch-aware gap: every run
        assert r.gap_prefetch is not None, r.label
    assert by["belady +oracle (global)"].gap_prefetch == pytest.approx(1.0)
    assert by["lru (global)"].gap_prefetch == pytest.approx(0.0)
    with pytest.raises(ConfigError):
        R.run_matrix(tr, ["nope"], ["50%"])
    with pytest.raises(ConfigError):
        R.simulate(tr, R.BELADY, 2, prefetch="cooccur")
    with pytest.raises(ConfigError):
        R.simulate(tr, R.BELADY, 2, prefetch=R.HINTS)
    with pytest.raises(ConfigError):
        R.simulate(tr, "lru", 2, prefetch=R.HINTS)


# -- the same classes as the engine ----------------------------------------------------------------
def test_replay_uses_the_shared_policy_classes() -> None:
    from policies import lru, registry
    from rkv.moe import cache as moe_cache

    assert vars(moe_cache)["make_policy"] is policies.make_policy is registry.make_policy
    pols = R._policies("lru", [1, 2], 10, [])
    assert all(type(p) is lru.LRU for p in pols)
    assert type(R._policies("activation", [1], 10, [])[0]) is \
        policies.activation.ActivationAware
    assert type(R._policies(R.BELADY, [1], 10, [(0, 0)])[0]) is Belady
    assert type(R._prefetcher("cooccur")) is CoOccurrence
    assert type(R._prefetcher(R.HINTS)) is QueueOrder
    assert R._prefetcher(R.NONE) is None


# -- hostile files ---------------------------------------------------------------------------------
HEAD = {"format": "rkv-moe-trace", "version": 1, "model": "m", "fingerprint": "00",
        "layers": 2, "experts": 4, "top_k": 2, "expert_bytes": 8}
GOOD = {"t": 0, "layers": [[0, 1], [2, 3]]}


@pytest.mark.parametrize("lines", [
    [],
    ["not json"],
    [json.dumps({**HEAD, "format": "other"})],
    [json.dumps({**HEAD, "version": 2})],
    [json.dumps({**HEAD, "layers": 0})],
    [json.dumps({**HEAD, "top_k": 5})],
    [json.dumps({**HEAD, "expert_bytes": True})],
    [json.dumps(HEAD)],                                               # no tokens
    [json.dumps(HEAD), json.dumps([1])],
    [json.dumps(HEAD), json.dumps({**GOOD, "t": -1})],
    [json.dumps(HEAD), json.dumps({**GOOD, "layers": [[0, 1]]})],
    [json.dumps(HEAD), json.dumps({**GOOD, "layers": [[0, 1, 2], [0]]})],
    [json.dumps(HEAD), json.dumps({**GOOD, "layers": [[0, 4], [0]]})],
    [json.dumps(HEAD), json.dumps({**GOOD, "layers": [[0, 0], [0]]})],
    [json.dumps(HEAD), json.dumps({**GOOD, "layers": [[True], [0]]})],
    [json.dumps(HEAD), json.dumps({**GOOD, "layers": [[], [0]]})],
    [json.dumps(HEAD), json.dumps({**GOOD, "hints": [[0]]})],
    [json.dumps(HEAD), json.dumps({**GOOD, "hints": [[9], []]})],
])
def test_bad_traces_raise_input_error(tmp_path: Path, lines: list[str]) -> None:
    p = tmp_path / "bad.jsonl"
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError):
        R.read_trace(p)


def test_missing_file_and_bad_limit(tmp_path: Path) -> None:
    with pytest.raises(InputError):
        R.read_trace(tmp_path / "nope.jsonl")
    p = tmp_path / "ok.jsonl"
    p.write_text(json.dumps(HEAD) + "\n" + json.dumps(GOOD) + "\n"
                 + json.dumps({**GOOD, "t": 1}) + "\n")
    assert R.read_trace(p, limit=1).tokens == 1
    with pytest.raises(InputError):
        R.read_trace(p, limit=0)


# -- presets and synthetic traces ------------------------------------------------------------------
def test_preset_sizes() -> None:
    assert preset("mixtral-8x7b").expert_bytes() == 3 * 4096 * 14336 * 2 == 352_321_536
    assert preset("olmoe-1b-7b").expert_bytes(16) == 3 * 2048 * 1024 * 2
    assert preset("qwen3-30b-a3b").expert_bytes(8) == 3 * 2048 * 768
    assert preset("deepseek-v2-lite").expert_bytes(4) == 3 * 2048 * 1408 // 2
    ds = preset("DeepSeek-V2-Lite")
    assert (ds.layers, ds.experts, ds.top_k, ds.shared_experts) == (26, 64, 6, 2)
    assert preset("mixtral-8x7b").routed_bytes() == 32 * 8 * 352_321_536
    assert {(s.layers, s.experts, s.top_k) for s in PRESETS.values()} == {
        (32, 8, 2), (16, 64, 8), (48, 128, 8), (26, 64, 6)}
    with pytest.raises(ConfigError):
        preset("gpt-4")
    with pytest.raises(ConfigError):
        preset("mixtral-8x7b").expert_bytes(3)


def test_synthetic_traces_are_valid_and_seeded(tmp_path: Path) -> None:
    shape = preset("olmoe-1b-7b")
    a = synthetic_trace(shape, tmp_path / "a.jsonl", 20, seed=3, bits=4)
    b = synthetic_trace(shape, tmp_path / "b.jsonl", 20, seed=3, bits=4)
    assert a.read_bytes() == b.read_bytes()
    tr = R.read_trace(a)
    assert (tr.tokens, tr.layers, tr.experts, tr.expert_bytes) == (20, 16, 64,
                                                                  shape.expert_bytes(4))
    assert all(len(ids) == 8 for route in tr.routes for ids in route)
    assert tr.model.startswith("synthetic:olmoe-1b-7b")
    sticky = list(synthetic_routes(shape, 30, locality=1.0))
    assert all(r == sticky[0] for r in sticky)


# -- the command line ------------------------------------------------------------------------------
def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = synthetic_trace(preset("mixtral-8x7b"), tmp_path / "m.jsonl", 30)
    out = tmp_path / "r.json"
    assert main(["replay", "--moe", str(p), "--budget", "25%", "--budget", "50%",
                 "--prefetch", "none,cooccur(min_p=0.2)", "--per-layer", "--quiet",
                 "--json", str(out), "--plot", str(tmp_path / "r.png"),
                 "--shape", "mixtral-8x7b", "--bits", "4", "--source", "nvme"]) == 0
    doc = json.loads(out.read_text())
    assert doc["expert_bytes"] == preset("mixtral-8x7b").expert_bytes(4)
    assert doc["source"]["name"] == "nvme"
    labels = {r["label"] for r in doc["results"]}
    assert "activation +cooccur(min_p=0.2) (per-layer)" in labels
    assert (tmp_path / "r.png").stat().st_size > 0
    assert "gap closed" in capsys.readouterr().out
    assert main(["replay", "--moe", "synthetic:olmoe-1b-7b:5", "--policy", "lru",
                 "--prefetch", "none", "--markdown"]) == 0
    assert "| lru (global) |" in capsys.readouterr().out
    for bad in (["replay", str(p), "--budget", "5%"],                 # MoE option, no --moe
                ["replay", "--moe", str(p), "--capacity", "5%"],      # KV option with --moe
                ["replay", "--moe", str(p), "--shape", "olmoe-1b-7b"],  # 64 experts vs 8
                ["replay", "--moe", str(p), "--prefetch", "hints"],   # no hints in the trace
                ["replay", "--moe", str(tmp_path / "none.jsonl")]):
        assert main(bad) == 2
