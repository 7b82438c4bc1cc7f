"""A stale but valid record of the same block is never returned as current.

Records are content-addressed by block key, so an older record of the same key verifies in
every other respect (key, layer, model, checksum, ECC). The index keeps each block's write
time, which the record's header carries too (``written_ns``): a read compares them, on the
fast path and in the full decode, and reports a mismatch as a :class:`StaleRecordError`
(an integrity failure: a miss), never ``ok``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rkvtest import SMALL, local_config, random_kv

from rkv import Engine
from rkv.codec.fastcheck import FastCheck
from rkv.errors import StaleRecordError
from rkv.format.keys import as_token_array, block_key, chunk_keys
from rkv.format.record import RecordHeader, decode_record, encode_array_record
from rkv.store.readpath import ReadPath
from rkv.store.results import OK, UNCORRECTABLE

CHUNK = 16
TOKENS = np.arange(3 * CHUNK)


def records_of(e: Engine, tokens: np.ndarray) -> dict[tuple[str, bytes], bytes]:
    """Every block record of ``tokens``' chunks, by (tier, block key), copied."""
    keys = chunk_keys(as_token_array(tokens), SMALL.fingerprint(), CHUNK)
    out = {}
    for name, tier in e.tiers.items():
        for k in keys:
            for layer in range(SMALL.n_layers):
                rec = tier.get(block_key(k, layer))
                if rec is not None:
                    out[name, block_key(k, layer)] = rec
    return out


def test_a_record_handed_back_after_delete_and_re_put_is_stale(tmp_path: Path) -> None:
    old_kv, new_kv = random_kv(SMALL, len(TOKENS), seed=1), random_kv(SMALL, len(TOKENS), seed=2)
    with Engine.open(tmp_path / "s", local_config(CHUNK)) as e:
        e.put(TOKENS, old_kv, model=SMALL)
        old = records_of(e, TOKENS)
        e.delete(TOKENS, model=SMALL)
        e.put(TOKENS, new_kv, model=SMALL)
        assert np.array_equal(e.get(TOKENS, model=SMALL).kv, new_kv)
        # The medium hands back the old record of chunk 1, layer 0 (a lost write, a
        # remapped sector, a backup restored over the live file).
        (tier, bkey), rec = sorted(old.items())[0]
        stale_chunk = next(i for i, k in enumerate(
            chunk_keys(as_token_array(TOKENS), SMALL.fingerprint(), CHUNK))
            if any(bkey == block_key(k, layer) for layer in range(SMALL.n_layers)))
        e.tiers[tier].put(bkey, rec)
        got = e.get(TOKENS, model=SMALL)
        assert got.n_tokens == stale_chunk * CHUNK
        assert np.array_equal(got.kv, new_kv[:, :, :got.n_tokens])
        bad = [b for b in got.blocks if b.status != OK]
        assert [b.status for b in bad] == [UNCORRECTABLE]
        assert isinstance(bad[0].error, StaleRecordError)
        with pytest.raises(StaleRecordError):
            e.get(TOKENS, model=SMALL, strict=True)
        rep = e.verify()
        assert rep.uncorrectable == 1 and "StaleRecordError" in rep.problems[0][3]


def test_the_stream_refuses_a_stale_record_too(tmp_path: Path) -> None:
    with Engine.open(tmp_path / "s", local_config(CHUNK)) as e:
        e.put(TOKENS, random_kv(SMALL, len(TOKENS), seed=1), model=SMALL)
        old = records_of(e, TOKENS)
        e.delete(TOKENS, model=SMALL)
        e.put(TOKENS, random_kv(SMALL, len(TOKENS), seed=2), model=SMALL)
        for (tier, bkey), rec in old.items():     # every block handed back stale
            e.tiers[tier].put(bkey, rec)
        stream = e.get_layers(TOKENS, model=SMALL)
        layers = list(stream)
        assert stream.n_tokens == 0
        assert any(isinstance(b.error, StaleRecordError) for b in layers[0].blocks)


@settings(max_examples=60, deadline=None)
@given(stamp=st.integers(1, 2**64 - 2), other=st.integers(1, 2**64 - 1), same=st.booleans())
def test_fast_check_and_full_decode_agree_on_the_write_time(stamp: int, other: int,
                                                            same: bool) -> None:
    """Differential: the fast path accepts a record only if the full decode does, for any
    write time in the index against any in the record."""
    written = stamp if same else other
    key, fp = bytes(range(32)), SMALL.fingerprint()
    block = random_kv(SMALL, CHUNK)[0]
    header = RecordHeader(key=key, layer=0, fingerprint=fp, shape=block.shape,
                          dtype=SMALL.dtype, data_len=0, payload_len=0, written_ns=stamp)
    rec = bytes(encode_array_record(header, block))
    dec = decode_record(rec)
    assert dec.header.written_ns == stamp
    dest = np.zeros_like(block)
    fast = FastCheck(key, fp, SMALL, CHUNK).copy(rec, 0, len(rec), dest, written)
    try:
        ReadPath.verify_into(rec, key, 0, fp, SMALL, CHUNK, dest.copy(), len(rec), (), written)
        full = True
    except StaleRecordError:
        full = False
    # Older than the index's write: stale. Later: a rewrite the read's index snapshot
    # predates, accepted by the full decode (the fast path declines anything but equal).
    assert full == (stamp >= written)
    assert fast == (stamp == written)
    if fast:
        assert np.array_equal(dest, block)
