from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rkvtest import SMALL, chunk_bytes, local_config, random_kv

from rkv import (
    ConfigError,
    Engine,
    EngineConfig,
    InputError,
    ModelSpec,
    RecordMismatchError,
    RkvError,
    ShapeError,
    StoreClosedError,
    TierFullError,
)
from rkv.format.keys import as_token_array, block_key, chunk_keys


def toks(n: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(0, 50000, n).tolist()


@settings(max_examples=25)
@given(
    n_tokens=st.integers(1, 70),
    chunk=st.integers(1, 33),
    dtype=st.sampled_from(["float16", "bfloat16", "float32"]),
    layers=st.integers(1, 3),
    heads=st.integers(1, 3),
    dim=st.sampled_from([1, 4, 8]),
)
def test_round_trip(n_tokens: int, chunk: int, dtype: str, layers: int, heads: int,
                    dim: int) -> None:
    spec = ModelSpec("rt", n_layers=layers, n_kv_heads=heads, head_dim=dim, dtype=dtype)
    with tempfile.TemporaryDirectory() as d, Engine.open(d, local_config(chunk)) as e:
        t = toks(n_tokens)
        kv = random_kv(spec, n_tokens)
        e.put(t, kv, model=spec)
        assert e.lookup(t, model=spec) == n_tokens
        got = e.get(t, model=spec)
        assert got.ok and got.n_tokens == n_tokens
        assert got.kv.dtype == kv.dtype and np.array_equal(got.kv.view(np.uint8),
                                                           kv.view(np.uint8))
        # Any prefix reads back the full chunks it covers.
        p = n_tokens // 2
        full = (p // chunk) * chunk
        assert e.lookup(t[:p], model=spec) == (p if p == n_tokens else full)


def test_dedup_and_shared_prefixes(store_path: Path) -> None:
    with Engine.open(store_path, local_config(16)) as e:
        a = toks(40)
        b = a[:32] + toks(20, seed=1)
        kv_a = random_kv(SMALL, 40)
        r1 = e.put(a, kv_a, model=SMALL)
        assert (r1.chunks, r1.chunks_written) == (3, 3)
        assert r1.bytes_written == e.stats()["tiers"]["dram"]["bytes"] > kv_a.nbytes
        r2 = e.put(a, kv_a, model=SMALL)
        assert r2.chunks_written == 0 and r2.bytes_written == 0 and r2.chunks_deduped == 3
        kv_b = np.concatenate([kv_a[:, :, :32], random_kv(SMALL, 20, seed=2)], axis=2)
        r3 = e.put(b, kv_b, model=SMALL)
        assert r3.chunks_deduped == 2 and r3.chunks_written == 2
        st = e.stats()
        assert st["chunks"] == 5 and st["shared_chunks"] == 1
        assert st["tiers"]["dram"]["blocks"] == 5 * SMALL.n_layers
        assert np.array_equal(e.get(b, model=SMALL).kv, kv_b)
        assert np.array_equal(e.get(a, model=SMALL).kv, kv_a)


def test_reopen_keeps_everything(store_path: Path) -> None:
    cfg = local_config(16)
    t = toks(50)
    kv = random_kv(SMALL, 50)
    with Engine.open(store_path, cfg) as e:
        e.put(t, kv, model=SMALL)
        e.pin(t[:16], model=SMALL)
        before = e.stats()
    with Engine.open(store_path) as e:  # the stored config is used
        assert e.config == cfg
        after = e.stats()
        assert after["chunks"] == before["chunks"] and after["pinned_chunks"] == 1
        assert after["tiers"]["dram"]["bytes"] == before["tiers"]["dram"]["bytes"]
        assert np.array_equal(e.get(t, model=SMALL).kv, kv)
    with pytest.raises(ConfigError):
        Engine.open(store_path, local_config(32))


def test_invalid_inputs_write_nothing(store_path: Path) -> None:
    with Engine.open(store_path, local_config(16)) as e:
        t = toks(20)
        good = random_kv(SMALL, 20)
        bad_cases = [
            (t, good[:, :, :19]),                       # token/KV length mismatch
            (t, good.astype(np.float32)),               # wrong dtype
            (t, good[:2]),                              # wrong layer count
            (t, good.reshape(3, 2, 20, 4, 2)),          # wrong head layout
            (t, good.tolist()),                         # not an array
        ]
        for tt, kv in bad_cases:
            with pytest.raises(ShapeError):
                e.put(tt, kv, model=SMALL)
        with pytest.raises(InputError):
            e.put([-1] * 20, good, model=SMALL)
        with pytest.raises(ConfigError):
            e.put(t, good, model={"model_id": "x"})
        assert e.stats()["chunks"] == 0
        assert e.put([], random_kv(SMALL, 0), model=SMALL).chunks == 0
        assert e.get([], model=SMALL).n_tokens == 0


def test_models_do_not_mix(store_path: Path) -> None:
    other = ModelSpec("test/small", n_layers=3, n_kv_heads=2, head_dim=4, dtype="float16",
                      tp_rank=1, tp_size=2)
    with Engine.open(store_path, local_config(16)) as e:
        t = toks(32)
        e.put(t, random_kv(SMALL, 32), model=SMALL)
        assert e.lookup(t, model=other) == 0
        assert e.get(t, model=other).n_tokens == 0


def test_torch_in_and_out(store_path: Path) -> None:
    torch = pytest.importorskip("torch")
    spec = ModelSpec("t", n_layers=2, n_kv_heads=1, head_dim=4, dtype="bfloat16")
    kv = torch.randn(2, 2, 10, 1, 4, dtype=torch.bfloat16)
    with Engine.open(store_path, local_config(4)) as e:
        e.put(torch.arange(10), kv, model=spec)
        got = e.get(torch.arange(10), model=spec, as_torch=True)
        assert got.kv.dtype == torch.bfloat16 and torch.equal(got.kv, kv)
        np_out = e.get(list(range(10)), model=spec).kv
        assert np_out.dtype.name == "bfloat16"


def test_pins_deletes_and_refcounts(store_path: Path) -> None:
    with Engine.open(store_path, local_config(16)) as e:
        a = toks(48)
        b = a[:32] + toks(16, seed=3)
        e.put(a, random_kv(SMALL, 48), model=SMALL)
        e.put(b, random_kv(SMALL, 48), model=SMALL)
        assert e.delete([*a, 1], model=SMALL) == 0          # not stored: nothing happens
        assert e.delete(a, model=SMALL) == 1                # only a's own last chunk is freed
        assert e.lookup(b, model=SMALL) == 48
        assert e.lookup(a, model=SMALL) == 32
        assert e.pin(b, model=SMALL) == 3
        assert e.delete(b, model=SMALL) == 0                # pinned
        assert e.lookup(b, model=SMALL) == 48
        assert e.unpin(b, model=SMALL) == 3
        assert e.unpin(b, model=SMALL) == 0
        assert e.delete(b, model=SMALL) == 3
        assert e.stats()["chunks"] == 0
        assert e.stats()["tiers"]["dram"]["bytes"] == 0
        assert e.verify().orphans == 0


def test_interior_prefix_is_a_sequence_too(store_path: Path) -> None:
    with Engine.open(store_path, local_config(16)) as e:
        a = toks(48)
        e.put(a, random_kv(SMALL, 48), model=SMALL)
        e.put(a[:32], random_kv(SMALL, 32), model=SMALL)
        assert e.delete(a, model=SMALL) == 1       # a[:32] stays: it was stored on its own
        assert e.lookup(a, model=SMALL) == 32
        assert e.delete(a[:32], model=SMALL) == 2


def test_clear(store_path: Path) -> None:
    other = ModelSpec("o", 3, 2, 4)
    with Engine.open(store_path, local_config(16)) as e:
        e.put(toks(20), random_kv(SMALL, 20), model=SMALL)
        e.put(toks(20), random_kv(other, 20), model=other)
        assert e.clear(model=other) == 2
        assert e.stats()["chunks"] == 2
        assert e.clear() == 2
        st = e.stats()
        assert st["chunks"] == 0 and all(t["records"] == 0 for t in st["tiers"].values())


def test_lru_demotion_and_eviction(store_path: Path) -> None:
    size = chunk_bytes()
    caps = (2 * size, 2 * size, 3 * size)
    with Engine.open(store_path, local_config(16, caps, policy="lru", promote="never")) as e:
        seqs = [toks(16, seed=i) for i in range(9)]
        kvs = [random_kv(SMALL, 16, seed=i) for i in range(9)]
        for s, kv in zip(seqs[:7], kvs[:7], strict=True):
            e.put(s, kv, model=SMALL)
        st = e.stats()
        assert [st["tiers"][n]["blocks"] // 3 for n in ("dram", "cxl", "nvme")] == [2, 2, 3]
        assert st["session"]["demoted_chunks"] >= 4
        # Demotion inserts into the lower tier's LRU: nvme holds 0, 1, 2 (oldest first).
        e.get(seqs[0], model=SMALL)             # a read keeps 0 from being the next victim
        e.pin(seqs[1], model=SMALL)             # a pin protects 1
        e.put(seqs[7], kvs[7], model=SMALL)     # 3 demoted into nvme, 2 evicted
        e.get(seqs[0], model=SMALL)             # nvme LRU order: 1 (pinned), 3, 0
        e.put(seqs[8], kvs[8], model=SMALL)     # 4 demoted into nvme, 3 evicted
        assert e.stats()["session"]["evicted_chunks"] == 2
        for i in (0, 1, 7, 8):
            got = e.get(seqs[i], model=SMALL)
            assert got.n_tokens == 16 and np.array_equal(got.kv, kvs[i]), i
        assert e.lookup(seqs[2], model=SMALL) == 0 and e.lookup(seqs[3], model=SMALL) == 0
        rep = e.verify()
        assert rep.clean and rep.orphans == 0
        assert sum(st["tiers"][n]["bytes"] for n in st["tiers"]) <= sum(caps)


def test_prefixes_stay_reachable_under_eviction(store_path: Path) -> None:
    size = chunk_bytes()
    with Engine.open(store_path, local_config(16, (size, size, 3 * size))) as e:
        base = toks(32)
        for i in range(6):
            s = base + toks(16, seed=10 + i)
            e.put(s, random_kv(SMALL, 48, seed=i), model=SMALL)
        # The shared 2-chunk prefix is never evicted while children exist.
        assert e.lookup(base, model=SMALL) == 32
        rep = e.verify()
        assert rep.clean and rep.orphans == 0


def test_on_full_error(store_path: Path) -> None:
    size = chunk_bytes()
    cfg = local_config(16, (size, size, size), on_full="error")
    with Engine.open(store_path, cfg) as e:
        for i in range(3):
            e.put(toks(16, seed=i), random_kv(SMALL, 16), model=SMALL)
        with pytest.raises(TierFullError):
            e.put(toks(16, seed=9), random_kv(SMALL, 16), model=SMALL)
        assert e.stats()["chunks"] == 3
        assert e.verify().clean


def test_chunk_bigger_than_upper_tiers_goes_lower(store_path: Path) -> None:
    with Engine.open(store_path, local_config(16, (100, 100, 1 << 30))) as e:
        r = e.put(toks(16), random_kv(SMALL, 16), model=SMALL)
        assert r.tiers == {"nvme": 1}


def test_corrupt_payload_is_uncorrectable_not_wrong(store_path: Path) -> None:
    with Engine.open(store_path, local_config(16)) as e:
        t = toks(48)
        kv = random_kv(SMALL, 48)
        e.put(t, kv, model=SMALL)
        key = chunk_keys(as_token_array(t), SMALL.fingerprint(), 16)[1]
        tier = e.tiers["dram"]
        rec = bytearray(tier.get(block_key(key, 2)) or b"")
        from rkv.format.record import decode_record

        rec[decode_record(rec).header_bytes + 7] ^= 0x04
        tier.put(block_key(key, 2), rec)
        got = e.get(t, model=SMALL)
        assert got.n_tokens == 16 and not got.ok
        assert got.counts["uncorrectable"] == 1
        assert np.array_equal(got.kv, kv[:, :, :16])
        with pytest.raises(RkvError):
            e.get(t, model=SMALL, strict=True)
        rep = e.verify()
        assert rep.uncorrectable == 1 and not rep.clean


def test_header_flips_through_the_engine_never_give_wrong_kv(store_path: Path) -> None:
    with Engine.open(store_path, local_config(16)) as e:
        t = toks(16)
        kv = random_kv(SMALL, 16)
        e.put(t, kv, model=SMALL)
        key = chunk_keys(as_token_array(t), SMALL.fingerprint(), 16)[0]
        tier = e.tiers["dram"]
        bkey = block_key(key, 0)
        orig = tier.get(bkey) or b""
        from rkv.format.record import decode_record

        head = decode_record(orig).header_bytes
        rng = np.random.default_rng(0)
        for bit in rng.choice(head * 8, size=150, replace=False).tolist() + [
                8 * (len(orig) - 1 - i) for i in range(50)]:
            bad = bytearray(orig)
            bad[bit // 8] ^= 1 << (bit % 8)
            tier.put(bkey, bad)
            got = e.get(t, model=SMALL)
            if got.n_tokens:
                assert np.array_equal(got.kv, kv)
            else:
                assert got.counts["uncorrectable"] == 1
        tier.put(bkey, orig)


def test_record_under_wrong_key_is_a_mismatch(store_path: Path) -> None:
    with Engine.open(store_path, local_config(16)) as e:
        a, b = toks(16, 1), toks(16, 2)
        e.put(a, random_kv(SMALL, 16, 1), model=SMALL)
        e.put(b, random_kv(SMALL, 16, 2), model=SMALL)
        fp = SMALL.fingerprint()
        ka = chunk_keys(as_token_array(a), fp, 16)[0]
        kb = chunk_keys(as_token_array(b), fp, 16)[0]
        tier = e.tiers["dram"]
        tier.put(block_key(ka, 0), tier.get(block_key(kb, 0)))
        got = e.get(a, model=SMALL)
        assert got.n_tokens == 0
        assert isinstance(got.errors()[0], RecordMismatchError)


def test_missing_record_is_reported(store_path: Path) -> None:
    with Engine.open(store_path, local_config(16)) as e:
        t = toks(16)
        e.put(t, random_kv(SMALL, 16), model=SMALL)
        key = chunk_keys(as_token_array(t), SMALL.fingerprint(), 16)[0]
        e.tiers["dram"].delete(block_key(key, 1))
        got = e.get(t, model=SMALL)
        assert got.n_tokens == 0 and got.counts["missing"] == 1
        assert e.verify().missing == 1


def test_wiped_memory_tier_is_reconciled(store_path: Path) -> None:
    import shutil

    cfg = local_config(16)
    t = toks(32)
    with Engine.open(store_path, cfg) as e:
        e.put(t, random_kv(SMALL, 32), model=SMALL)
    shutil.rmtree(store_path / "t" / "dram")     # what a reboot does to /dev/shm
    with Engine.open(store_path) as e:
        assert e.lookup(t, model=SMALL) == 0
        assert e.stats()["chunks"] == 0
        assert e.stats()["tiers"]["dram"]["bytes"] == 0


def test_closed_and_not_a_store(tmp_path: Path) -> None:
    e = Engine.open(tmp_path / "s", local_config(16))
    e.close()
    e.close()
    with pytest.raises(StoreClosedError):
        e.lookup([1], model=SMALL)
    with pytest.raises(RkvError, match="not an rkv store"):
        Engine.open(tmp_path / "nothing", create=False)
    with pytest.raises(ConfigError):
        Engine.open(tmp_path / "s", config={"chunk_tokens": 4})  # type: ignore[arg-type]


def test_default_config_uses_memory_dir_and_destroy(tmp_path: Path) -> None:
    from rkv.store.paths import memory_dir, resolve_tier_path

    path = tmp_path / "default"
    with Engine.open(path) as e:
        e.put(toks(8), random_kv(SMALL, 8), model=SMALL)
        dram = resolve_tier_path(path, e.config.tier("dram"), e.identity.id)
        nvme = resolve_tier_path(path, e.config.tier("nvme"), e.identity.id)
    if memory_dir() is not None:
        assert str(dram).startswith(str(memory_dir()))
    assert str(nvme).startswith(str(path))
    assert dram.exists()
    Engine.destroy(path)
    assert not dram.exists() and not path.exists()


def test_two_handles_in_one_process(store_path: Path) -> None:
    cfg = local_config(16)
    with Engine.open(store_path, cfg) as a, Engine.open(store_path) as b:
        a.put(toks(16), random_kv(SMALL, 16), model=SMALL)
        assert b.lookup(toks(16), model=SMALL) == 16
    assert EngineConfig.from_dict(cfg.to_dict()) == cfg


def test_lookup_partial_and_models(tmp_path: Path) -> None:
    """lookup(partial=True) counts a stored partial chunk that continues the full chunks
    (one a shorter sequence ended with); models() lists the specs stored under."""
    with Engine.open(tmp_path / "s", local_config(16)) as e:
        assert e.models() == []
        toks = list(range(40))                       # 2 full chunks + a partial of 8
        e.put(toks, random_kv(SMALL, 40), model=SMALL)
        longer = [*toks, 99, 98, 97]
        assert e.lookup(longer, model=SMALL) == 32   # the partial chunk's key hashes 8
        assert e.lookup(longer, model=SMALL, partial=True) == 40
        assert e.lookup(toks[:37], model=SMALL, partial=True) == 32   # it does not fit
        assert e.lookup([*toks[:35], 7, 7, 7, 7, 7], model=SMALL, partial=True) == 32
        got = e.get(longer[:e.lookup(longer, model=SMALL, partial=True)], model=SMALL)
        assert got.n_tokens == 40
        short = [5, 6, 7]                            # a partial first chunk, no parent
        e.put(short, random_kv(SMALL, 3), model=SMALL)
        assert e.lookup([*short, 1, 2], model=SMALL, partial=True) == 3
        assert e.models() == [SMALL]
