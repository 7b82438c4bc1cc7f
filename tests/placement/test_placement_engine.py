"""Placement inside the engine: blocks are written as planned, read back verified, re-planned
on demotion; an unmeetable target fails the put with the constraint named."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from rkvtest import random_kv

from rkv import ConfigError, Engine, EngineConfig, ModelSpec, TierConfig
from rkv.codec.stages import header_stages
from rkv.format.keys import as_token_array, block_key, chunk_keys
from rkv.format.record import decode_record
from rkv.placement import InfeasiblePlanError

SPEC = ModelSpec("test/placed", n_layers=4, n_kv_heads=2, head_dim=16, dtype="float16")
CODES = ["none", "rs(255,247)", "rs(255,223)"]


def config(root: Path, placement: dict[str, object], caps: tuple[int, int] = (1 << 30,
                                                                             1 << 30),
           promote: str = "after(n=2)") -> EngineConfig:
    tiers = (TierConfig("dram", medium="memory", path="t/dram", capacity_bytes=caps[0],
                        fault_model="raw-ber"),
             TierConfig("nvme", medium="disk", path="t/nvme", capacity_bytes=caps[1],
                        fault_model="nvme-tlc"))
    return EngineConfig(chunk_tokens=16, tiers=tiers, placement=placement, promote=promote)


def records(e: Engine, tokens: list[int]) -> list[tuple[str, str, int]]:
    """(tier, code, bits) of every block of the stored prefix, read from the records."""
    out = []
    keys = chunk_keys(as_token_array(tokens), SPEC.fingerprint(), 16)
    got = e.get(tokens, model=SPEC)
    for st in got.blocks:
        rec = e.tiers[st.tier].get(block_key(keys[st.chunk], st.layer))
        assert rec is not None
        quant, codec = header_stages(decode_record(rec).header)
        out.append((st.tier, "none" if codec is None else codec.spec,
                    16 if quant is None else quant.bits))
    return out


def test_blocks_are_written_as_planned(tmp_path: Path) -> None:
    """BER 1e-6 on 2 KiB blocks: the checksum alone loses 1.6 % of blocks a day, RS(255,247)
    about 5e-12; with max_p_due = 1e-6 every block gets the cheapest code that meets it."""
    cfg = config(tmp_path, {"max_p_due": 1e-6, "bits": [16], "codes": CODES})
    tokens = list(range(48))
    kv = random_kv(SPEC, 48)
    with Engine.open(tmp_path / "s", cfg) as e:
        e.put(tokens, kv, model=SPEC)
        got = e.get(tokens, model=SPEC)
        assert got.ok and np.array_equal(got.kv, kv)
        assert {r for r in records(e, tokens)} == {("dram", "rs(n=255,k=247,interleave=1)",
                                                    16)}
    # A loose target and a free recompute: the checksum alone is the cheapest (the expected
    # recompute no longer pays for parity bytes).
    loose = config(tmp_path, {"max_p_due": 0.5, "bits": [16], "codes": CODES,
                              "recompute_us_per_chunk": 0.0})
    with Engine.open(tmp_path / "s2", loose) as e:
        e.put(tokens, kv, model=SPEC)
        assert {r[1] for r in records(e, tokens)} == {"none"}


def test_quality_budget_mixes_bit_widths(tmp_path: Path) -> None:
    """A profile where deeper layers tolerate fewer bits: the planner spends the KL budget
    there, and every block reads back as the quantizer's exact round trip."""
    kl = {f"{layer}:{kind}:{bits}": (0.001 if layer >= 2 else 0.05) * (16 / bits)
          for layer in range(4) for kind in "kv" for bits in (8, 4, 2)}
    prof = tmp_path / "profile.json"
    prof.write_text(json.dumps({"model": "test", "kl": kl}))
    cfg = config(tmp_path, {"max_p_due": 0.5, "bits": [16, 4], "codes": ["none"],
                            "quality_budget_kl": 0.05, "profile": str(prof),
                            "capacity_cost": {"dram": 1e6}})
    tokens = list(range(32))
    kv = random_kv(SPEC, 32)
    with Engine.open(tmp_path / "s", cfg) as e:
        e.put(tokens, kv, model=SPEC)
        got = e.get(tokens, model=SPEC)
        assert got.ok and all(b.status == "ok" for b in got.blocks)
        by_layer = {(st.layer, r[2]) for st, r in zip(got.blocks, records(e, tokens),
                                                       strict=True)}
    assert {bits for layer, bits in by_layer if layer >= 2} == {4}
    assert {bits for layer, bits in by_layer if layer < 2} == {16}
    # 16-bit layers come back exact; 4-bit layers close to the input.
    assert np.array_equal(got.kv[:2], kv[:2])
    assert float(np.abs(got.kv[2:].astype(np.float32) - kv[2:]).max()) < 1.0


def test_unmeetable_target_fails_the_put_and_names_it(tmp_path: Path) -> None:
    cfg = config(tmp_path, {"max_p_due": 1e-30, "bits": [16], "codes": CODES})
    with Engine.open(tmp_path / "s", cfg) as e:
        with pytest.raises(InfeasiblePlanError, match="max_p_due") as info:
            e.put(list(range(16)), random_kv(SPEC, 16), model=SPEC)
        assert isinstance(info.value, ConfigError)
        assert e.lookup(list(range(16)), model=SPEC) == 0       # nothing half-written
        assert e.stats()["chunks"] == 0


def test_demotion_replans_the_code_for_the_new_tier(tmp_path: Path) -> None:
    """dram (raw BER) needs RS for max_p_due = 1e-6; in nvme (its device ECC under the
    preset) the checksum alone meets it, so demoted blocks are re-encoded without RS."""
    # No promotion on reads: a background move back to dram would race the record checks.
    cfg = config(tmp_path, {"max_p_due": 1e-6, "bits": [16], "codes": CODES},
                 caps=(20_000, 1 << 30), promote="never")
    first = list(range(16))
    kv = random_kv(SPEC, 16)
    with Engine.open(tmp_path / "s", cfg) as e:
        e.put(first, kv, model=SPEC)
        for i in range(1, 4):
            e.put(list(range(100 * i, 100 * i + 16)), random_kv(SPEC, 16, seed=i), model=SPEC)
        got = e.get(first, model=SPEC)
        assert got.ok and np.array_equal(got.kv, kv)
        assert {r[:2] for r in records(e, first)} == {("nvme", "none")}


def test_placement_table_is_validated() -> None:
    with pytest.raises(ConfigError, match="placement"):
        EngineConfig(placement={"max_p_due": 2.0})
    with pytest.raises(ConfigError, match="placement"):
        EngineConfig(placement={"bogus": 1})
    assert replace(EngineConfig(), placement={}).placement == {}


def test_rkv_plan_explains_a_put(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rkv.cli import main

    cfg = tmp_path / "engine.toml"
    cfg.write_text('chunk_tokens = 256\n[[tiers]]\nname = "dram"\nmedium = "memory"\n'
                   'fault_model = "raw-ber"\n[placement]\nmax_p_due = 1e-9\n'
                   'bits = [16, 4]\ncodes = ["none", "rs(255,247)"]\n'
                   'quality_budget_kl = 0.01\n')
    out = tmp_path / "plan.json"
    assert main(["plan", "--config", str(cfg), "--tokens", "300", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "2 chunk(s)" in text and "binding" in text and "SmolLM2" in text
    plan = json.loads(out.read_text())
    assert len(plan["blocks"]) == 60 and plan["kl"] <= 0.01
    assert {b["code"] for b in plan["blocks"]} == {"rs(255,247)"}    # 1e-9 needs the code
    assert main(["plan", "--model", str(tmp_path / "missing.json")]) == 2


def test_a_put_may_set_its_own_targets(tmp_path: Path) -> None:
    """max_p_due per put: a loose store target plans the bare checksum, a put that asks for
    1e-6 gets the code that meets it; what a put may not set, or a bad value, is refused
    before anything is written, as is a target for a store without [placement]."""
    cfg = config(tmp_path, {"max_p_due": 0.5, "bits": [16], "codes": CODES,
                            "recompute_us_per_chunk": 0.0})
    first, second = list(range(48)), list(range(100, 148))
    with Engine.open(tmp_path / "s", cfg) as e:
        e.put(first, random_kv(SPEC, 48), model=SPEC)
        e.put(second, random_kv(SPEC, 48, 1), model=SPEC, placement={"max_p_due": 1e-6})
        assert {r[1] for r in records(e, first)} == {"none"}
        assert {r[1] for r in records(e, second)} == {"rs(n=255,k=247,interleave=1)"}
        before = e.stats()["tokens"]
        for bad, match in (({"lossy_demotion": True}, "cannot be set per put"),
                           ({"max_p_due": 2.0}, "max_p_due"),
                           ({"codes": ["rs(255,300)"]}, "rs"),
                           ([1, 2], "must be a table")):
            with pytest.raises(ConfigError, match=match):
                e.put(list(range(500, 516)), random_kv(SPEC, 16), model=SPEC,
                      placement=bad)  # type: ignore[arg-type]
        assert e.stats()["tokens"] == before
    plain = replace(cfg, placement={})
    with Engine.open(tmp_path / "p", plain) as e, \
            pytest.raises(ConfigError, match="no \\[placement\\] table"):
        e.put(first, random_kv(SPEC, 48), model=SPEC, placement={"max_p_due": 1e-6})
