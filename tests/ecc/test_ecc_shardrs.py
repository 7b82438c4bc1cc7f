"""Shard-level Reed-Solomon: layout, erasure recovery, column decoding, checksum damage."""

from __future__ import annotations

import itertools

import google_crc32c
import numpy as np
import pytest
import reedsolo
import xxhash
from ecc_helpers import rand_bytes
from hypothesis import given, settings
from hypothesis import strategies as st

from rkv.ecc import ShardRSCodec, get_codec
from rkv.ecc.gf import gf256_inv, gf256_matmul, rs_parity_matrix


def shardrs(k: int, m: int, checksum: str = "xxh3") -> ShardRSCodec:
    c = get_codec({"id": "shardrs", "k": k, "m": m, "checksum": checksum})
    assert isinstance(c, ShardRSCodec)
    return c


def shard_view(c: ShardRSCodec, enc: bytes, size: int) -> np.ndarray:
    s = c.shard_size(size)
    return np.frombuffer(enc[: c.n * s], np.uint8).reshape(c.n, s)


def damage(enc: bytes, c: ShardRSCodec, size: int, shards: list[int], rng: np.random.Generator,
           how: str = "random") -> bytes:
    s = c.shard_size(size)
    b = np.frombuffer(enc, np.uint8).copy()
    for j in shards:
        seg = b[j * s : (j + 1) * s]
        if how == "random":
            seg[:] = rng.integers(0, 256, s, dtype=np.uint8)
        elif how == "zero":
            seg[:] = 0
        else:
            seg[int(rng.integers(0, s))] ^= np.uint8(1 + rng.integers(0, 255))
    return b.tobytes()


@pytest.mark.parametrize(("k", "m"), [(1, 1), (2, 1), (4, 2), (16, 2), (10, 3), (8, 4), (5, 8),
                                      (200, 2), (100, 20)])
def test_columns_are_reedsolo_codewords(k: int, m: int) -> None:
    c = shardrs(k, m)
    ref = reedsolo.RSCodec(m, nsize=255)
    rng = np.random.default_rng(k * 31 + m)
    size = 8 * k + 13
    enc = c.encode(rand_bytes(rng, size))
    sh = shard_view(c, enc, size)
    for col in range(sh.shape[1]):
        cw = sh[:, col].tobytes()
        assert bytes(ref.encode(cw[:k])) == cw


def test_parity_matrix_inverts() -> None:
    p = rs_parity_matrix(6, 3)
    g = np.concatenate([np.eye(6, dtype=np.uint8), p])
    for surv in itertools.combinations(range(9), 6):
        sub = g[list(surv)]
        eye = gf256_matmul(sub, gf256_inv(sub))
        assert (eye == np.eye(6, dtype=np.uint8)).all()


@pytest.mark.parametrize("checksum", ["xxh3", "crc32c"])
def test_layout(checksum: str) -> None:
    c = shardrs(4, 2, checksum)
    data = bytes(range(50))
    enc = c.encode(data)
    s = c.shard_size(50)
    assert s == 16 and 4 * s >= 50 + 8
    assert enc[:50] == data
    assert enc[50 : 4 * s - 8] == bytes(4 * s - 8 - 50)
    assert int.from_bytes(enc[4 * s - 8 : 4 * s], "little") == 50
    cs = 8 if checksum == "xxh3" else 4
    assert len(enc) == 6 * (s + cs)
    for j in range(6):
        shard = enc[j * s : (j + 1) * s]
        stored = enc[6 * s + j * cs : 6 * s + (j + 1) * cs]
        want = (xxhash.xxh3_64_intdigest(shard) if cs == 8 else google_crc32c.value(shard))
        assert int.from_bytes(stored, "little") == want


@pytest.mark.parametrize(("k", "m"), [(4, 2), (6, 3), (3, 4), (16, 2), (1, 1), (2, 5)])
@pytest.mark.parametrize("how", ["random", "zero", "byte"])
def test_recovers_any_m_lost_shards(k: int, m: int, how: str) -> None:
    c = shardrs(k, m)
    rng = np.random.default_rng(k + 10 * m)
    size = 1000
    data = rand_bytes(rng, size)
    enc = c.encode(data)
    combos = list(itertools.combinations(range(k + m), m))
    for lost in combos[:: max(1, len(combos) // 12)]:
        bad = damage(enc, c, size, list(lost), rng, how)
        res = c.decode(bad)
        assert res.status == "corrected" and res.data == data
        diff = np.frombuffer(bad, np.uint8)[: c.n * c.shard_size(size)] != np.frombuffer(
            enc, np.uint8)[: c.n * c.shard_size(size)]
        assert res.n_corrected == int(diff.sum())


def test_more_than_m_lost_shards_is_uncorrectable() -> None:
    c = shardrs(8, 2)
    rng = np.random.default_rng(1)
    data = rand_bytes(rng, 5000)
    enc = c.encode(data)
    for lost in ([0, 1, 2], [3, 8, 9], [0, 4, 7, 9]):
        res = c.decode(damage(enc, c, 5000, lost, rng))
        assert res.status == "uncorrectable" and res.data == b""


def test_scattered_errors_column_by_column() -> None:
    """Every shard damaged (more than m failing checksums), but at most floor(m/2) bad
    bytes per column: corrected column by column."""
    c = shardrs(10, 4)
    rng = np.random.default_rng(2)
    size = 4000
    data = rand_bytes(rng, size)
    enc = c.encode(data)
    s = c.shard_size(size)
    b = np.frombuffer(enc, np.uint8).copy()
    cols = rng.permutation(s)
    n_bad = 0
    for j in range(c.n):  # shard j gets errors in its own set of columns (2 shards per col)
        for col in cols[(j // 2) * 20 : (j // 2) * 20 + 20]:
            b[j * s + col] ^= np.uint8(rng.integers(1, 256))
            n_bad += 1
    res = c.decode(b.tobytes())
    assert res.status == "corrected" and res.data == data and res.n_corrected == n_bad


def test_checksum_table_damage() -> None:
    c = shardrs(4, 2)
    data = b"payload" * 20
    enc = c.encode(data)
    s = c.shard_size(len(data))
    b = bytearray(enc)
    b[6 * s + 3] ^= 0xFF  # checksum of shard 0
    b[6 * s + 8 * 5] ^= 1  # checksum of shard 5
    res = c.decode(bytes(b))
    assert res.status == "corrected" and res.data == data and res.n_corrected == 0
    # the whole table gone: content is intact, but > m shards fail and nothing can vouch
    b = bytearray(enc)
    b[6 * s :] = bytes(len(b) - 6 * s)
    assert c.decode(bytes(b)).status == "uncorrectable"


@pytest.mark.parametrize(("k", "m", "entries"), [(8, 2, [1]), (8, 2, [9]), (16, 2, [0, 17]),
                                                (10, 4, [2, 3, 11])])
def test_damaged_checksum_entries_never_cost_a_correctable_block(k: int, m: int,
                                                                 entries: list[int]) -> None:
    """More than m shards damaged (so the erasure path cannot be used), each column
    correctable, and up to m checksum entries damaged as well: corrected, exactly. (Issue
    13: one flipped bit in the checksum table used to make such a block a DUE.)"""
    c = shardrs(k, m)
    rng = np.random.default_rng(k * 10 + m)
    size = 6000
    data = rand_bytes(rng, size)
    enc = c.encode(data)
    s = c.shard_size(size)
    b = np.frombuffer(enc, np.uint8).copy()
    for j in range(m + 1):                   # m + 1 damaged shards, in distinct columns
        b[j * s + 7 * j + 1] ^= np.uint8(rng.integers(1, 256))
    for e in entries:                        # and damaged checksum entries
        b[c.n * s + 8 * e + 2] ^= np.uint8(1 << (e % 8))
    res = c.decode(b.tobytes())
    assert res.status == "corrected" and res.data == data
    # One entry more than m and fewer than k shards can vouch: reported, never guessed.
    for e in range(m + 1):
        b[c.n * s + 8 * (c.n - 1 - e) + 5] ^= 0x10
    bad = c.decode(b.tobytes())
    assert bad.status == "uncorrectable" or bad.data == data


def test_length_field_damage() -> None:
    c = shardrs(4, 2)
    data = b"x" * 100
    enc = c.encode(data)
    s = c.shard_size(100)
    b = bytearray(enc)
    b[4 * s - 8 : 4 * s] = (10**12).to_bytes(8, "little")
    assert c.systematic_data(bytes(b)) is None
    assert c.decode(bytes(b)).data == data


def test_erasure_offsets_mark_shards_lost() -> None:
    c = shardrs(4, 2)
    rng = np.random.default_rng(3)
    data = rand_bytes(rng, 300)
    enc = c.encode(data)
    s = c.shard_size(300)
    res = c.decode(enc, erasures=[5, 2 * s + 1])  # shards 0 and 2, content fine
    assert res.status == "corrected" and res.data == data and res.n_corrected == 0
    bad = damage(enc, c, 300, [0, 1], rng)
    assert c.decode(bad, erasures=[3 * s]).status == "uncorrectable"  # 3 lost > m


@pytest.mark.parametrize("checksum", ["xxh3", "crc32c"])
@settings(max_examples=40)
@given(st.data())
def test_random_shard_losses(checksum: str, draw: st.DataObject) -> None:
    k = draw.draw(st.integers(1, 12))
    m = draw.draw(st.integers(1, 5))
    c = shardrs(k, m, checksum)
    data = draw.draw(st.binary(max_size=2000))
    enc = c.encode(data)
    nlost = draw.draw(st.integers(0, m))
    lost = draw.draw(st.lists(st.integers(0, k + m - 1), min_size=nlost, max_size=nlost,
                              unique=True))
    rng = np.random.default_rng(draw.draw(st.integers(0, 2**32 - 1)))
    how = draw.draw(st.sampled_from(["random", "zero", "byte"]))
    bad = damage(enc, c, len(data), lost, rng, how)
    res = c.decode(bad)
    assert res.data == data
    assert res.status == ("corrected" if bad != enc else "clean")


@settings(max_examples=40)
@given(st.data())
def test_beyond_capability_never_lies(draw: st.DataObject) -> None:
    k = draw.draw(st.integers(1, 10))
    m = draw.draw(st.integers(1, 4))
    c = shardrs(k, m)
    data = draw.draw(st.binary(min_size=1, max_size=1500))
    enc = c.encode(data)
    nlost = draw.draw(st.integers(m + 1, k + m))
    lost = draw.draw(st.lists(st.integers(0, k + m - 1), min_size=nlost, max_size=nlost,
                              unique=True))
    rng = np.random.default_rng(draw.draw(st.integers(0, 2**32 - 1)))
    res = c.decode(damage(enc, c, len(data), lost, rng, draw.draw(st.sampled_from(
        ["random", "byte"]))))
    assert res.data == data or (res.status == "uncorrectable" and res.data == b"")
