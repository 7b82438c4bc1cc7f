"""Placement plans with the residency and reuse the engine learned (policies.estimate), or the
config's with ``estimate = false``."""

from __future__ import annotations

from pathlib import Path

import pytest
from rkvtest import random_kv

from policies import Item, Reason
from rkv import ConfigError, Engine, EngineConfig, ModelSpec, TierConfig
from rkv.placement import PlacementConfig, TierInput
from rkv.store.plans import EnginePlacement, snap_hours, snap_reuse

SPEC = ModelSpec("test/estimated", n_layers=4, n_kv_heads=2, head_dim=16, dtype="float16")
CODES = ["none", "rs(255,247)", "rs(255,223)"]
#: Bit flips per bit-hour: a 2 KiB block sees about 1.6e-7 x hours of them.
PER_HOUR = {"model": "raw-ber", "ber": 1e-11, "per_hour": True}


def tiers(caps: tuple[int, int] = (1 << 30, 1 << 30)) -> tuple[TierConfig, ...]:
    return (TierConfig("dram", medium="memory", path="t/dram", capacity_bytes=caps[0],
                       fault_model="raw-ber"),
            TierConfig("nvme", medium="disk", path="t/nvme", capacity_bytes=caps[1],
                       fault_model="nvme-tlc"))


def teach(p: EnginePlacement, *streams: tuple[str, int, int, float]) -> None:
    """Per stream (tier, depth, reads, seconds): chunks at ``depth`` in ``tier``, 8 per stay,
    each read ``reads`` times and evicted ``seconds`` after its insert; the streams run
    together for 50 of the longest stays and the estimator is asked in the steady state."""
    est = p.estimator
    assert est is not None
    span = 50 * max(s[3] for s in streams)
    events = []
    for tier, depth, reads, seconds in streams:
        every = seconds / 8
        for i in range(int(span / every)):
            key, t = (tier, depth, i), i * every
            events.append((t, 0, key, depth, "insert"))
            events += [(t + seconds * (r + 1) / (reads + 1), 1, key, depth, "hit")
                       for r in range(reads)]
            events.append((t + seconds, 2, key, depth, "evict"))
    for t, _, key, depth, kind in sorted(events):
        if t > span - max(s[3] for s in streams):
            break
        if kind == "insert":
            est.on_insert(Item(key, tier=key[0], depth=depth), t)
        elif kind == "hit":
            est.on_access(key, True, t)
        else:
            est.on_remove(key, Reason.EVICTED, t)


def placement(**kw: object) -> EnginePlacement:
    """An engine's placement whose dram flips bits at a rate per hour (a tier config names
    a preset; the planner takes any model)."""
    p = EnginePlacement(PlacementConfig.from_dict({"max_p_due": 1e-6, "bits": [16],
                                                   "codes": CODES, **kw}), tiers())
    t = p.tiers["dram"]
    p._tier_inputs["dram"] = TierInput("dram", PER_HOUR, 1 << 62, t.read_gbps, t.latency_us)
    return p


def test_config_switch() -> None:
    assert PlacementConfig().estimate is True
    cfg = PlacementConfig.from_dict({"estimate": False})
    assert cfg.estimate is False and PlacementConfig.from_dict(cfg.to_dict()) == cfg
    assert PlacementConfig.from_toml("[placement]\nestimate = false\n").estimate is False
    for bad in ("yes", 1, None):
        with pytest.raises(ConfigError, match="estimate"):
            PlacementConfig.from_dict({"estimate": bad})
    with pytest.raises(ConfigError, match="estimate"):
        EngineConfig(placement={"estimate": "no"})


def test_snapping() -> None:
    assert snap_hours(22.0, None) == 16.0 and snap_hours(24.0, None) == 32.0
    assert snap_hours(20.0, 32.0) == 32.0          # within the hysteresis: kept
    assert snap_hours(17.0, 32.0) == 16.0          # far enough: moves
    assert snap_hours(0.0, None) == 2.0 ** -12 and snap_hours(1e9, None) == 2.0 ** 17
    assert snap_reuse(2.137, None) == 2.1 and snap_reuse(2.18, 2.1) == 2.1
    assert snap_reuse(2.4, 2.1) == 2.4 and snap_reuse(0.004, None) == 0.0
    assert snap_reuse(0.537, None) == 0.54 and snap_reuse(137.0, None) == 140.0


def test_blocks_carry_the_estimate_per_tier_and_depth() -> None:
    p = placement()
    cfg = p.cfg
    # Nothing learned yet: the config's values.
    assert {(b.residency_hours, b.reuse) for b in p.blocks(SPEC, [16] * 3, 3, "dram")} == {
        (cfg.residency_hours, cfg.reuse)}
    teach(p, ("dram", 0, 3, 2 * 3600), ("dram", 1, 1, 1800))
    blocks = p.blocks(SPEC, [16] * 3, 3, "dram")
    by_chunk = {b.chunk: (b.residency_hours, b.reuse) for b in blocks}
    assert by_chunk[0] == (2.0, 3.0)
    assert by_chunk[1] == (0.5, 1.0)
    assert by_chunk[2] == (cfg.residency_hours, cfg.reuse)     # depth 2-3: not learned
    # Another tier, or no tier: the config's values.
    assert {b.reuse for b in p.blocks(SPEC, [16] * 3, 3, "nvme")} == {cfg.reuse}
    assert {b.reuse for b in p.blocks(SPEC, [16] * 3, 3)} == {cfg.reuse}
    got = p.estimates()
    assert got["on"] and got["config"] == [cfg.residency_hours, cfg.reuse]
    assert got["dram"]["0"]["planned"] == [2.0, 3.0]
    assert got["dram"]["0"]["reuse"] == pytest.approx(3.0, rel=0.02)
    assert got["dram"]["0"]["residency_s"] == pytest.approx(7200.0, rel=0.02)
    assert got["dram"]["1"]["planned"] == [0.5, 1.0]


def test_estimate_false_pins_the_config() -> None:
    p = placement(estimate=False, residency_hours=5.0, reuse=2.5)
    assert p.estimator is None
    assert {(b.residency_hours, b.reuse) for b in p.blocks(SPEC, [16] * 2, 2, "dram")} == {
        (5.0, 2.5)}
    assert p.estimates() == {"on": False, "config": [5.0, 2.5]}


def code_of(p: EnginePlacement, tier: str = "dram") -> str:
    codec = p.put_plan(SPEC, [16], 1, tier)[0][0].codec
    return "none" if codec is None else codec.spec


def test_a_longer_residency_plans_a_stronger_code() -> None:
    """Flips accumulate per hour in dram: stays of an hour need no parity for max_p_due =
    1e-6 (P(DUE) about 1.6e-7), stays of 40 days (planned as 1024 h) do (1.7e-4 without
    it); the config's 24 h (3.9e-6) needs it too."""
    short, long_ = placement(), placement()
    teach(short, ("dram", 0, 1, 3600))
    teach(long_, ("dram", 0, 1, 40 * 24 * 3600))
    assert short.blocks(SPEC, [16], 1, "dram")[0].residency_hours == 1.0
    assert long_.blocks(SPEC, [16], 1, "dram")[0].residency_hours == 1024.0
    assert code_of(short) == "none"
    assert code_of(long_).startswith("rs(")
    assert code_of(placement()).startswith("rs(")
    # A demotion into dram is re-planned with the same expectations.
    for p, want in ((short, "none"), (long_, "rs(")):
        codec = p.demotion_code(SPEC, 0, 16, 0, 16, "dram").codec
        assert ("none" if codec is None else codec.spec).startswith(want)


def test_engine_feeds_the_estimator(tmp_path: Path) -> None:
    """One-chunk prompts read twice each through a dram tier that holds four of them: the
    demotions teach the estimator 2 reads per stay in dram at depth 0, which the next put's
    blocks carry and stats() shows; with ``estimate = false`` nothing is learned."""
    kv = random_kv(SPEC, 16)
    for on in (True, False):
        cfg = EngineConfig(chunk_tokens=16, tiers=tiers(caps=(4 * 9700, 1 << 30)),
                           placement={"max_p_due": 0.5, "bits": [16], "codes": ["none"],
                                      "estimate": on})
        with Engine.open(tmp_path / f"s{on}", cfg) as e:
            for i in range(44):
                prompt = list(range(100 * i, 100 * i + 16))
                e.put(prompt, kv, model=SPEC)
                for _ in range(2):
                    assert e.get(prompt, model=SPEC).ok
            p = e.core.placement
            assert p is not None
            got = e.stats()["session"]["estimates"]
            if not on:
                assert got == {"on": False, "config": [24.0, 1.0]}
                assert e.core.decisions.estimator is None
                continue
            est = p.estimator
            assert est is not None and e.core.decisions.estimator is est
            d = est.estimate("dram", 0)
            assert d is not None and d.weight >= 32
            # Filling bias: every read so far (of the 44 chunks) over 40 departures.
            assert 2.0 <= d.reuse <= 2.0 * 44 / 40 + 0.01
            row = got["dram"]["0"]
            assert row["reuse"] == pytest.approx(d.reuse)
            assert row["planned"][1] == pytest.approx(d.reuse, rel=0.06)   # snapped
            reuse = {b.reuse for b in p.blocks(SPEC, [16], 1, "dram")}
            assert reuse == {p.estimates()["dram"]["0"]["planned"][1]}
            assert got["nvme"]["0"]["reuse"] is None        # nothing left nvme yet
