"""ECC through the engine: corrected reads, repair, re-encoding on demotion, never wrong KV."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rkvtest import SMALL, local_config, random_kv

from rkv import ConfigError, Engine, EngineConfig, ModelSpec, UnknownFormatError
from rkv.codec.stages import header_codec
from rkv.format.keys import as_token_array, block_key, chunk_keys
from rkv.format.record import decode_record, encode_record

BIG = ModelSpec("test/big", n_layers=2, n_kv_heads=2, head_dim=16, dtype="float16")
CODECS = ["rs(255,223)", "rs(255,239,interleave=4)", "bch(m=13,t=8)", "shardrs(k=8,m=2)",
          "xxh3", "crc32c"]


def ecc_config(ecc: str, chunk: int = 16, caps: tuple[int, int, int] | None = None,
               **kw: object) -> EngineConfig:
    cfg = local_config(chunk, caps, **kw)
    return replace(cfg, tiers=tuple(replace(t, ecc=ecc) for t in cfg.tiers))


def toks(n: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(0, 50000, n).tolist()


def first_block(e: Engine, t: list[int], spec: ModelSpec, layer: int = 0,
                chunk: int = 16) -> bytes:
    return block_key(chunk_keys(as_token_array(t), spec.fingerprint(), chunk)[0], layer)


@pytest.mark.parametrize("ecc", CODECS)
def test_round_trip_with_each_codec(store_path: Path, ecc: str) -> None:
    with Engine.open(store_path, ecc_config(ecc)) as e:
        t = toks(40)
        kv = random_kv(BIG, 40)
        e.put(t, kv, model=BIG)
        got = e.get(t, model=BIG)
        assert got.ok and got.counts["ok"] == 6 and np.array_equal(got.kv, kv)
        rec = e.tiers["dram"].get(first_block(e, t, BIG)) or b""
        codec = header_codec(decode_record(rec).header)
        assert codec is not None and codec.spec.split("(")[0] == ecc.split("(")[0]
        assert e.verify().clean


@pytest.mark.parametrize("ecc", ["rs(255,223)", "bch(m=13,t=8)", "shardrs(k=8,m=2)"])
def test_correctable_damage_is_corrected_and_repaired(store_path: Path, ecc: str) -> None:
    with Engine.open(store_path, ecc_config(ecc)) as e:
        t = toks(16)
        kv = random_kv(BIG, 16)
        e.put(t, kv, model=BIG)
        bkey = first_block(e, t, BIG)
        tier = e.tiers["dram"]
        rec = bytearray(tier.get(bkey) or b"")
        start = decode_record(rec).header_bytes
        rec[start + 10] ^= 0x5A          # one byte of data: within every code's capability
        tier.put(bkey, rec)
        got = e.get(t, model=BIG)
        assert got.ok and np.array_equal(got.kv, kv)
        assert got.counts["corrected"] == 1 and got.corrected >= 1
        assert e.stats()["session"]["blocks_repaired"] == 1
        # The repair rewrote the stored record: the next read is clean.
        again = e.get(t, model=BIG)
        assert again.counts["corrected"] == 0 and again.counts["ok"] == 2


def test_lost_shard_is_recovered(store_path: Path) -> None:
    with Engine.open(store_path, ecc_config("shardrs(k=8,m=2)")) as e:
        t = toks(16)
        kv = random_kv(BIG, 16)
        e.put(t, kv, model=BIG)
        bkey = first_block(e, t, BIG)
        tier = e.tiers["dram"]
        rec = bytearray(tier.get(bkey) or b"")
        start = decode_record(rec).header_bytes
        shard = 2 * 16 * 2 * 16 * 2 // 8
        rec[start + shard: start + 2 * shard] = bytes(shard)   # a whole shard zeroed
        tier.put(bkey, rec)
        got = e.get(t, model=BIG)
        assert got.ok and np.array_equal(got.kv, kv) and got.counts["corrected"] == 1


@settings(max_examples=40)
@given(flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)), min_size=1,
                      max_size=60),
       ecc=st.sampled_from(["none", "rs(255,251)", "bch(m=13,t=2)", "shardrs(k=4,m=2)"]))
def test_random_damage_never_returns_wrong_kv(tmp_path_factory: pytest.TempPathFactory,
                                              flips: list[tuple[int, int]], ecc: str) -> None:
    path = tmp_path_factory.mktemp("s")
    with Engine.open(path, ecc_config(ecc, repair=False)) as e:
        t = toks(16)
        kv = random_kv(BIG, 16)
        e.put(t, kv, model=BIG)
        bkey = first_block(e, t, BIG)
        tier = e.tiers["dram"]
        rec = bytearray(tier.get(bkey) or b"")
        for pos, mask in flips:
            rec[pos % len(rec)] ^= mask
        tier.put(bkey, rec)
        got = e.get(t, model=BIG)
        if got.n_tokens:
            assert np.array_equal(got.kv, kv)
        else:
            assert got.counts["uncorrectable"] == 1


def test_demotion_reencodes_with_the_destination_codec(store_path: Path) -> None:
    base = local_config(16)
    tiers = (replace(base.tiers[0], ecc="none"), replace(base.tiers[1], ecc="rs(255,239)"),
             replace(base.tiers[2], ecc="shardrs(k=8,m=2)"))
    with Engine.open(store_path, replace(base, tiers=tiers)) as e0:
        one = e0.put(toks(16, 0), random_kv(SMALL, 16), model=SMALL).bytes_written
        e0.clear()
    caps = (one, 3 * one, 1 << 30)
    tiers = tuple(replace(t, capacity_bytes=c) for t, c in zip(tiers, caps, strict=True))
    with Engine.open(store_path, replace(base, tiers=tiers)) as e:
        seqs = [toks(16, i) for i in range(4)]
        kvs = [random_kv(SMALL, 16, i) for i in range(4)]
        for s, kv in zip(seqs, kvs, strict=True):
            e.put(s, kv, model=SMALL)
        st_ = e.stats()
        assert [st_["tiers"][n]["blocks"] // 3 for n in ("dram", "cxl", "nvme")] == [1, 2, 1]
        for name, want in (("dram", None), ("cxl", "rs"), ("nvme", "shardrs")):
            for k in e.tiers[name].iter_keys():
                codec = header_codec(decode_record(e.tiers[name].get(k) or b"").header)
                assert (codec.codec_id if codec else None) == want
        for s, kv in zip(seqs, kvs, strict=True):
            got = e.get(s, model=SMALL)
            assert got.ok and np.array_equal(got.kv, kv)
        assert e.verify().clean


def test_corrupt_block_moves_unchanged_and_stays_detected(store_path: Path) -> None:
    with Engine.open(store_path, local_config(16)) as e0:
        one = e0.put(toks(16, 0), random_kv(SMALL, 16), model=SMALL).bytes_written
        e0.clear()
    cfg = ecc_config("none", caps=(one, 1 << 30, 1 << 30))
    cfg = replace(cfg, tiers=(cfg.tiers[0], replace(cfg.tiers[1], ecc="rs(255,239)"),
                              cfg.tiers[2]))
    with Engine.open(store_path, cfg) as e:
        t0 = toks(16, 0)
        e.put(t0, random_kv(SMALL, 16), model=SMALL)
        bkey = first_block(e, t0, SMALL)
        rec = bytearray(e.tiers["dram"].get(bkey) or b"")
        rec[decode_record(rec).header_bytes + 1] ^= 1
        e.tiers["dram"].put(bkey, rec)
        e.put(toks(16, 1), random_kv(SMALL, 16, 1), model=SMALL)   # demotes t0 to cxl
        assert e.tiers["cxl"].get(bkey) == bytes(rec)
        got = e.get(t0, model=SMALL)
        assert got.n_tokens == 0 and got.counts["uncorrectable"] == 1


def test_verify_repair(store_path: Path) -> None:
    with Engine.open(store_path, ecc_config("rs(255,223)", repair=False)) as e:
        t = toks(16)
        kv = random_kv(BIG, 16)
        e.put(t, kv, model=BIG)
        bkey = first_block(e, t, BIG, layer=1)
        rec = bytearray(e.tiers["dram"].get(bkey) or b"")
        rec[decode_record(rec).header_bytes + 3] ^= 0xFF
        e.tiers["dram"].put(bkey, rec)
        assert e.get(t, model=BIG).counts["corrected"] == 1
        assert e.get(t, model=BIG).counts["corrected"] == 1     # repair is off
        rep = e.verify(repair=True)
        assert rep.corrected == 1 and rep.repaired == 1 and rep.clean
        assert e.verify().corrected == 0
        assert np.array_equal(e.get(t, model=BIG).kv, kv)


def test_unknown_codec_in_a_record(store_path: Path) -> None:
    with Engine.open(store_path, ecc_config("rs(255,223)")) as e:
        t = toks(16)
        e.put(t, random_kv(BIG, 16), model=BIG)
        bkey = first_block(e, t, BIG)
        dec = decode_record(e.tiers["dram"].get(bkey) or b"")
        bad = replace(dec.header, codecs=({"id": "turbo", "rate": 3},))
        e.tiers["dram"].put(bkey, encode_record(bad, bytes(dec.payload)))
        got = e.get(t, model=BIG)
        assert got.n_tokens == 0 and isinstance(got.errors()[0], UnknownFormatError)


@pytest.mark.parametrize("ecc", ["rs(256,2)", "bogus", "rs(10,10)", ""])
def test_bad_ecc_config(ecc: str) -> None:
    with pytest.raises(ConfigError):
        ecc_config(ecc)
