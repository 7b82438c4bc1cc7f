"""Erasures at the capability limit: what the medium reports unreadable is rebuilt where an
errors-only decoder, handed the same bytes without their positions, gives up.

RS erasure decoding has its own property tests (test_ecc_rs.py); here BCH's two-fill
decoding and shard RS's column decoding with erased shards, plus the bound they reach.
"""

from __future__ import annotations

import numpy as np
from ecc_helpers import rand_bytes
from hypothesis import given, settings
from hypothesis import strategies as st

from rkv.ecc import get_codec


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 8), st.data())
def test_bch_errors_and_erasures_within_2e_plus_f_le_2t(seed: int, t: int,
                                                         draw: st.DataObject) -> None:
    """Any e unknown bit errors and f erased bits (whole bytes) with 2e + f <= 2t in a chunk
    are corrected exactly, whatever the medium returned in the erased bytes."""
    c = get_codec(f"bch(m=13,t={t},chunk_bytes=64)")
    rng = np.random.default_rng(seed)
    data = rand_bytes(rng, 200)            # 4 chunks, the last one short
    enc = np.frombuffer(c.encode(data), np.uint8).copy()
    size = len(data)
    chunk = draw.draw(st.integers(0, 3))
    lo, hi = chunk * 64, min(size, chunk * 64 + 64)
    f_bytes = draw.draw(st.integers(0, t // 4))          # 8 f <= 2t
    e = draw.draw(st.integers(0, (2 * t - 8 * f_bytes) // 2))
    where = rng.choice(np.arange(lo, hi), size=f_bytes + e, replace=False)
    erased, errs = where[:f_bytes], where[f_bytes:]
    enc[erased] = rng.integers(0, 256, f_bytes, dtype=np.uint8)   # garbage
    enc[errs] ^= (1 << rng.integers(0, 8, e)).astype(np.uint8)
    res = c.decode(enc, erasures=erased.tolist())
    assert res.ok and res.data == data


def test_bch_erasures_beat_errors_only_at_the_limit() -> None:
    """2t erased bits, all of them wrong: twice what an errors-only decoder corrects."""
    t = 8
    c = get_codec(f"bch(m=13,t={t},chunk_bytes=64)")
    rng = np.random.default_rng(5)
    data = rand_bytes(rng, 64)
    enc = np.frombuffer(c.encode(data), np.uint8).copy()
    erased = np.array([3, 40])                            # 16 bits = 2t
    enc[erased] ^= 0xFF
    assert not c.decode(enc).ok or c.decode(enc).data != data
    res = c.decode(enc, erasures=erased.tolist())
    assert res.ok and res.data == data and res.n_corrected >= 16


def test_bch_erasures_in_the_ecc_bytes() -> None:
    c = get_codec("bch(m=13,t=4,chunk_bytes=64)")
    rng = np.random.default_rng(6)
    data = rand_bytes(rng, 128)
    enc = np.frombuffer(c.encode(data), np.uint8).copy()
    eras = [128 + c.ecc_bytes + 1]                        # one ecc byte of chunk 1
    enc[eras] ^= 0xFF
    enc[70] ^= 0x01                                       # and a data bit of chunk 1
    res = c.decode(enc, erasures=eras)
    assert res.ok and res.data == data


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(2, 6), st.data())
def test_shardrs_columns_with_erased_shards(seed: int, m: int, draw: st.DataObject) -> None:
    """More than m shards fail their checksums, so recovery by erasure alone is impossible;
    column decoding with the f shards the medium reported as erasures fixes every column
    with 2e + f <= m unknown errors e."""
    k = 6
    c = get_codec(f"shardrs(k={k},m={m})")
    rng = np.random.default_rng(seed)
    data = rand_bytes(rng, 3000)
    enc = np.frombuffer(c.encode(data), np.uint8).copy()
    s = c.shard_size(len(data))
    f = draw.draw(st.integers(1, m))
    e = (m - f) // 2
    shards = rng.permutation(k + m)
    gone, others = shards[:f], shards[f:]
    for j in gone:
        enc[j * s:(j + 1) * s] = 0                        # the medium returned nothing
    # m + 1 - f other shards get hit, so m + 1 shards fail their checksums in all.
    hit = others[: m + 1 - f]
    if e == 0:
        # No room for unknown errors: damage the checksum entries of intact shards instead
        # (they fail their checksums too; column decoding must see through that).
        base = (k + m) * s
        cs = (enc.size - base) // (k + m)
        enc[base + hit * cs] ^= 0xFF
    else:
        # Distinct columns, e hit shards per column: at most e bad bytes in any column (two
        # independent draws of the same column would put 2e there, past what m allows).
        cols = rng.choice(s, size=-(-hit.size // e), replace=False)
        for i, j in enumerate(hit):
            enc[j * s + cols[i // e]] ^= 0x5A
    res = c.decode(enc, erasures=[int(j * s + i) for j in gone for i in range(s)])
    assert res.ok and res.data == data


def test_shardrs_erasures_beat_errors_only() -> None:
    """Two shards lost (reported) and three with one bad byte each in different columns: five
    failing shards > m = 4, and column decoding without the erasures fails."""
    c = get_codec("shardrs(k=8,m=4)")
    rng = np.random.default_rng(1)
    data = rand_bytes(rng, 100_000)
    enc = np.frombuffer(c.encode(data), np.uint8).copy()
    s = c.shard_size(len(data))
    enc[: 2 * s] = 0
    for j, col in ((2, 5), (3, 7), (4, 9)):
        enc[j * s + col] ^= 0xFF
    assert not c.decode(enc).ok
    res = c.decode(enc, erasures=range(2 * s))
    assert res.ok and res.data == data


def test_shardrs_partly_erased_shards_count_per_column() -> None:
    """Three shards (> m = 2) lose a range each, at columns that do not overlap: every column
    has at most one erasure, so the block is rebuilt (as a lost 4 KiB sector in each of three
    large shards is)."""
    c = get_codec("shardrs(k=8,m=2)")
    rng = np.random.default_rng(2)
    data = rand_bytes(rng, 120_000)
    enc = np.frombuffer(c.encode(data), np.uint8).copy()
    s = c.shard_size(len(data))
    eras = []
    for j, lo in ((1, 0), (4, 3000), (6, 9000)):
        enc[j * s + lo:j * s + lo + 2000] = 0
        eras += range(j * s + lo, j * s + lo + 2000)
    res = c.decode(enc, erasures=eras)
    assert res.ok and res.data == data
    enc[6 * s + 1000] ^= 1                   # column 1000: shard 1 erased, two bad bytes
    enc[4 * s + 1000] ^= 1                   # elsewhere: 2e + f = 5 > m
    assert not c.decode(enc, erasures=eras).ok
