"""The stored mix: stats() and `rkv info` show, per tier, blocks and bytes per (bits, code),
from the labels the index records per block; old entries without labels still load."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from rkvtest import random_kv

from rkv import CorruptStoreError, Engine, EngineConfig, ModelSpec, TierConfig
from rkv.codec.stages import header_stages
from rkv.format.keys import block_key
from rkv.format.record import decode_record
from rkv.store.index import ChunkMeta, pipe_label
from rkv.store.storemix import mix_key, pipeline_label

SPEC = ModelSpec("test/placed", n_layers=4, n_kv_heads=2, head_dim=16, dtype="float16")
CODES = ["none", "rs(255,247)", "rs(255,223)"]


def profile(tmp_path: Path) -> str:
    """Deeper layers tolerate fewer bits (as in test_placement_engine)."""
    kl = {f"{layer}:{kind}:{bits}": (0.001 if layer >= 2 else 0.05) * (16 / bits)
          for layer in range(4) for kind in "kv" for bits in (8, 4, 2)}
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"model": "test", "kl": kl}))
    return str(path)


def config(tmp_path: Path, caps: tuple[int, int] = (1 << 30, 1 << 30),
           **placement: Any) -> EngineConfig:
    tiers = (TierConfig("dram", medium="memory", path="t/dram", capacity_bytes=caps[0],
                        fault_model="raw-ber"),
             TierConfig("nvme", medium="disk", path="t/nvme", capacity_bytes=caps[1],
                        fault_model="nvme-tlc"))
    table = {"max_p_due": 1e-6, "bits": [16, 4], "codes": CODES, "quality_budget_kl": 0.05,
             "profile": profile(tmp_path), "capacity_cost": {"dram": 1e6}, **placement}
    return EngineConfig(chunk_tokens=16, tiers=tiers, placement=table)


def from_records(e: Engine) -> dict[str, dict[str, list[int]]]:
    """The mix as the records' own headers tell it: tier -> key -> [blocks, bytes]."""
    out: dict[str, dict[str, list[int]]] = {}
    with e.core.index.env.read() as txn:
        entries = [m for _, m in e.core.index.chunks(txn)]
    for meta in entries:
        assert meta is not None
        for layer, (tier, size) in enumerate(meta.blocks):
            key = next(k for k, m in _keys(e) if m == meta)
            rec = e.tiers[tier].get(block_key(key, layer))
            assert rec is not None and len(rec) == size
            quant, codec = header_stages(decode_record(rec).header)
            label = pipe_label(16 if quant is None else quant.bits,
                               "none" if codec is None else codec.spec)
            cur = out.setdefault(tier, {}).setdefault(mix_key(label), [0, 0])
            cur[0] += 1
            cur[1] += size
    return out


def _keys(e: Engine) -> list[tuple[bytes, ChunkMeta | None]]:
    with e.core.index.env.read() as txn:
        return list(e.core.index.chunks(txn))


def shown(e: Engine) -> dict[str, dict[str, list[int]]]:
    """stats()'s mix in the same shape (tiers with nothing stored left out)."""
    st = e.stats()
    out = {name: {k: [r["blocks"], r["bytes"]] for k, r in t["mix"].items()}
           for name, t in st["tiers"].items() if t["mix"]}
    for t in st["tiers"].values():   # the mix adds up to the tier's usage
        assert sum(r["blocks"] for r in t["mix"].values()) == t["blocks"]
        assert sum(r["bytes"] for r in t["mix"].values()) == t["bytes"]
    return out


def test_mixed_plan_put_shows_the_planned_mix(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    tokens = list(range(48))
    with Engine.open(tmp_path / "s", cfg) as e:
        e.put(tokens, random_kv(SPEC, 48), model=SPEC)
        # The plan the engine made for the put, per block.
        assert e.core.placement is not None
        plan = e.core.placement.put_plan(SPEC, [16, 16, 16], 3, "dram")
        planned = Counter(mix_key(pipeline_label(p)) for chunk in plan for p in chunk)
        mix = shown(e)
        assert {k: v[0] for k, v in mix["dram"].items()} == dict(planned)
        assert len(planned) == 2       # 16-bit layers and 4-bit layers
        assert {r["bits"] for r in e.stats()["tiers"]["dram"]["mix"].values()} == {16, 4}
        assert mix == from_records(e)


def test_mix_follows_demotion_delete_and_eviction(tmp_path: Path) -> None:
    """dram (raw BER) needs RS for max_p_due = 1e-6; nvme's device ECC does not: demoted
    blocks change code and the mix follows, as it does deletes and evictions."""
    cfg = config(tmp_path, caps=(20_000, 25_000), bits=[16])
    with Engine.open(tmp_path / "s", cfg) as e:
        seqs = [list(range(100 * i, 100 * i + 16)) for i in range(6)]
        for i, toks in enumerate(seqs[:3]):
            e.put(toks, random_kv(SPEC, 16, seed=i), model=SPEC)
        mix = shown(e)
        assert mix == from_records(e)
        assert set(mix) == {"dram", "nvme"}
        assert set(mix["nvme"]) == {"16-bit + none"}
        assert all("rs(" in k for k in mix["dram"])
        e.delete(seqs[0], model=SPEC)
        assert shown(e) == from_records(e)
        before = e.stats()["session"]
        for i, toks in enumerate(seqs[3:], 3):
            e.put(toks, random_kv(SPEC, 16, seed=i), model=SPEC)
        assert e.stats()["session"].get("evicted_chunks", 0) > before.get("evicted_chunks", 0)
        assert shown(e) == from_records(e)


def test_entries_without_labels_load_and_count_as_unknown(tmp_path: Path) -> None:
    """An entry as an earlier release wrote it (no "q"): it loads, reads back, and its
    blocks count as unknown; moving it labels the blocks it moves."""
    cfg = config(tmp_path, bits=[16])
    tokens = list(range(16))
    kv = random_kv(SPEC, 16)
    with Engine.open(tmp_path / "s", cfg) as e:
        e.put(tokens, kv, model=SPEC)
        ix = e.core.index
        [(key, meta)] = _keys(e)
        assert meta is not None and all(meta.pipes)
        old = json.loads(meta.to_json())
        del old["q"]
        ix.env.write(lambda txn: ix._put(txn, ix._chunks, key, json.dumps(old).encode()))
    with Engine.open(tmp_path / "s", cfg) as e:
        [(_, meta)] = _keys(e)
        assert meta is not None and meta.pipes == ()
        got = e.get(tokens, model=SPEC)
        assert got.ok
        mix = e.stats()["tiers"]["dram"]["mix"]
        assert list(mix) == ["unknown"]
        assert mix["unknown"]["blocks"] == 4 and mix["unknown"]["bits"] is None


def test_labels_round_trip_and_stale_labels_are_dropped() -> None:
    meta = ChunkMeta(b"", 0, 16, bytes(16), (("dram", 10), ("nvme", 20), ("nvme", 30)),
                     pipes=("4/rs(n=255,k=239,interleave=1)", "", "16/none"))
    back = ChunkMeta.from_json(meta.to_json())
    assert back == meta
    assert json.loads(meta.to_json())["q"]["l"] == [1, -1, 0]
    moved = meta.with_(blocks=(("nvme", 12), ("nvme", 20), ("nvme", 30)))
    assert moved.pipes == ("", "", "16/none")          # the changed layer forgets its label
    assert meta.with_(pins=2).pipes == meta.pipes
    assert ChunkMeta(b"", 0, 16, bytes(16), (("dram", 1),), pipes=("",)).pipes == ()


@pytest.mark.parametrize("q", [
    [], "x", {"p": []}, {"p": [], "l": [], "x": 1}, {"p": "16/none", "l": [0]},
    {"p": ["16/none"], "l": [0, 0]}, {"p": ["16/none"], "l": [1]}, {"p": ["16/none"], "l": [-2]},
    {"p": ["16/none"], "l": [True]}, {"p": ["16/none"], "l": [0.0]}, {"p": [16], "l": [0]},
    {"p": ["17/none"], "l": [0]}, {"p": ["0/none"], "l": [0]}, {"p": ["4/"], "l": [0]},
    {"p": ["4/none\n"], "l": [0]}, {"p": ["4/rs(" + "1" * 200 + ")"], "l": [0]},
    {"p": ["16/none", "4/none"], "l": [0]}, {"p": ["4/x;rm -rf"], "l": [0]},
    {"p": [None], "l": [0]}, {"p": ["16/none"], "l": None},
])
def test_hostile_labels_are_a_typed_error(q: Any) -> None:
    d = json.loads(ChunkMeta(b"", 0, 16, bytes(16), (("dram", 10),)).to_json())
    d["q"] = q
    with pytest.raises(CorruptStoreError):
        ChunkMeta.from_json(json.dumps(d).encode())


def test_hostile_label_in_a_store_is_contained(tmp_path: Path) -> None:
    """A sealed entry with a bad label reads as damaged (CorruptStoreError), stats() counts
    it as unreadable, nothing crashes."""
    cfg = config(tmp_path, bits=[16])
    with Engine.open(tmp_path / "s", cfg) as e:
        e.put(list(range(16)), random_kv(SPEC, 16), model=SPEC)
        ix = e.core.index
        [(key, meta)] = _keys(e)
        assert meta is not None
        bad = json.loads(meta.to_json())
        bad["q"]["p"][0] = "99/" + "x" * 300
        ix.env.write(lambda txn: ix._put(txn, ix._chunks, key, json.dumps(bad).encode()))
        with ix.env.read() as txn, pytest.raises(CorruptStoreError):
            ix.get_chunk(txn, key)
        st = e.stats()
        assert st["unreadable_chunks"] == 1 and st["tiers"]["dram"]["mix"] == {}


def test_rkv_info_prints_the_mix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rkv.cli import main

    with Engine.open(tmp_path / "s", config(tmp_path)) as e:
        e.put(list(range(32)), random_kv(SPEC, 32), model=SPEC)
    assert main(["info", str(tmp_path / "s")]) == 0
    text = capsys.readouterr().out
    assert "stored mix" in text and "rs(n=255" in text and " 4 " in text
    assert main(["info", str(tmp_path / "s"), "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert sum(r["blocks"] for r in st["tiers"]["dram"]["mix"].values()) == 8


@pytest.mark.parametrize("name", ["store_v1", "store_v2"])
def test_golden_stores_show_their_blocks_as_unknown(tmp_path: Path, name: str) -> None:
    """Stores written by earlier releases (no labels): every block counts as unknown, the
    mix adds up to the usage, and a migrated store still does."""
    import tarfile

    golden = Path(__file__).parent.parent / "golden" / f"{name}.tar.gz"
    with tarfile.open(golden) as tar:
        tar.extractall(tmp_path, filter="data")
    path = next(p for p in tmp_path.iterdir() if (p / "index").is_dir())
    for readonly in (True, False):
        with Engine.open(path, readonly=readonly) as e:
            st = e.stats()
            used = {n: t for n, t in st["tiers"].items() if t["blocks"]}
            assert used
            for t in used.values():
                assert list(t["mix"]) == ["unknown"]
                assert t["mix"]["unknown"]["blocks"] == t["blocks"]
                assert t["mix"]["unknown"]["bytes"] == t["bytes"]


@pytest.mark.parametrize("name", ["store_v1", "store_v2"])
def test_verify_repair_labels_old_entries_from_their_records(tmp_path: Path,
                                                             name: str) -> None:
    """`verify --repair` fills in the labels of entries written before labels existed, from
    the records' headers: afterwards nothing is unknown and a second pass labels nothing."""
    import tarfile

    golden = Path(__file__).parent.parent / "golden" / f"{name}.tar.gz"
    with tarfile.open(golden) as tar:
        tar.extractall(tmp_path, filter="data")
    path = next(p for p in tmp_path.iterdir() if (p / "index").is_dir())
    with Engine.open(path) as e:
        blocks = sum(t["blocks"] for t in e.stats()["tiers"].values())
        rep = e.verify(repair=True)
        assert rep.labelled == blocks == rep.ok
        for t in e.stats()["tiers"].values():
            assert "unknown" not in t["mix"]
            assert sum(r["blocks"] for r in t["mix"].values()) == t["blocks"]
        assert e.verify(repair=True).labelled == 0
