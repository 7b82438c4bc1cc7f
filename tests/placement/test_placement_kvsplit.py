"""K and V at different widths: the planner offers (key bits, value bits) pairs to blocks
holding both, prices them with the profile's K and V entries, stays within 5 % of the exact
oracle on the enlarged option space, and the engine writes, labels, counts, reads and demotes
such blocks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rkvtest import random_kv

from rkv import ConfigError, Engine, EngineConfig, ModelSpec, TierConfig
from rkv.codec.stages import header_stages, quantizer_for
from rkv.format.keys import as_token_array, block_key, chunk_keys
from rkv.format.record import decode_record
from rkv.placement import BlockInput, PlacementConfig, Planner, TierInput
from rkv.placement.options import data_bytes
from rkv.store.indexlabels import label_parts, pipe_label

SPEC = ModelSpec("test/kvsplit", n_layers=4, n_kv_heads=2, head_dim=16, dtype="float16")
TIER = TierInput("dram", "raw-ber", 1 << 40, read_gbps=20.0, latency_us=0.1)


def kl_table(k: float = 0.02, v: float = 0.001, layers: int = 4) -> dict[str, float]:
    """Keys costly, values cheap (what the KV quantization literature reports)."""
    scale = {8: 0.05, 4: 1.0, 2: 6.0}
    return {f"{layer}:{kind}:{bits}": (k if kind == "k" else v) * scale[bits]
            for layer in range(layers) for kind in "kv" for bits in (8, 4, 2)}


def blocks(n_layers: int = 4, chunks: int = 2) -> list[BlockInput]:
    return [BlockInput(layer, "kv", c, 32, 24.0, 1.0, 2, 16, "float16", chunks)
            for c in range(chunks) for layer in range(n_layers)]


def test_widths_in_effect_and_validation() -> None:
    cfg = PlacementConfig(bits=(16, 8, 4, 2))
    assert cfg.widths[:4] == ((16, 16), (8, 8), (4, 4), (2, 2))
    assert set(cfg.split_widths) == {(8, 4), (4, 8), (4, 2), (2, 4)}
    assert PlacementConfig(bits=(16, 4), kv_bits=()).widths == ((16, 16), (4, 4))
    assert PlacementConfig.from_dict({"bits": [], "kv_bits": [[4, 2]]}).widths == ((4, 2),)
    for bad in ([[4, 4]], [[16, 4]], [[4, 2], [4, 2]], "4+2", [[4]], [[4, 3]]):
        with pytest.raises(ConfigError, match="kv_bits"):
            PlacementConfig.from_dict({"kv_bits": bad})
    with pytest.raises(ConfigError, match="no width"):
        PlacementConfig.from_dict({"bits": [], "kv_bits": []})
    rt = PlacementConfig(kv_bits=((4, 2),))
    assert PlacementConfig.from_dict(rt.to_dict()) == rt


def test_split_width_bytes_come_from_the_quantizer() -> None:
    b = blocks()[0]
    q = quantizer_for("kivi(bits=4,vbits=2)")
    assert q is not None
    assert data_bytes(b, (4, 2)) == q.encoded_size((2, 32, 2, 16), "float16")
    assert data_bytes(b, (4, 4)) > data_bytes(b, (4, 2)) > data_bytes(b, (2, 2))


def test_a_budget_goes_to_the_keys() -> None:
    """Keys cost 20x values: at a budget between uniform 4 and uniform 2 the plan keeps the
    keys at no fewer bits than the values (and some at more), and its KL is the profile's K
    plus V entries."""
    prof = kl_table()
    cfg = {"max_p_due": 1.0, "bits": [16, 8, 4, 2], "codes": ["none"],
           "quality_budget_kl": 0.2, "capacity_cost": {"dram": 1e6}}
    plan = Planner(cfg, prof).plan(blocks(), [TIER])
    widths = {b.width for b in plan.blocks}
    assert all(k >= v for k, v in widths) and any(k > v for k, v in widths), widths
    want = sum(prof[f"{b.layer}:k:{b.bits}"] + prof[f"{b.layer}:v:{b.vbits}"]
               for b in plan.blocks)
    assert plan.kl == pytest.approx(want) and plan.kl <= 0.2
    assert "+" in plan.table()
    # Without split widths the same budget buys less: every block at one width for both.
    same = Planner({**cfg, "kv_bits": []}, prof).plan(blocks(), [TIER])
    assert all(b.bits == b.vbits for b in same.blocks)
    assert plan.total_cost_us < same.total_cost_us


def test_k_and_v_blocks_take_equal_widths_only() -> None:
    prof = kl_table()
    kb = [BlockInput(0, kind, 0, 32, 24.0, 1.0, 2, 16) for kind in ("k", "v")]
    plan = Planner({"max_p_due": 1.0, "codes": ["none"], "bits": [16, 4, 2],
                    "quality_budget_kl": 1.0, "capacity_cost": {"dram": 1e6}},
                   prof).plan(kb, [TIER])
    assert all(b.bits == b.vbits for b in plan.blocks)


@settings(max_examples=25, deadline=None)
@given(budget=st.floats(0.005, 0.3), kscale=st.floats(0.001, 0.05),
       vscale=st.floats(0.001, 0.05), cap=st.floats(0.0, 1e6), n=st.integers(2, 6))
def test_within_5_percent_of_the_oracle(budget: float, kscale: float, vscale: float,
                                        cap: float, n: int) -> None:
    prof = kl_table(kscale, vscale)
    cfg = {"max_p_due": 1.0, "bits": [16, 8, 4, 2], "codes": ["none", "rs(255,247)"],
           "kv_bits": [[8, 4], [4, 8], [4, 2], [2, 4], [8, 2], [2, 8]],
           "quality_budget_kl": budget, "capacity_cost": {"dram": cap}}
    bl = blocks(n_layers=n, chunks=1)
    p = Planner(cfg, prof)
    try:
        exact = p.plan_exact(bl, [TIER])
    except ConfigError:
        with pytest.raises(ConfigError):
            Planner(cfg, prof).plan(bl, [TIER])
        return
    fast = Planner(cfg, prof).plan(bl, [TIER])
    assert fast.kl <= budget * (1 + 1e-9)
    assert fast.total_cost_us <= exact.total_cost_us * 1.05 + 1e-9


def test_labels_of_split_widths() -> None:
    assert pipe_label((4, 2), "none") == "4+2/none"
    assert pipe_label(4, "none") == "4/none"
    assert label_parts("4+2/rs(n=255,k=239,interleave=1)") == ((4, 2),
                                                               "rs(n=255,k=239,interleave=1)")
    assert label_parts("16/none") == ((16, 16), "none")


def _engine_config(tmp_path: Path, lossy: bool = False, dram: int = 1 << 30) -> EngineConfig:
    prof = tmp_path / "profile.json"
    prof.write_text(json.dumps({"model": "test", "kl": kl_table()}))
    tiers = (TierConfig("dram", medium="memory", path="t/dram", capacity_bytes=dram,
                        fault_model="raw-ber"),
             TierConfig("nvme", medium="disk", path="t/nvme", capacity_bytes=1 << 30,
                        fault_model="nvme-tlc"))
    return EngineConfig(chunk_tokens=16, tiers=tiers, promote="never", placement={
        "max_p_due": 1e-6, "bits": [16, 8, 4, 2], "codes": ["none", "rs(255,247)"],
        "quality_budget_kl": 0.2, "profile": str(prof), "capacity_cost": {"dram": 1e6},
        "lossy_demotion": lossy})


def _stored(e: Engine, tokens: list[int]) -> list[tuple[str, tuple[int, int], str]]:
    out = []
    for key in chunk_keys(as_token_array(tokens), SPEC.fingerprint(), 16):
        with e.core.index.env.read() as txn:
            meta = e.core.index.get_chunk(txn, key)
        assert meta is not None
        for layer, (tier, _) in enumerate(meta.blocks):
            rec = e.tiers[tier].get(block_key(key, layer))
            assert rec is not None
            quant, codec = header_stages(decode_record(rec).header)
            width = (16, 16) if quant is None else quant.widths
            code = "none" if codec is None else codec.spec
            assert meta.pipe(layer) == pipe_label(width, code)     # index agrees with record
            out.append((tier, width, code))
    return out


def test_engine_writes_reads_and_counts_split_blocks(tmp_path: Path) -> None:
    tokens = list(range(32))
    kv = random_kv(SPEC, 32)
    with Engine.open(tmp_path / "s", _engine_config(tmp_path)) as e:
        e.put(tokens, kv, model=SPEC)
        got = e.get(tokens, model=SPEC)
        assert got.ok
        stored = _stored(e, tokens)
        assert any(w[0] != w[1] for _, w, _ in stored)
        # Every layer reads back as its quantizer's exact round trip, K and V each at its own
        # width.
        for i, (_, w, _) in enumerate(stored):
            chunk, layer = divmod(i, SPEC.n_layers)
            block = np.ascontiguousarray(kv[layer][:, 16 * chunk:16 * (chunk + 1)])
            q = quantizer_for(f"kivi(bits={w[0]},vbits={w[1]})") if w[0] < 16 else None
            want = block if q is None else q.decode(q.encode(block), block.shape, "float16")
            assert np.array_equal(got.kv[layer][:, 16 * chunk:16 * (chunk + 1)], want)
        mix = e.stats()["tiers"]["dram"]["mix"]
        split = [r for k, r in mix.items() if "+" in k.split("-bit")[0]]
        assert split and all(r["bits"] > r["vbits"] for r in split)
        assert sum(r["blocks"] for r in mix.values()) == len(stored)


def test_demotion_keeps_split_widths(tmp_path: Path) -> None:
    first = list(range(16))
    kv = random_kv(SPEC, 16)
    with Engine.open(tmp_path / "s", _engine_config(tmp_path, dram=12_000)) as e:
        e.put(first, kv, model=SPEC)
        before = [w for _, w, _ in _stored(e, first)]
        for i in range(1, 4):
            e.put(list(range(100 * i, 100 * i + 16)), random_kv(SPEC, 16, seed=i), model=SPEC)
        after = _stored(e, first)
        assert {t for t, _, _ in after} == {"nvme"}
        assert [w for _, w, _ in after] == before
        assert e.get(first, model=SPEC).ok
