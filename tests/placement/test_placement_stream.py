"""Tier in the plan: the stall model of a streamed restore against a direct simulation, a
planner that puts later layers in a slower tier when streaming hides their reads, never
worse than one tier, and an engine whose chunks live in several tiers as planned."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rkvtest import random_kv

from rkv import ConfigError, Engine, EngineConfig, ModelSpec, TierConfig
from rkv.format.keys import as_token_array, block_key, chunk_keys
from rkv.placement import BlockInput, PlacementConfig, Planner, TierInput
from rkv.placement.stall import finish_times, queued, stall_us, stream_order

SPEEDS = {"dram": (20.0, 0.1), "nvme": (6.5, 80.0)}     # GB/s, us
DRAM = TierInput("dram", "raw-ber", 1 << 40, read_gbps=20.0, latency_us=0.1)
NVME = TierInput("nvme", "raw-ber", 1 << 40, read_gbps=6.5, latency_us=80.0)


def simulate(layer: list[int], chunk: list[int], tier: list[int], read: list[float],
             layer_us: float) -> float:
    """A restore step by step: every tier reads its blocks one by one in (layer, chunk)
    order; a layer computes once all its blocks are in and the layer before is done."""
    n_layers = max(layer) + 1
    busy: dict[int, float] = {}
    ready = [0.0] * n_layers
    for i in sorted(range(len(layer)), key=lambda i: (layer[i], chunk[i])):
        busy[tier[i]] = busy.get(tier[i], 0.0) + read[i]
        ready[layer[i]] = max(ready[layer[i]], busy[tier[i]])
    t = 0.0
    for lay in range(n_layers):
        t = max(t, ready[lay]) + layer_us
    return t - n_layers * layer_us


@settings(max_examples=200, deadline=None)
@given(data=st.data(), n_layers=st.integers(1, 8), n_chunks=st.integers(1, 3),
       layer_us=st.floats(0.0, 300.0))
def test_stall_is_the_simulated_wait(data: st.DataObject, n_layers: int, n_chunks: int,
                                     layer_us: float) -> None:
    layer = [lay for c in range(n_chunks) for lay in range(n_layers)]
    chunk = [c for c in range(n_chunks) for _ in range(n_layers)]
    n = len(layer)
    tier = data.draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    read = data.draw(st.lists(st.floats(0.0, 500.0), min_size=n, max_size=n))
    args = (np.array(layer), np.array(chunk), np.array(tier), np.array(read))
    got = stall_us(*args, 3, layer_us)
    assert got == pytest.approx(simulate(layer, chunk, tier, read, layer_us), abs=1e-6)
    order = stream_order(args[0], args[1])
    done = finish_times(order, args[2], args[3], 3)
    q = queued(order, args[2], args[3], 3)
    own = q[np.arange(n), args[2]] + args[3]
    assert np.allclose(own, done)


def blocks(n_layers: int = 30, chunks: int = 2) -> list[BlockInput]:
    return [BlockInput(lay, "kv", c, 256, 24.0, 1.0, 3, 64, "float16", chunks)
            for c in range(chunks) for lay in range(n_layers)]


def cfg(layer_us: float | None, **kw: object) -> dict[str, object]:
    return {"max_p_due": 1.0, "bits": [16], "codes": ["none"], "layer_compute_us": layer_us,
            "capacity_cost": {"dram": 4000.0, "nvme": 30.0}, **kw}


def test_streaming_moves_later_layers_to_the_slow_tier() -> None:
    """200 us of compute per layer hides an NVMe read (110 us per 192 KiB block) for most
    layers: the plan keeps only the first layers in DRAM and stalls no more than an
    all-DRAM store; without streaming (raw read time) everything stays in DRAM."""
    bl = blocks()
    plan = Planner(cfg(200.0)).plan(bl, [DRAM, NVME])
    alldram = Planner(cfg(200.0)).plan(bl, [DRAM])
    assert plan.extra["stall_us"] <= alldram.extra["stall_us"] * 1.10
    dram = [b.layer for b in plan.blocks if b.tier == "dram"]
    assert len(dram) <= len(bl) // 2 and 0 in dram
    assert plan.tier_bytes["dram"] <= 0.5 * sum(plan.tier_bytes.values())
    raw = Planner(cfg(None)).plan(bl, [DRAM, NVME])
    assert set(raw.block_tier) == {"dram"}
    # Little compute to hide behind: the slow tier only takes what it can deliver in time.
    tight = Planner(cfg(5.0)).plan(bl, [DRAM, NVME])
    assert tight.extra["stall_us"] <= Planner(cfg(5.0)).plan(bl, [DRAM]).extra["stall_us"]
    assert sum(t == "nvme" for t in tight.block_tier) < sum(t == "nvme"
                                                           for t in plan.block_tier)


@settings(max_examples=25, deadline=None)
@given(layer_us=st.floats(0.0, 3000.0), dram_cost=st.floats(0.0, 1e5),
       n_layers=st.integers(1, 12), chunks=st.integers(1, 3))
def test_never_worse_than_one_tier(layer_us: float, dram_cost: float, n_layers: int,
                                   chunks: int) -> None:
    bl = blocks(n_layers, chunks)
    c = cfg(layer_us, capacity_cost={"dram": dram_cost, "nvme": 30.0})
    both = Planner(c).plan(bl, [DRAM, NVME])
    for one in ([DRAM], [NVME]):
        assert both.total_cost_us <= Planner(c).plan(bl, one).total_cost_us * (1 + 1e-9)
    assert both.lower_bound_us <= both.total_cost_us


def test_stream_config_validated() -> None:
    with pytest.raises(ConfigError, match="layer_compute_us"):
        PlacementConfig.from_dict({"layer_compute_us": -1.0})
    with pytest.raises(ConfigError, match="place_tiers"):
        PlacementConfig.from_dict({"place_tiers": "sometimes"})
    c = PlacementConfig(layer_compute_us=50.0, place_tiers=True)
    assert PlacementConfig.from_dict(c.to_dict()) == c


SPEC = ModelSpec("test/tiered", n_layers=8, n_kv_heads=2, head_dim=64, dtype="float16")


def _engine(tmp_path: Path, dram: int = 1 << 30) -> EngineConfig:
    tiers = (TierConfig("dram", medium="memory", path="t/dram", capacity_bytes=dram,
                        read_gbps=20.0, latency_us=0.1, fault_model="raw-ber"),
             TierConfig("nvme", medium="disk", path="t/nvme", capacity_bytes=1 << 30,
                        read_gbps=6.5, latency_us=80.0, fault_model="raw-ber"))
    return EngineConfig(chunk_tokens=64, tiers=tiers, promote="after(n=1)", placement={
        "max_p_due": 1.0, "bits": [16], "codes": ["none"], "layer_compute_us": 100.0,
        "place_tiers": True, "capacity_cost": {"dram": 4000.0, "nvme": 30.0}})


def _tiers(e: Engine, tokens: list[int]) -> list[list[str]]:
    out = []
    for key in chunk_keys(as_token_array(tokens), SPEC.fingerprint(), 64):
        with e.core.index.env.read() as txn:
            meta = e.core.index.get_chunk(txn, key)
        assert meta is not None
        for layer, (tier, size) in enumerate(meta.blocks):
            rec = e.tiers[tier].get(block_key(key, layer))
            assert rec is not None and len(rec) == size          # the block is where it says
            others = [t for t in e.tiers if t != tier]
            assert all(e.tiers[t].get(block_key(key, layer)) is None for t in others)
        out.append([t for t, _ in meta.blocks])
    return out


def test_engine_places_the_layers_of_a_chunk_in_several_tiers(tmp_path: Path) -> None:
    tokens = list(range(128))
    kv = random_kv(SPEC, 128)
    with Engine.open(tmp_path / "s", _engine(tmp_path)) as e:
        e.put(tokens, kv, model=SPEC)
        tiers = _tiers(e, tokens)
        assert all(t[0] == "dram" for t in tiers)             # layer 0 is needed first
        assert any("nvme" in t for t in tiers)
        for _ in range(3):                                    # reads promote nothing planned
            got = e.get(tokens, model=SPEC)
            assert got.ok and np.array_equal(got.kv, kv)
        e.settle()
        assert _tiers(e, tokens) == tiers
        st = e.stats()
        assert st["tiers"]["dram"]["blocks"] + st["tiers"]["nvme"]["blocks"] == 16
        assert st["tiers"]["nvme"]["mix"]


def test_a_full_fast_tier_demotes_the_planned_part(tmp_path: Path) -> None:
    """DRAM holds little: earlier chunks' DRAM parts are demoted to make room, reads still
    return every block exactly."""
    puts = [(list(range(100 * i, 100 * i + 64)), random_kv(SPEC, 64, seed=i))
            for i in range(4)]
    with Engine.open(tmp_path / "s", _engine(tmp_path, dram=200_000)) as e:
        for tokens, kv in puts:
            e.put(tokens, kv, model=SPEC)
        for tokens, kv in puts:
            got = e.get(tokens, model=SPEC)
            assert got.ok and np.array_equal(got.kv, kv)
        assert e.stats()["tiers"]["dram"]["bytes"] <= 200_000
        assert {t for tokens, _ in puts for c in _tiers(e, tokens) for t in c} == {"dram",
                                                                                    "nvme"}


def test_parallel_reads_let_a_second_tier_add_bandwidth() -> None:
    """5 us of compute per layer: with one reader every block waits in one queue and DRAM
    alone is fastest; with a reader per tier, NVMe takes some blocks in parallel and the
    stall falls below all-DRAM's."""
    bl = blocks()
    one = Planner(cfg(5.0)).plan(bl, [DRAM, NVME])
    par = Planner(cfg(5.0, parallel_reads=True)).plan(bl, [DRAM, NVME])
    alldram = Planner(cfg(5.0)).plan(bl, [DRAM]).extra["stall_us"]
    assert one.extra["stall_us"] == pytest.approx(alldram)
    assert par.extra["stall_us"] < 0.95 * alldram
    assert "nvme" in par.block_tier


def test_rkv_plan_plans_across_tiers(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                     ) -> None:
    from rkv.cli import main

    cfg_file = tmp_path / "engine.toml"
    cfg_file.write_text(
        'chunk_tokens = 256\n'
        '[[tiers]]\nname = "dram"\nmedium = "memory"\nfault_model = "raw-ber"\n'
        'read_gbps = 20.0\nlatency_us = 0.1\n'
        '[[tiers]]\nname = "nvme"\nmedium = "disk"\nfault_model = "raw-ber"\n'
        'read_gbps = 6.5\nlatency_us = 80.0\n'
        '[placement]\nmax_p_due = 1.0\nbits = [16]\ncodes = ["none"]\n'
        'layer_compute_us = 500.0\nplace_tiers = true\n'
        '[placement.capacity_cost]\ndram = 4000.0\nnvme = 30.0\n')
    out = tmp_path / "plan.json"
    assert main(["plan", "--config", str(cfg_file), "--tokens", "512", "--json",
                 str(out)]) == 0
    text = capsys.readouterr().out
    assert "tiers dram" in text and "stall" in text
    doc = json.loads(out.read_text())
    assert {b["tier"] for b in doc["blocks"]} == {"dram", "nvme"}


def test_campaign_on_a_mixed_tier_store_agrees_with_the_prediction(tmp_path: Path) -> None:
    """A planned store whose chunks live in DRAM and NVMe, each tier with its own raw BER;
    every block is injected from the model of the tier it is in, and the DUE count agrees
    with the plan's predictions two-sided (and would not if every block drew DRAM's
    rate)."""
    from rkv.eval.faults.planned import (
        BlockPrediction,
        compare,
        predicted_totals,
        run_planned_campaign,
    )
    from rkv.placement.options import resolve_model
    from rkv.tiers.faulty import FaultyTier

    spec = ModelSpec("test/mixed-campaign", n_layers=6, n_kv_heads=1, head_dim=16,
                     dtype="float16")
    bers = {"dram": 4e-5, "nvme": 1e-5}
    for n, b in bers.items():
        (tmp_path / f"{n}.toml").write_text(f'preset = "raw-ber"\nber = {b!r}\n')
    tiers = tuple(TierConfig(n, medium="memory" if n == "dram" else "disk", path=f"t/{n}",
                             capacity_bytes=1 << 30, read_gbps=SPEEDS[n][0],
                             latency_us=SPEEDS[n][1], fault_model=str(tmp_path / f"{n}.toml"))
                  for n in ("dram", "nvme"))
    cfg = EngineConfig(chunk_tokens=32, tiers=tiers, promote="never", repair=False,
                       placement={"max_p_due": 1.0, "bits": [16], "codes": ["none"],
                                  "layer_compute_us": 40.0, "place_tiers": True,
                                  "recompute_us_per_chunk": 0.0,
                                  "capacity_cost": {"dram": 4e6, "nvme": 30.0}})
    tokens = list(range(64))
    models = {n: resolve_model(str(tmp_path / f"{n}.toml")) for n in bers}
    with Engine.open(tmp_path / "s", cfg) as e:
        e.put(tokens, random_kv(spec, 64), model=spec)
        ep = e.core.placement
        assert ep is not None
        plan = ep.planner(spec).plan(ep.blocks(spec, [32, 32], 2),
                                     [ep.tier_input("dram"), ep.tier_input("nvme")])
        assert set(plan.block_tier) == {"dram", "nvme"}
        faulty = {n: e.wrap_tier(n, lambda t: FaultyTier(t)) for n in bers}
        res = run_planned_campaign(e, faulty, tokens, spec, models, 24.0, 60, seed=3,
                                   chunk_tokens=32)
    preds = [BlockPrediction(b.chunk, b.layer, 0.0, b.p_due, b.p_sdc) for b in plan.blocks]
    tot = predicted_totals(preds)
    cmp = compare(res.counts["due"], res.trials, tot["due"], tot["due_var"], len(preds))
    assert cmp["observed_in_predicted_range"], cmp
    # Power: had every block drawn DRAM's rate, the count would be far outside that range.
    worst = [BlockPrediction(b.chunk, b.layer, 0.0, max(p.p_due for p in plan.blocks
                                                        if p.tier == "dram"), 0.0)
             for b in plan.blocks]
    wt = predicted_totals(worst)
    assert not compare(res.counts["due"], res.trials, wt["due"], wt["due_var"],
                       len(preds))["observed_in_predicted_range"]


@settings(max_examples=30, deadline=None)
@given(layer_us=st.floats(0.0, 2000.0), n_layers=st.integers(1, 10),
       chunks=st.integers(1, 4), parallel=st.booleans(), dram_cost=st.floats(0.0, 1e5))
def test_reported_stall_is_the_plans_own(layer_us: float, n_layers: int, chunks: int,
                                         parallel: bool, dram_cost: float) -> None:
    """The stall a plan reports is the stall model applied to the blocks it chose (read
    time from each block's record bytes and its tier's speed), one queue or one per tier;
    the cost is its DUE, capacity and stall terms."""
    bl = blocks(n_layers, chunks)
    c = cfg(layer_us, parallel_reads=parallel, capacity_cost={"dram": dram_cost,
                                                               "nvme": 30.0})
    plan = Planner(c).plan(bl, [DRAM, NVME])
    speed = {"dram": DRAM, "nvme": NVME}
    read = np.array([speed[b.tier].latency_us + b.record_bytes / (speed[b.tier].read_gbps
                                                                  * 1e3)
                     for b in plan.blocks])
    tier = np.array([0 if b.tier == "dram" or not parallel else 1 for b in plan.blocks])
    want = stall_us(np.array([b.layer for b in bl]), np.array([b.chunk for b in bl]), tier,
                    read, 2 if parallel else 1, layer_us)
    assert plan.extra["stall_us"] == pytest.approx(want, rel=1e-9, abs=1e-9)
    # A DUE at chunk p recomputes chunks p .. n-1 at the default 100 us per token.
    held = sum(b.p_due * 100.0 * 256 * (chunks - b.chunk) for b in plan.blocks)
    cap = sum({"dram": dram_cost, "nvme": 30.0}[b.tier] * b.record_bytes / (1 << 30)
              for b in plan.blocks)
    assert plan.total_cost_us == pytest.approx(held + cap + want, rel=1e-9, abs=1e-9)


def test_a_warm_plan_respects_new_limits() -> None:
    """The same put shape planned again starts from its last plan, but not when that plan
    no longer fits: less free DRAM than it used gives a plan within the new space."""
    bl = blocks(6, 2)
    pl = Planner(cfg(5.0))
    first = pl.plan(bl, [DRAM, NVME])
    used = first.tier_bytes["dram"]
    assert used > 0
    small = replace(DRAM, free_bytes=used // 2)
    again = pl.plan(bl, [small, NVME])
    assert again.tier_bytes.get("dram", 0) <= used // 2
    assert again.extra["stall_us"] >= first.extra["stall_us"] - 1e-9
