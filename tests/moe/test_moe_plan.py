"""Per-expert placement: the planner (rkv.moe.expert_plans), the expert quality profile
(rkv.moe.profile) and the adapter's planned stores and re-placement (rkv.moe.plan)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from moe_adapter_helpers import assert_same, make_layers

from rkv.adapters.moe import RkvExperts
from rkv.errors import ConfigError, InputError
from rkv.moe.expert_plans import ExpertInput, plan_experts
from rkv.moe.profile import ExpertProfile, quantized
from rkv.moe.store import pack, read_manifest, tier_key
from rkv.placement import InfeasiblePlanError, TierInput
from rkv.quant import RowQuantizer
from rkv.store.config import TierConfig

N, D = 32, 64                   # neurons and d_model of the synthetic experts
CODES = ("none", "rs(255,239)", "rs(255,223)")


def profile(layers: int, experts: int, seed: int = 0) -> ExpertProfile:
    rng = np.random.default_rng(seed)
    share = rng.random((layers, experts, 2))
    share /= share.sum(axis=1, keepdims=True)
    layer_kl = np.stack([rng.random(layers) * 0.01, rng.random(layers) * 0.1], axis=1)
    return ExpertProfile("m", 2, "float16", (8, 4), layer_kl, share,
                         layer_kl.sum(axis=0) * 0.5, 2, 64)


def tier_inputs(fast_free: int, slow_free: int = 1 << 30) -> list[TierInput]:
    return [TierInput("fast", "dram-ddr4", fast_free, 20.0, 1.0),
            TierInput("slow", "raw-ber", slow_free, 2.0, 80.0)]    # BER 1e-6: needs a code


# -- the planner ---------------------------------------------------------------------------
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(loads=st.lists(st.floats(0.0, 5.0), min_size=2, max_size=6),
       fast=st.integers(0, 6), budget=st.floats(0.0, 0.1), seed=st.integers(0, 99))
def test_fast_planner_near_the_exact_optimum(loads: list[float], fast: int, budget: float,
                                              seed: int) -> None:
    experts = [ExpertInput(0, i, N, D, loads=x) for i, x in enumerate(loads)]
    rec = plan_experts(experts[:1], tier_inputs(1 << 30), {"codes": list(CODES)})
    size = rec.choices[0].record_bytes
    tiers = tier_inputs(fast * size)
    cfg = {"codes": list(CODES), "quality_budget_kl": budget}
    prof = profile(1, len(loads), seed)
    fast_plan = plan_experts(experts, tiers, cfg, prof)
    exact = plan_experts(experts, tiers, cfg, prof, exact=True)
    assert fast_plan.cost_us <= exact.cost_us * 1.05 + 1e-9
    for p in (fast_plan, exact):
        assert p.kl <= budget + 1e-12
        assert p.tier_bytes["fast"] <= fast * size
        assert sum(c.kl for c in p.choices) == pytest.approx(p.kl)
        assert all(c.p_due <= 1e-5 and c.p_sdc <= 1e-15 for c in p.choices)


def test_hot_experts_get_the_fast_tier() -> None:
    loads = [0.1, 3.0, 0.5, 2.0, 0.0, 1.0]
    experts = [ExpertInput(0, i, N, D, loads=x) for i, x in enumerate(loads)]
    one = plan_experts(experts[:1], tier_inputs(1 << 30), {"codes": ["rs(255,239)"],
                                                          "bits": [16]})
    size = one.choices[0].record_bytes
    plan = plan_experts(experts, tier_inputs(3 * size), {"codes": ["rs(255,239)"],
                                                         "bits": [16]})
    assert sorted(c.expert for c in plan.choices if c.tier == "fast") == [1, 3, 5]


def test_fewer_bits_only_with_a_profile_and_within_budget() -> None:
    experts = [ExpertInput(0, i, N, D, loads=1.0) for i in range(4)]
    tiny = tier_inputs(0, 1 << 30)
    plan = plan_experts(experts, tiny, {"codes": list(CODES)})
    assert {c.bits for c in plan.choices} == {16}
    prof = profile(1, 4)
    cheap = plan_experts(experts, tiny, {"codes": list(CODES), "quality_budget_kl": 1.0}, prof)
    assert {c.bits for c in cheap.choices} == {4}      # fewer bytes read, KL is free
    none = plan_experts(experts, tiny, {"codes": list(CODES), "quality_budget_kl": 0.0}, prof)
    assert {c.bits for c in none.choices} == {16}
    assert none.cost_us > cheap.cost_us
    fixed = plan_experts(experts, tiny, {"codes": list(CODES)}, None,
                         fixed_bits={(0, i): b for i, b in enumerate((16, 8, 4, 8))})
    assert [c.bits for c in fixed.choices] == [16, 8, 4, 8]


def test_infeasible_targets_name_their_constraint() -> None:
    experts = [ExpertInput(0, i, N, D, loads=1.0) for i in range(3)]
    with pytest.raises(InfeasiblePlanError) as e:
        plan_experts(experts, [TierInput("t", "dram-ddr4", 10, 1.0, 1.0)], {"codes": ["none"]})
    assert e.value.constraint == "capacity"
    with pytest.raises(InfeasiblePlanError) as e:
        plan_experts(experts, [TierInput("t", {"model": "raw-ber", "ber": 1e-3}, 1 << 30, 1.0,
                                         1.0)], {"codes": ["none"]})
    assert e.value.constraint == "max_p_due"
    with pytest.raises(ConfigError):
        plan_experts(experts + experts[:1], tier_inputs(1 << 20))
    with pytest.raises(ConfigError):
        ExpertInput(0, 0, N, D, loads=math.nan)
    with pytest.raises(ConfigError):
        plan_experts(experts, tier_inputs(1 << 20), {"bits": [4]})   # 4 bits needs a profile


# -- the profile ---------------------------------------------------------------------------
def test_profile_round_trip_and_uniform_total(tmp_path: Path) -> None:
    p = profile(3, 4)
    p.save(tmp_path / "p.json")
    q = ExpertProfile.load(tmp_path / "p.json")
    assert np.array_equal(q.table(), p.table())
    for bi, b in enumerate(p.bits):      # a uniform plan is predicted as measured
        total = sum(q.kl(li, e, b) for li in range(3) for e in range(4))
        assert total == pytest.approx(float(p.all_kl[bi]))
    assert q.kl(0, 0, 16) == 0.0
    with pytest.raises(ConfigError):
        q.kl(0, 9, 4)


@pytest.mark.parametrize("edit", [
    lambda d: d.pop("all_kl"),
    lambda d: d.update(extra=1),
    lambda d: d.update(bits=[8, 3]),
    lambda d: d["share"][0].__setitem__(0, [5.0, 5.0]),
    lambda d: d["layer_kl"][0].__setitem__(0, -1.0),
    lambda d: d.update(top_k=True),
    lambda d: d.update(format="other"),
])
def test_damaged_profiles_are_config_errors(tmp_path: Path, edit: Any) -> None:
    doc = profile(2, 3).to_dict()
    edit(doc)
    (tmp_path / "p.json").write_text(json.dumps(doc))
    with pytest.raises(ConfigError):
        ExpertProfile.load(tmp_path / "p.json")
    (tmp_path / "n.json").write_text(json.dumps(profile(2, 3).to_dict()).replace("0.", "NaN", 1))
    with pytest.raises(ConfigError):
        ExpertProfile.load(tmp_path / "n.json")


@pytest.mark.parametrize("bits", [16, 8, 4])
def test_quantized_is_what_the_store_returns(tmp_path: Path, bits: int) -> None:
    layers = make_layers(1, 2, N, D, np.float32)
    half = [[type(w)(*(a.astype(np.float16) for a in (w.gate, w.up, w.down)))
             for w in layers[0]]]
    with RkvExperts.create(tmp_path / "s", half, fingerprint="m", device_budget_bytes=0,
                           tiers=small_tiers(1 << 30), bits=bits) as rx:
        got = rx.experts(0, [0, 1])
    for e in range(2):
        want = quantized(layers[0][e], bits, "float16")
        for name in ("gate", "up", "down"):
            assert np.array_equal(getattr(got[e], name).astype(np.float32),
                                  getattr(want, name)), (bits, name)


# -- planned stores and re-placement ---------------------------------------------------------
def small_tiers(dram: int) -> tuple[TierConfig, ...]:
    return (TierConfig("dram", medium="memory", capacity_bytes=dram, read_gbps=20.0,
                       latency_us=1.0, fault_model="dram-ddr4"),
            TierConfig("nvme", medium="memory", capacity_bytes=1 << 30, read_gbps=2.0,
                       latency_us=80.0, fault_model="raw-ber"))     # BER 1e-6: needs a code


def test_planned_store_writes_the_plan(tmp_path: Path) -> None:
    layers = make_layers(2, 4, N, D)
    usage = {(0, 1): 3.0, (1, 2): 2.0}
    cfg = {"codes": list(CODES), "quality_budget_kl": 0.02, "max_p_due": 1e-2}
    size = pack(layers[0][0]).nbytes
    with RkvExperts.create(tmp_path / "s", layers, fingerprint="m", device_budget_bytes=0,
                           tiers=small_tiers(3 * size), usage=usage, placement=cfg,
                           profile=profile(2, 4)) as rx:
        body = read_manifest(tmp_path / "s")
        assert body["plan"]["kl"] <= 0.02 + 1e-12
        assert rx.info(0, 1).tier == "dram" and rx.info(1, 2).tier == "dram"
        for li in range(2):
            got = rx.experts(li, range(4))
            for e in range(4):
                info = rx.info(li, e)
                assert info.ecc in CODES
                assert_same(got[e], layers[li][e]) if info.bits == 16 else None
                if info.bits < 16:
                    q = RowQuantizer(info.bits)
                    block = pack(layers[li][e])
                    dec = q.decode(q.encode(block), block.shape, "float16")
                    assert np.array_equal(pack(got[e]), dec)
        nvme_code = {rx.info(li, e).ecc for li in range(2) for e in range(4)
                     if rx.info(li, e).tier == "nvme"}
        assert nvme_code and "none" not in nvme_code
    with RkvExperts.open(tmp_path / "s", device_budget_bytes=0) as again:
        assert again.info(0, 1).ecc == rx.info(0, 1).ecc


def test_replan_moves_what_misses_to_the_fast_tier(tmp_path: Path) -> None:
    layers = make_layers(1, 6, N, D)
    room = int(2.5 * pack(layers[0][0]).nbytes)     # two rs(255,239) records, not three
    cfg = {"codes": ["rs(255,239)"], "bits": [16], "max_p_due": 1e-2}
    with RkvExperts.create(tmp_path / "s", layers, fingerprint="m", device_budget_bytes=0,
                           tiers=small_tiers(room), placement=cfg,
                           usage={(0, 0): 5.0, (0, 1): 4.0}) as rx:
        assert {e for e in range(6) if rx.info(0, e).tier == "dram"} == {0, 1}
        with pytest.raises(InputError):
            rx.replan(cfg, min_steps=1)                # nothing observed yet
        for _ in range(5):
            rx.experts(0, [4, 5])
        rx.experts(0, [0])
        loads, steps = rx.usage()
        assert steps == 6 and loads[(0, 4)] == pytest.approx(5 / 6)
        report = rx.replan(cfg)
        assert report.promoted == 2 and report.demoted == 2 and report.unreadable == 0
        assert {e for e in range(6) if rx.info(0, e).tier == "dram"} == {4, 5}
        assert rx.tiers["dram"].records() == 2 and rx.tiers["nvme"].records() == 4
        got = rx.experts(0, range(6))
        for e in range(6):
            assert_same(got[e], layers[0][e])
    with RkvExperts.open(tmp_path / "s", device_budget_bytes=0) as again:
        assert again.info(0, 4).tier == "dram"
        assert_same(again.experts(0, [0])[0], layers[0][0])


def test_replan_can_change_bits_only_with_the_weights(tmp_path: Path) -> None:
    layers = make_layers(1, 3, N, D)
    prof = profile(1, 3)
    cfg = {"codes": ["rs(255,239)"], "quality_budget_kl": 1.0, "max_p_due": 1e-2}
    with RkvExperts.create(tmp_path / "s", layers, fingerprint="m", device_budget_bytes=0,
                           tiers=small_tiers(1 << 30), bits=16) as rx:
        rx.experts(0, [0, 1, 2])
        same = rx.replan(cfg, prof)
        assert same.rebitted == 0 and {rx.info(0, e).bits for e in range(3)} == {16}
        changed = rx.replan(cfg, prof, experts=layers)
        assert changed.rebitted == 3 and {rx.info(0, e).bits for e in range(3)} == {4}
        got = rx.experts(0, [0, 1, 2])
        q = RowQuantizer(4)
        for e in range(3):
            block = pack(layers[0][e])
            assert np.array_equal(pack(got[e]), q.decode(q.encode(block), block.shape,
                                                          "float16"))


def test_a_load_racing_a_replan_reads_the_moved_record(tmp_path: Path) -> None:
    """The window between a load taking an expert's info and reading its tier is held open:
    a replan moves the record inside it; the load retries with the new info."""
    layers = make_layers(1, 2, N, D)
    cfg = {"codes": ["rs(255,239)"], "bits": [16], "max_p_due": 1e-2}
    rx = RkvExperts.create(tmp_path / "s", layers, fingerprint="m", device_budget_bytes=0,
                           tiers=small_tiers(1 << 30), placement=cfg)
    try:
        rx.experts(0, [1])
        for _ in range(3):
            rx.experts(0, [1])
        old = rx.info(0, 0).tier
        assert old == "dram"
        inner = rx.tiers[old]
        fired: list[bool] = []

        class Hook:
            def __getattr__(self, name: str) -> Any:
                return getattr(inner, name)

            def reader(self) -> Any:
                if not fired:
                    fired.append(True)
                    # Storage in dram now costs more than reading an unused expert saves.
                    rx.replan({**cfg, "capacity_cost": {"dram": 1e9}})
                return inner.reader()

        rx.tiers[old] = Hook()  # type: ignore[assignment]
        got = rx.experts(0, [0])
        assert fired and rx.info(0, 0).tier == "nvme"
        assert_same(got[0], layers[0][0])
        assert inner.get(tier_key(rx.fingerprint, 0, 0)) is None     # the old copy is gone
    finally:
        rx.close()


def test_no_worse_than_placing_by_use() -> None:
    """16 bits only, experts of one size: tier room is all that is decided. Placing the most
    used first is optimal here; the planner must match it (its multipliers alone did not)."""
    rng = np.random.default_rng(3)
    loads = rng.gamma(2.0, 0.4, 40)
    experts = [ExpertInput(0, i, N, D, loads=float(x)) for i, x in enumerate(loads)]
    cfg = {"codes": ["none"], "bits": [16], "max_p_due": 1e-2}
    tiers = [TierInput("a", "dram-ddr4", 0, 20.0, 0.1), TierInput("b", "cxl", 0, 12.0, 0.25),
             TierInput("c", "nvme-tlc", 1 << 30, 6.5, 80.0)]
    size = plan_experts(experts[:1], tiers, cfg).choices[0].record_bytes
    tiers = [replace(t, free_bytes=f) for t, f in zip(tiers, (10 * size, 10 * size, 1 << 30),
                                                       strict=True)]
    plan = plan_experts(experts, tiers, cfg)
    order = np.argsort(-loads, kind="stable")
    want = {int(i): "a" if r < 10 else "b" if r < 20 else "c" for r, i in enumerate(order)}
    by_use = sum(plan_experts([experts[i]], [t for t in tiers if t.name == want[i]], cfg)
                 .cost_us for i in range(40))
    assert plan.cost_us <= by_use * (1 + 1e-9)


def test_shipped_expert_profile_loads() -> None:
    """The shipped E = 8, k = 6 profile is valid, and kept out of the KV profiles' folder."""
    from rkv.moe.profile import shipped_path

    p = ExpertProfile.load(shipped_path(8, 6))
    assert (p.layers, p.experts, p.top_k, p.bits) == (30, 8, 6, (8, 4))
    assert 0 < p.all_kl[0] < p.all_kl[1]          # 4 bits costs more than 8
    assert shipped_path(8, 6).parent.name == "moe"
