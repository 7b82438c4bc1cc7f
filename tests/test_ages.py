"""Blocks age in their tiers: records carry their write time (format 2), the index keeps a
copy per layer, every rewrite restamps it, and the engine reports ages by its clock."""

from __future__ import annotations

import json
import tarfile
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st
from rkvtest import SMALL, local_config, random_kv

from policies.base import Reason
from rkv import Engine
from rkv.errors import CorruptRecordError, CorruptStoreError, InputError, IntegrityError
from rkv.format.keys import as_token_array, block_key, chunk_keys
from rkv.format.record import (
    FORMAT_VERSION,
    RecordHeader,
    decode_record,
    encode_array_record,
    encode_record,
)
from rkv.store.ages import BlockAge
from rkv.store.decisions import Protected
from rkv.store.index import ChunkMeta
from rkv.store.txn import Pending

GOLDEN = Path(__file__).parent / "golden"
KEY, FP = bytes(range(32)), bytes(range(100, 116))
T0 = 1_764_590_400_000_000_000          # 2025-12-01 12:00 UTC, in ns
WRITTEN_AT = 101                        # offset of written_ns in a v2 header body
U64 = st.integers(1, (1 << 64) - 1)


class FakeClock:
    """A clock a test moves by hand."""

    def __init__(self, t: int = T0) -> None:
        self.t = t

    def __call__(self) -> int:
        return self.t

    def advance(self, seconds: float) -> int:
        self.t += int(seconds * 1e9)
        return self.t


def toks(n: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(0, 50000, n).tolist()  # type: ignore[no-any-return]


def chunk_key(t: list[int], i: int = 0) -> bytes:
    return chunk_keys(as_token_array(t), SMALL.fingerprint(), 16)[i]


def record(written: int | None, shape: tuple[int, ...] = (2, 3, 2, 4),
           codecs: tuple[dict[str, object], ...] = ()) -> bytes:
    data = np.arange(int(np.prod(shape)), dtype=np.float16).reshape(shape)
    h = RecordHeader(key=KEY, layer=7, fingerprint=FP, shape=shape, dtype="float16",
                     data_len=0, payload_len=0, written_ns=written)
    if not codecs:
        return bytes(encode_array_record(h, data))
    raw = data.tobytes()
    return bytes(encode_record(replace(h, data_len=len(raw), payload_len=len(raw),
                                       codecs=codecs), raw))


def copy_offsets(rec: bytes) -> list[int]:
    """Offsets of the three header copies."""
    hlen = int.from_bytes(rec[6:8], "little")
    return [16, 16 + hlen, len(rec) - 8 - hlen]


# -- the record format ------------------------------------------------------------------------
@given(written=st.none() | U64, tokens=st.integers(1, 9),
       codecs=st.sampled_from([(), ({"id": "rs", "n": 255, "k": 223},)]))
def test_v2_round_trip(written: int | None, tokens: int,
                       codecs: tuple[dict[str, object], ...]) -> None:
    rec = record(written, (2, tokens, 2, 4), codecs)
    assert rec[4] == FORMAT_VERSION == 2
    dec = decode_record(rec, expect_key=KEY, expect_layer=7, expect_fingerprint=FP)
    assert dec.header.written_ns == written and dec.header.codecs == codecs
    assert dec.header_repairs == 0
    assert RecordHeader.from_bytes(dec.header.to_bytes()) == dec.header


@given(written=U64, copy=st.integers(0, 2), byte=st.integers(0, 7), mask=st.integers(1, 255))
def test_a_damaged_write_time_in_one_copy_is_outvoted(written: int, copy: int, byte: int,
                                                      mask: int) -> None:
    rec = bytearray(record(written))
    rec[copy_offsets(bytes(rec))[copy] + WRITTEN_AT + byte] ^= mask
    dec = decode_record(rec)
    # (a damaged copy after the one used is not read, so not counted as a repair)
    assert dec.header.written_ns == written and dec.header_repairs >= (copy == 0)


@settings(max_examples=200)
@given(written=U64, flips=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 7),
                                             st.integers(1, 255)), min_size=1, max_size=6))
def test_a_damaged_write_time_is_never_misread(written: int,
                                               flips: list[tuple[int, int, int]]) -> None:
    """Damage to the field in any copies: the right time, or a typed error."""
    rec = bytearray(record(written))
    offs = copy_offsets(bytes(rec))
    for copy, byte, mask in flips:
        rec[offs[copy] + WRITTEN_AT + byte] ^= mask
    try:
        got = decode_record(rec).header.written_ns
    except IntegrityError:
        return
    assert got == written


def test_every_copy_damaged_in_a_different_byte_is_recovered_by_the_vote() -> None:
    """No copy verifies on its own; their bitwise majority does, with the exact time."""
    rec = bytearray(record(T0))
    for copy, off in enumerate(copy_offsets(bytes(rec))):
        rec[off + WRITTEN_AT + copy] ^= 0xFF
    dec = decode_record(rec)
    assert dec.header.written_ns == T0 and dec.header_repairs == 3


def test_the_version_byte_is_covered_by_the_header_checks() -> None:
    """A v2 record whose preludes all say v1 (or a v1 record saying v2) is corrupt, never a
    header read with the other layout."""
    for raw, lie in ((record(T0), 1), ((GOLDEN / "record_v1_float16.bin").read_bytes(), 2)):
        bad = bytearray(raw)
        for off in (0, 8, len(bad) - 8):
            bad[off + 4] = lie
        with pytest.raises(CorruptRecordError):
            decode_record(bad)
    bad = bytearray(record(T0))
    bad[4] = 1                                    # one prelude copy: outvoted
    assert decode_record(bad).header.written_ns == T0


@pytest.mark.parametrize("name", ["record_v1_float16", "record_v1_bfloat16", "record_v1_float32"])
def test_v1_records_have_no_write_time(name: str) -> None:
    raw = (GOLDEN / f"{name}.bin").read_bytes()
    assert raw[4] == 1
    assert decode_record(raw).header.written_ns is None


@pytest.mark.parametrize("bad", [0, -1, 1 << 64, True, 1.5])
def test_a_write_time_must_be_a_positive_u64(bad: object) -> None:
    with pytest.raises(InputError):
        RecordHeader(key=KEY, layer=0, fingerprint=FP, shape=(2, 1, 1, 1), dtype="float16",
                     data_len=0, payload_len=0, written_ns=bad)  # type: ignore[arg-type]


def test_a_v2_header_whose_field_is_checked_but_zero_reads_unknown() -> None:
    """0 is what an unstamped header stores: it reads back as unknown, not as 1970."""
    assert decode_record(record(None)).header.written_ns is None


# -- the index --------------------------------------------------------------------------------
def meta(written: tuple[int, ...] = ()) -> ChunkMeta:
    return ChunkMeta(b"", 0, 16, FP, (("dram", 10), ("nvme", 20), ("nvme", 30)),
                     written=written)


@given(st.lists(st.sampled_from([0, 1, T0, T0 + 5, (1 << 64) - 1]), min_size=3, max_size=3))
def test_index_write_times_round_trip(times: list[int]) -> None:
    m = meta(tuple(times))
    back = ChunkMeta.from_json(m.to_json())
    assert back == m
    assert [back.written_at(i) for i in range(3)] == times
    assert back.written == (() if not any(times) else tuple(times))


def test_index_entries_without_write_times_read_as_unknown() -> None:
    d = json.loads(meta().to_json())
    assert "w" not in d
    assert ChunkMeta.from_json(json.dumps(d).encode()).written == ()
    d = json.loads(meta((T0, 0, T0)).to_json())
    assert d["w"] == {"t": [T0], "l": [0, -1, 0]}


@pytest.mark.parametrize("w", [[T0], {"t": [T0]}, {"t": [T0], "l": [0, 0]},
                               {"t": [0], "l": [0, 0, 0]}, {"t": [1 << 64], "l": [0, 0, 0]},
                               {"t": [T0], "l": [0, 1, 0]}, {"t": ["1"], "l": [0, 0, 0]},
                               {"t": [T0], "l": [0, True, 0]}, {"t": [1.5], "l": [0, 0, 0]}])
def test_malformed_write_times_are_a_corrupt_entry(w: object) -> None:
    d = json.loads(meta().to_json())
    d["w"] = w
    with pytest.raises(CorruptStoreError):
        ChunkMeta.from_json(json.dumps(d).encode())


def test_new_blocks_forget_their_old_write_times() -> None:
    m = meta((T0, T0 + 1, T0 + 2))
    moved = m.with_(blocks=(("dram", 10), ("cxl", 20), ("nvme", 30)))
    assert moved.written == (T0, 0, T0 + 2)
    assert m.with_(pins=1).written == m.written


# -- the engine ---------------------------------------------------------------------------------
def header_time(e: Engine, tier: str, key: bytes, layer: int) -> int | None:
    rec = e.tiers[tier].get(block_key(key, layer))
    assert rec is not None
    return decode_record(rec).header.written_ns


def test_a_fake_clock_gives_exact_ages(tmp_path: Path) -> None:
    clock = FakeClock()
    with Engine.open(tmp_path / "s", local_config(16)) as e:
        e.clock = clock
        a, b = toks(32, 1), toks(16, 2)
        e.put(a, random_kv(SMALL, 32, 1), model=SMALL)
        clock.advance(90)
        e.put(b, random_kv(SMALL, 16, 2), model=SMALL)
        clock.advance(10.5)
        ages = list(e.block_ages())
        assert len(ages) == 3 * SMALL.n_layers and all(isinstance(x, BlockAge) for x in ages)
        want = {chunk_key(a, 0): 100.5, chunk_key(a, 1): 100.5, chunk_key(b): 10.5}
        for x in ages:
            assert x.age_s == want[x.key] and x.tier == "dram" and x.nbytes > 0
            assert x.written_ns == int(T0 + (100.5 - want[x.key]) * 1e9)
            assert header_time(e, "dram", x.key, x.layer) == x.written_ns
            assert x.at > 0
        assert list(e.block_ages("nvme")) == []
        tiers = e.stats()["tiers"]
        assert tiers["dram"]["ages"] == {"unknown": 0, "oldest_s": 100.5, "median_s": 100.5}
        assert tiers["nvme"]["ages"] == {"unknown": 0, "oldest_s": None, "median_s": None}
        with pytest.raises(Exception, match="no tier"):
            e.block_ages("tape")


@pytest.mark.parametrize("bad", [0, -5, 1.5e18])
def test_a_bad_clock_is_refused_before_anything_is_written(tmp_path: Path, bad: object) -> None:
    with Engine.open(tmp_path / "s", local_config(16)) as e:
        e.clock = lambda: bad  # type: ignore[assignment,return-value]
        with pytest.raises(InputError, match="clock"):
            e.put(toks(16), random_kv(SMALL, 16), model=SMALL)
        assert e.lookup(toks(16), model=SMALL) == 0


def test_write_times_survive_close_and_reopen(tmp_path: Path) -> None:
    clock = FakeClock()
    with Engine.open(tmp_path / "s", local_config(16)) as e:
        e.clock = clock
        e.put(toks(16), random_kv(SMALL, 16), model=SMALL)
    with Engine.open(tmp_path / "s") as e:
        e.clock = FakeClock(T0 + 7_000_000_000)
        assert {(x.written_ns, x.age_s) for x in e.block_ages()} == {(T0, 7.0)}


def test_a_repair_restarts_the_age(tmp_path: Path) -> None:
    cfg = local_config(16)
    cfg = replace(cfg, tiers=tuple(replace(t, ecc="rs(255,223)") for t in cfg.tiers))
    clock = FakeClock()
    with Engine.open(tmp_path / "s", cfg) as e:
        e.clock = clock
        t = toks(16)
        kv = random_kv(SMALL, 16)
        e.put(t, kv, model=SMALL)
        key = chunk_key(t)
        tier = e.tiers["dram"]
        rec = bytearray(tier.get(block_key(key, 1)) or b"")
        rec[decode_record(rec).header_bytes + 3] ^= 0x41
        tier.put(block_key(key, 1), rec)
        later = clock.advance(3600)
        got = e.get(t, model=SMALL)
        assert got.ok and got.counts["corrected"] == 1 and np.array_equal(got.kv, kv)
        assert header_time(e, "dram", key, 1) == later
        assert [header_time(e, "dram", key, i) for i in (0, 2)] == [T0, T0]
        clock.advance(1)
        ages = {x.layer: x.age_s for x in e.block_ages()}
        assert ages == {0: 3601.0, 1: 1.0, 2: 3601.0}
        assert e.verify().clean


def test_a_move_between_tiers_restarts_the_age(tmp_path: Path) -> None:
    with Engine.open(tmp_path / "probe", local_config(16)) as e0:
        one = e0.put(toks(16), random_kv(SMALL, 16), model=SMALL).bytes_written
    cfg = local_config(16, caps=(one, 1 << 30, 1 << 30), promote="never")
    clock = FakeClock()
    with Engine.open(tmp_path / "s", cfg) as e:
        e.clock = clock
        a, b = toks(16, 1), toks(16, 2)
        e.put(a, random_kv(SMALL, 16, 1), model=SMALL)
        demoted = clock.advance(60)
        e.put(b, random_kv(SMALL, 16, 2), model=SMALL)          # demotes a to cxl
        ka = chunk_key(a)
        mine = [x for x in e.block_ages() if x.key == ka]
        assert {(x.tier, x.written_ns) for x in mine} == {("cxl", demoted)}
        assert all(header_time(e, "cxl", ka, i) == demoted for i in range(SMALL.n_layers))
        promoted = clock.advance(30)
        e.prefetch(a, model=SMALL, tier="dram", hold=None).result(30)   # b goes down
        clock.advance(5)
        ages = {(x.key, x.tier, x.age_s) for x in e.block_ages()}
        assert ages == {(ka, "dram", 5.0), (chunk_key(b), "cxl", 5.0)}
        assert header_time(e, "dram", ka, 0) == promoted
        got = e.get(a, model=SMALL)
        assert got.ok and np.array_equal(got.kv, random_kv(SMALL, 16, 1))


@pytest.mark.parametrize("tarball", ["store_v1.tar.gz", "store_v2.tar.gz"])
def test_old_stores_open_with_unknown_ages(tmp_path: Path, tarball: str) -> None:
    """Stores of earlier releases (v1 records, index entries without write times): their
    blocks have no age until rewritten; a rewrite (a move) gives the block one."""
    with tarfile.open(GOLDEN / tarball) as tar:
        tar.extractall(tmp_path, filter="data")
    path = tmp_path / "store"
    with Engine.open(path, readonly=True) as e:
        ages = list(e.block_ages())
        assert ages and all(x.written_ns is None and x.age_s is None for x in ages)
        for t in e.stats()["tiers"].values():
            assert t["ages"] == {"unknown": t["blocks"], "oldest_s": None, "median_s": None}
    clock = FakeClock()
    with Engine.open(path) as e:
        e.clock = clock
        assert all(x.written_ns is None for x in e.block_ages())
        low = next(x for x in e.block_ages() if x.tier != e.core.order[0])
        assert header_time(e, low.tier, low.key, low.layer) is None    # a v1 record

        def promote(txn: Any, pending: Pending) -> bool:
            meta = e.core.index.get_chunk(txn, low.key)
            assert meta is not None
            return e.core.decisions.move(txn, low.key, meta, low.tier, e.core.order[0],
                                  Protected(set(), e.core.decisions, txn), pending, Counter(),
                                  Reason.PROMOTED)

        assert e.core.mutate(promote)
        got = {x.layer: x for x in e.block_ages() if x.key == low.key}
        assert all(x.written_ns == T0 and x.age_s == 0.0 for x in got.values())
        assert header_time(e, e.core.order[0], low.key, low.layer) == T0
        assert e.verify().clean


def test_checked_header_keeps_its_seal() -> None:
    """The write time sits inside the sealed header body (xxh3 over prelude and body)."""
    rec = record(T0)
    hlen = int.from_bytes(rec[6:8], "little")
    body = rec[16:16 + hlen - 8]
    assert int.from_bytes(body[WRITTEN_AT:WRITTEN_AT + 8], "little") == T0
    assert xxhash.xxh3_64_intdigest(rec[:8] + body) == int.from_bytes(
        rec[16 + hlen - 8:16 + hlen], "little")
