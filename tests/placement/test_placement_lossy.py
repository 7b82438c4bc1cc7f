"""Lossy demotion: with ``lossy_demotion = true`` a demoted block may be re-quantized to fewer
bits when the re-plan for the destination tier picks it and every stored sequence through
its chunk stays within ``quality_budget_kl``; never otherwise, never on promotion."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from rkvtest import random_kv

from rkv import Engine, EngineConfig, ModelSpec, TierConfig
from rkv.codec.stages import header_stages, quantizer_for
from rkv.format.keys import as_token_array, block_key, chunk_keys
from rkv.format.record import decode_record
from rkv.profiles import QualityProfile
from rkv.store.demotion import worst_path_kl

SPEC = ModelSpec("test/lossy", n_layers=4, n_kv_heads=2, head_dim=16, dtype="float16")
KL4 = 0.01        # per K or V of every layer at 4 bits: 0.02 a block, 0.08 a chunk
FIRST = list(range(16))


def profile(tmp_path: Path) -> str:
    kl = {f"{layer}:{kind}:{bits}": {8: KL4 / 2, 4: KL4, 2: 4 * KL4}[bits]
          for layer in range(4) for kind in "kv" for bits in (8, 4, 2)}
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"model": "test", "kl": kl}))
    return str(path)


def config(tmp_path: Path, budget: float, lossy: bool, dram: int = 12_000) -> EngineConfig:
    tiers = (TierConfig("dram", medium="memory", path="t/dram", capacity_bytes=dram,
                        fault_model="raw-ber"),
             TierConfig("nvme", medium="disk", path="t/nvme", capacity_bytes=1 << 30,
                        fault_model="nvme-tlc"))
    return EngineConfig(chunk_tokens=16, tiers=tiers, placement={
        "max_p_due": 1e-6, "bits": [16, 4], "codes": ["none", "rs(255,247)"],
        "quality_budget_kl": budget, "profile": profile(tmp_path), "lossy_demotion": lossy})


def blocks(e: Engine, tokens: list[int]) -> list[tuple[str, int, str]]:
    """(tier, bits, code) of every block of ``tokens``' chunks, from the records."""
    out = []
    for key in chunk_keys(as_token_array(tokens), SPEC.fingerprint(), 16):
        with e.core.index.env.read() as txn:
            meta = e.core.index.get_chunk(txn, key)
        assert meta is not None
        for layer, (tier, size) in enumerate(meta.blocks):
            rec = e.tiers[tier].get(block_key(key, layer))
            assert rec is not None and len(rec) == size
            header = decode_record(rec).header
            assert header.written_ns is not None                # stamped at every write
            assert meta.written_at(layer) == header.written_ns  # the index's copy agrees
            quant, codec = header_stages(header)
            bits = 16 if quant is None else quant.bits
            code = "none" if codec is None else codec.spec
            assert meta.pipe(layer) == f"{bits}/{code}"     # the index label agrees
            out.append((tier, bits, code))
    return out


def store_then_demote(tmp_path: Path, budget: float, lossy: bool,
                      tokens: list[int] = FIRST) -> tuple[Engine, np.ndarray]:
    """``tokens`` stored at 16 bits (a zero budget), then the store reopened with ``budget``
    and ``lossy``; new puts push ``tokens`` down to nvme. Returns the open engine."""
    kv = random_kv(SPEC, len(tokens))
    with Engine.open(tmp_path / "s", config(tmp_path, 0.0, lossy)) as e:
        e.put(tokens, kv, model=SPEC)
        assert {b[1] for b in blocks(e, tokens)} == {16}
    e = Engine.open(tmp_path / "s", config(tmp_path, budget, lossy,
                                           dram=12_000 * max(1, len(tokens) // 16)))
    for i in range(1, 4):
        e.put(list(range(1000 * i, 1000 * i + 16)), random_kv(SPEC, 16, seed=i), model=SPEC)
    assert {b[0] for b in blocks(e, tokens)} == {"nvme"}, "the test needs a demotion"
    return e, kv


def roundtrip4(values: np.ndarray) -> np.ndarray:
    q = quantizer_for("kivi(bits=4)")
    assert q is not None
    out: Any = q.decode(q.encode(np.ascontiguousarray(values)), values.shape, "float16")
    return np.asarray(out)


def test_without_lossy_demotion_bits_never_change(tmp_path: Path) -> None:
    e, kv = store_then_demote(tmp_path, budget=1.0, lossy=False)
    with e:
        assert {b[1] for b in blocks(e, FIRST)} == {16}
        got = e.get(FIRST, model=SPEC)
        assert got.ok and np.array_equal(got.kv, kv)
        assert e.stats()["session"]["lossy_demotions"] == 0


def test_lossy_demotion_requantizes_within_the_budget(tmp_path: Path) -> None:
    e, kv = store_then_demote(tmp_path, budget=1.0, lossy=True)
    with e:
        placed = blocks(e, FIRST)
        assert {b[1] for b in placed} == {4}
        assert {b[2] for b in placed} == {"none"}       # nvme's device ECC: no parity needed
        got = e.get(FIRST, model=SPEC)
        assert got.ok and all(b.status == "ok" for b in got.blocks)
        # Exactly the quantizer's round trip of the verified 16-bit values.
        for layer in range(SPEC.n_layers):
            assert np.array_equal(got.kv[layer], roundtrip4(kv[layer]))
        assert e.stats()["session"]["lossy_demotions"] == 4
        mix = e.stats()["tiers"]["nvme"]["mix"]
        assert mix["4-bit + none"]["blocks"] >= 4
        # Read promotion (after(n=2): this second read) moves it back up with its 4 bits,
        # the code re-planned for dram; never re-quantized on the way up.
        e.get(FIRST, model=SPEC)
        e.settle()
        assert {b[:2] for b in blocks(e, FIRST)} == {("dram", 4)}
        assert np.array_equal(e.get(FIRST, model=SPEC).kv, got.kv)


def test_a_budget_that_does_not_allow_it_keeps_the_bits(tmp_path: Path) -> None:
    e, kv = store_then_demote(tmp_path, budget=KL4, lossy=True)   # < 0.02 a block
    with e:
        assert {b[1] for b in blocks(e, FIRST)} == {16}
        got = e.get(FIRST, model=SPEC)
        assert got.ok and np.array_equal(got.kv, kv)
        assert e.stats()["session"]["lossy_demotions"] == 0


def test_partial_budget_requantizes_only_what_fits(tmp_path: Path) -> None:
    """0.05 covers two of the chunk's four blocks at 4 bits (0.02 each), not three."""
    e, kv = store_then_demote(tmp_path, budget=0.05, lossy=True)
    with e:
        bits = [b[1] for b in blocks(e, FIRST)]
        assert sorted(bits) == [4, 4, 16, 16]
        got = e.get(FIRST, model=SPEC)
        assert got.ok
        for layer, b in enumerate(bits):
            want = roundtrip4(kv[layer]) if b == 4 else kv[layer]
            assert np.array_equal(got.kv[layer], want)


def test_the_budget_covers_the_whole_stored_sequence(tmp_path: Path) -> None:
    """A two-chunk sequence: whatever order its chunks are demoted in, the KL of the
    sequence (both chunks, as a get reads them) stays within the budget."""
    tokens = list(range(32))
    budget = 0.09          # one chunk's four blocks at 4 bits (0.08), not a fifth block
    e, _ = store_then_demote(tmp_path, budget=budget, lossy=True, tokens=tokens)
    with e:
        bits = [b[1] for b in blocks(e, tokens)]
        assert bits.count(4) == 4
        prof = QualityProfile.load(profile(tmp_path))
        keys = chunk_keys(as_token_array(tokens), SPEC.fingerprint(), 16)
        with e.core.index.env.read() as txn:
            metas = [e.core.index.get_chunk(txn, k) for k in keys]
            assert all(m is not None for m in metas)
            for k, m in zip(keys, metas, strict=True):
                total = worst_path_kl(e.core.index, txn, k, m, prof)  # type: ignore[arg-type]
                assert total is not None and abs(total - 0.08) < 1e-12 and total <= budget
        assert e.get(tokens, model=SPEC).ok


def test_unknown_bits_are_never_requantized(tmp_path: Path) -> None:
    """An entry without labels (an earlier release's): its KL is unknown, so its demotion
    keeps the bits, whatever the budget."""
    kv = random_kv(SPEC, 16)
    with Engine.open(tmp_path / "s", config(tmp_path, 0.0, True)) as e:
        e.put(FIRST, kv, model=SPEC)
        ix = e.core.index
        [key] = chunk_keys(as_token_array(FIRST), SPEC.fingerprint(), 16)
        with ix.env.read() as txn:
            meta = ix.get_chunk(txn, key)
        assert meta is not None
        old = json.loads(meta.to_json())
        del old["q"]
        ix.env.write(lambda txn: ix._put(txn, ix._chunks, key, json.dumps(old).encode()))
    with Engine.open(tmp_path / "s", config(tmp_path, 1.0, True)) as e:
        for i in range(1, 4):
            e.put(list(range(1000 * i, 1000 * i + 16)), random_kv(SPEC, 16, seed=i),
                  model=SPEC)
        assert {b[:2] for b in blocks(e, FIRST)} == {("nvme", 16)}   # moved, labelled, kept
        assert e.get(FIRST, model=SPEC).ok
        assert e.stats()["session"]["lossy_demotions"] == 0


def test_a_lowered_budget_still_replans_a_quantized_blocks_code(tmp_path: Path) -> None:
    """Stored at 4 bits under a generous budget, reopened with none left and lossy demotion
    off: the demotion keeps the bits and re-plans the code (no fallback to the tier's)."""
    tokens = list(range(16))
    with Engine.open(tmp_path / "s", config(tmp_path, 1.0, False)) as e:
        e.put(tokens, random_kv(SPEC, 16), model=SPEC)
        assert {b[1] for b in blocks(e, tokens)} == {4}
    with Engine.open(tmp_path / "s", config(tmp_path, 0.0, False)) as e:
        for i in range(1, 4):
            e.put(list(range(1000 * i, 1000 * i + 16)), random_kv(SPEC, 16, seed=i),
                  model=SPEC)
        assert {b[:2] for b in blocks(e, tokens)} == {("nvme", 4)}
        assert e.stats()["session"]["placement_fallbacks"] == 0
