"""The fatality evaluator of clustered fault classes against the real read path: a pattern
is fatal exactly when the record, damaged by it, no longer reads back."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import faultmodels
from rkv.codec.blockcodec import encode_block, read_block
from rkv.codec.stages import codec_for
from rkv.errors import IntegrityError
from rkv.format.record import RecordHeader, decode_record
from rkv.reliability.fatality import _all_hit, _copies_lost, is_fatal, layout_for

SHAPE = (2, 64, 2, 64)          # 32 KiB of float16: several codewords, shards and chunks


def reads_back(record: np.ndarray, want: np.ndarray,
               erased: tuple[tuple[int, int], ...] = ()) -> bool:
    try:
        dec = decode_record(record)
        out = np.empty_like(want)
        read_block(dec, out, erased)
    except IntegrityError:
        return False
    return bool(np.array_equal(out, want))


@pytest.mark.parametrize("preset", ["nvme-tlc", "dram-ddr5", "cxl"])
@pytest.mark.parametrize("protection", ["none", "rs(255,239)", "rs(255,239,interleave=8)",
                                        "bch(m=13,t=8)", "shardrs(k=8,m=2)"])
def test_is_fatal_agrees_with_the_read_path(preset: str, protection: str) -> None:
    rng = np.random.default_rng(7)
    data = rng.standard_normal(SHAPE).astype(np.float16)
    codec = codec_for(protection)
    header = RecordHeader(key=bytes(32), layer=0, fingerprint=bytes(16), shape=SHAPE,
                          dtype="float16", data_len=0, payload_len=0)
    record = np.frombuffer(bytes(encode_block(header, data, codec)), dtype=np.uint8)
    lay = layout_for(protection, data.nbytes)
    assert lay.record == record.size
    model = faultmodels.get_model(preset)
    classes = [c for c in model.event_classes(record.size, 24.0)
               if c.rate.kind != "bit" and c.log_p0 != 0.0]
    seen = {True: 0, False: 0}
    for cls in classes:
        for _ in range(25):
            pattern = cls.draw_nonzero(rng)
            if pattern.lost or pattern.transient:
                continue
            damaged = record.copy()
            pattern.apply(damaged, rng)
            # What the reader gets: the medium's report, the lost ranges zero-filled.
            erased = tuple((s, n) for s, n, _ in pattern.erasures)
            for s, n in erased:
                damaged[s:s + n] = 0
            fatal = is_fatal(lay, pattern)
            if 0.0 < fatal < 1.0:
                continue    # a BCH chunk beyond its erasure guarantee: data-dependent
            assert bool(fatal) == (not reads_back(damaged, data, erased)), (
                cls.rate.label, pattern.erasures)
            seen[bool(fatal)] += 1
    assert seen[True] + seen[False] >= 25      # (some presets kill every 32 KiB record)


@given(flips=st.lists(st.integers(0, 8 * 96 - 1), max_size=12),
       erased=st.lists(st.tuples(st.integers(0, 95), st.integers(1, 8)), max_size=3))
def test_the_cheap_copy_test_never_changes_the_vote(flips: list[int],
                                                     erased: list[tuple[int, int]]) -> None:
    """``judge`` asks ``_all_hit`` before the bit-level vote: every pattern the vote calls
    lost must pass it (three copies of 16 bytes at 0, 40 and 80 of a 96-byte record)."""
    f = np.asarray(sorted(set(flips)), dtype=np.int64)
    er = np.zeros(96, dtype=bool)
    for s, n in erased:
        er[s:s + n] = True
    wrong = er.copy()
    wrong[f // 8] = True
    starts = (0, 40, 80)
    if _copies_lost(f, er, starts, 16):
        assert _all_hit(wrong, starts, 16)
    assert _all_hit(wrong, starts, 16) == all(
        bool(er[s:s + 16].any()) or bool(((f >= 8 * s) & (f < 8 * (s + 16))).any())
        for s in starts)
