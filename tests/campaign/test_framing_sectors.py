"""Lost sectors against the record framing, enumerated exactly through the real decoder.

A shard-coded record on the nvme tier survives any two lost sectors in its payload (a shard
of at least a sector puts at most one byte of any column in one sector, and ``m = 2``). The
framing used to be the weak part: in layout v2 the last sector holds the checksum table,
header copy 2 and prelude copy 2, so the last sector and any other one lost the block (the
table's loss made column decoding unverifiable); with that fixed in the decoder, the first
sector (both leading preludes and header copies) and the last still did. Layout v3 spreads
the copies (copy 1 a sector after copy 0): no two sectors are fatal.

Every single sector and every pair is erased (zero-filled and reported, as the medium
reports a lost sector) at two alignments (the record at a sector boundary, and 16 bytes in,
as in an LMDB overflow page), decoded by ``decode_record`` + ``read_block``, and compared
with :func:`rkv.reliability.fatality.judge` on the same pattern: the model must say exactly what
the decoder does.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

from faultmodels.pattern import ErrorPattern
from rkv.codec.blockcodec import encode_block, read_block
from rkv.ecc.shardrs import ShardRSCodec
from rkv.errors import IntegrityError
from rkv.format.record import RecordHeader, decode_record, encode_record
from rkv.reliability.fatality import Layout, judge, layout_for

SECTOR = 4096


def record_of(shape: tuple[int, ...], spread: bool) -> tuple[bytes, np.ndarray, Layout]:
    codec = ShardRSCodec(16, 2)
    data = np.random.default_rng(7).standard_normal(shape).astype(np.float16)
    h = RecordHeader(key=bytes(range(32)), layer=3, fingerprint=bytes(16), shape=shape,
                     dtype="float16", data_len=0, payload_len=0, written_ns=12345)
    rec = bytes(encode_block(h, data, codec))
    dec = decode_record(rec)
    assert dec.header.spread == codec.spread_framing(data.nbytes)
    if not spread:
        rec = bytes(encode_record(replace(dec.header, spread=False), dec.payload))
    lay = layout_for(codec.spec, data.nbytes)
    if not spread:
        lay = replace(lay, spread=False, record=len(rec),
                      payload_off=decode_record(rec).header_bytes)
    assert lay.record == len(rec)
    return rec, data, lay


def ranges(secs: tuple[int, ...], shift: int, n: int) -> tuple[tuple[int, int], ...]:
    out = []
    for s in secs:
        a, b = max(0, s * SECTOR - shift), min(n, (s + 1) * SECTOR - shift)
        if b > a:
            out.append((a, b - a))
    return tuple(out)


def decoder_loses(rec: bytes, data: np.ndarray, lost: tuple[tuple[int, int], ...]) -> bool:
    bad = bytearray(rec)
    for a, n in lost:
        bad[a:a + n] = bytes(n)
    try:
        dec = decode_record(bytes(bad), expect_layer=3)
        out = np.empty_like(data)
        read_block(dec, out, lost)
    except IntegrityError:
        return True
    assert np.array_equal(out, data), "a decoded block must be exact"
    return False


def enumerate_losses(rec: bytes, data: np.ndarray, lay: Layout, shift: int
                     ) -> tuple[list[tuple[int, ...]], int]:
    """(fatal sector sets of size 1 and 2, patterns tried); asserts model == decoder."""
    n_sec = -(-(len(rec) + shift) // SECTOR)
    fatal, tried = [], 0
    for size in (1, 2):
        for secs in itertools.combinations(range(n_sec), size):
            lost = ranges(secs, shift, len(rec))
            truth = decoder_loses(rec, data, lost)
            model = judge(lay, ErrorPattern(len(rec), erasures=tuple(
                (a, n, "sector") for a, n in lost)))[0]
            assert model == float(truth), (secs, shift, truth, model)
            tried += 1
            if truth:
                fatal.append(secs)
    return fatal, tried


@pytest.mark.parametrize("shift", [0, 16])
def test_spread_layout_survives_any_two_lost_sectors(shift: int) -> None:
    # 64 KiB of data: shards of 4,104 bytes, just over a sector (the smallest spread block).
    rec, data, lay = record_of((2, 128, 2, 64), spread=True)
    assert lay.spread
    fatal, tried = enumerate_losses(rec, data, lay, shift)
    assert tried > 150 and fatal == []


@pytest.mark.parametrize("shift", [0, 16])
def test_v2_layout_loses_the_first_and_last_sector_together(shift: int) -> None:
    """Today's layout (v2, still read and written for other codes): the only fatal pair is
    the first sector (both leading preludes and header copies) with the last (copy 2)."""
    rec, data, lay = record_of((2, 128, 2, 64), spread=False)
    fatal, _ = enumerate_losses(rec, data, lay, shift)
    last = -(-(len(rec) + shift) // SECTOR) - 1
    assert fatal == [(0, last)]


def test_small_shards_are_not_spread() -> None:
    """Shards under a sector: one lost sector spans several shards of a column, no layout
    helps, and the record keeps the compact v2 framing."""
    codec = ShardRSCodec(16, 2)
    assert codec.shard_size(16 * 4096 - 200) < SECTOR <= codec.shard_size(16 * 4096 - 8)
    assert not codec.spread_framing(16 * 4096 - 200)
    assert codec.spread_framing(16 * 4096 - 8)
    assert not ShardRSCodec(16, 1).spread_framing(1 << 20)


@pytest.mark.slow
@pytest.mark.parametrize("shift", [0, 16])
def test_spread_layout_of_a_smollm2_block(shift: int) -> None:
    """The documented nvme point: a 192 KiB SmolLM2 block (256 tokens) under shardrs(16,2)."""
    rec, data, lay = record_of((2, 256, 3, 64), spread=True)
    fatal, _ = enumerate_losses(rec, data, lay, shift)
    assert fatal == []


def _bits_lose(rec: bytes, data: np.ndarray, bits: tuple[int, ...]) -> bool:
    bad = bytearray(rec)
    for b in bits:
        bad[b // 8] ^= 1 << (b % 8)
    try:
        dec = decode_record(bytes(bad), expect_layer=3)
        out = np.empty_like(data)
        read_block(dec, out)
    except IntegrityError:
        return True
    assert np.array_equal(out, data)
    return False


@pytest.mark.parametrize("exhaustive", [False, pytest.param(True, marks=pytest.mark.slow)])
@pytest.mark.parametrize("spread", [False, True])
def test_framing_bit_patterns_model_equals_decoder(spread: bool, exhaustive: bool) -> None:
    """Bit flips in the framing, judged by the fault model and decoded for real: pairs of
    prelude bits (none fatal; 1,500 sampled, all 18,336 under ``-m slow``), and 1,500
    triples shaped like the fatal ones plus 1,000 arbitrary ones over the preludes and
    header copies. The model must agree on each (it is what predict and importance sampling
    count)."""
    rec, data, lay = record_of((2, 128, 2, 64), spread=spread)
    hlen = lay.hlen
    from rkv.format.record import copy_offsets

    pre, heads = copy_offsets(hlen, len(rec), spread)
    pre_bits = [8 * o + i for o in pre for i in range(64)]
    head_bits = [8 * o + i for o in heads for i in range(8 * hlen)]

    def check(bits: tuple[int, ...]) -> bool:
        truth = _bits_lose(rec, data, bits)
        model = judge(lay, ErrorPattern(len(rec), flips=np.array(sorted(bits))))[0]
        assert model == float(truth), (bits, truth, model)
        return truth

    rng = np.random.default_rng(5)
    pairs = list(itertools.combinations(pre_bits, 2))
    if not exhaustive:
        pairs = [pairs[int(i)] for i in rng.choice(len(pairs), 1500, replace=False)]
    assert not any(check(p) for p in pairs)
    fatal = 0
    for _ in range(1500):       # same-bit pairs plus a third copy hit: the fatal shape
        region, n = (pre_bits, 64) if rng.random() < 0.5 else (head_bits, 8 * hlen)
        i, j = rng.choice(3, size=2, replace=False)
        bit = int(rng.integers(n))
        third = 3 - i - j
        other = int(rng.integers(n))
        fatal += check((region[i * n + bit], region[j * n + bit], region[third * n + other]))
    for _ in range(1000):       # any three framing bits
        pool = pre_bits + head_bits
        fatal += check(tuple(int(pool[k]) for k in rng.choice(len(pool), 3, replace=False)))
    assert fatal >= 700      # the shapes above are mostly fatal: the test sees both outcomes
