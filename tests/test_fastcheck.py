"""The read path's fast check against the full decode, on the same bytes.

``FastCheck.copy`` may accept a record only when the full decode (header vote, identity,
checksum) would call it plainly ok (no repair) and give the same data; whenever it declines,
the caller's buffer is untouched (the full decode then judges the record).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from rkvtest import SMALL, random_kv

from rkv.codec.fastcheck import FastCheck
from rkv.errors import IntegrityError
from rkv.format.record import RecordHeader, decode_record, encode_array_record, framing_sizes
from rkv.store.readpath import ReadPath

KEY, FP = bytes(range(32)), SMALL.fingerprint()
N_TOKENS = 5


def _record(layer: int, seed: int = 0) -> tuple[bytes, np.ndarray]:
    kv = random_kv(SMALL, N_TOKENS, seed=seed)[layer]
    header = RecordHeader(key=KEY, layer=layer, fingerprint=FP,
                          shape=SMALL.block_shape(N_TOKENS), dtype=SMALL.dtype, data_len=0,
                          payload_len=0, written_ns=1_700_000_000_000_000_000)
    return bytes(encode_array_record(header, kv)), kv


def _full(rec: bytes, layer: int) -> tuple[bool, np.ndarray | None]:
    """(plainly ok, data) by the full decode; (False, None) when it rejects the record."""
    dest = np.zeros((2, N_TOKENS, SMALL.n_kv_heads, SMALL.head_dim), np.float16)
    try:
        repairs, corrected, degraded = ReadPath.verify_into(
            rec, KEY, layer, FP, SMALL, N_TOKENS, dest, len(rec))
    except IntegrityError:
        return False, None
    return repairs == corrected == degraded == 0, dest


@pytest.mark.parametrize("layer", [0, 2])
def test_a_clean_record_is_copied(layer: int) -> None:
    rec, kv = _record(layer)
    dest = np.zeros_like(kv)
    assert FastCheck(KEY, FP, SMALL, N_TOKENS).copy(memoryview(rec), layer, len(rec), dest)
    assert np.array_equal(dest, kv)


def test_the_wrong_layer_key_or_size_is_declined() -> None:
    rec, kv = _record(1)
    dest = np.zeros_like(kv)
    check = FastCheck(KEY, FP, SMALL, N_TOKENS)
    assert not check.copy(rec, 0, len(rec), dest)
    assert not check.copy(rec, 1, len(rec) + 1, dest)
    assert not check.copy(rec + b"\0", 1, len(rec) + 1, dest)
    assert not FastCheck(bytes(32), FP, SMALL, N_TOKENS).copy(rec, 1, len(rec), dest)
    assert not FastCheck(KEY, FP, SMALL, N_TOKENS + 1).copy(rec, 1, len(rec), dest)
    assert not dest.any()


@given(st.data())
def test_accepted_only_where_the_full_decode_says_ok_with_the_same_data(data: st.DataObject
                                                                          ) -> None:
    layer = data.draw(st.integers(0, SMALL.n_layers - 1))
    rec, kv = _record(layer, seed=data.draw(st.integers(0, 3)))
    bad = bytearray(rec)
    _, hlen = framing_sizes(decode_record(rec).header)
    # Anywhere, or in the first header copy (the one the fast check reads) or its preludes.
    where = st.one_of(st.integers(0, len(bad) - 1), st.integers(0, 16 + hlen - 1))
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(where)
        bad[at] ^= data.draw(st.integers(1, 255))
    dest = np.zeros_like(kv)
    took = FastCheck(KEY, FP, SMALL, N_TOKENS).copy(memoryview(bytes(bad)), layer, len(bad),
                                                    dest)
    ok, full = _full(bytes(bad), layer)
    if took:
        assert ok and full is not None and np.array_equal(dest, full)
        assert np.array_equal(dest, kv)
    else:
        assert not dest.any()
