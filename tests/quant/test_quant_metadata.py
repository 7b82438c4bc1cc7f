"""Metadata protection: three checksummed copies of scales and zero points, majority vote."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from quant_helpers import make_block, same_values

from rkv.errors import CorruptRecordError
from rkv.quant import CLEAN, CORRECTED, KiviQuantizer

CASES = [
    ("float16", 4, 4, (2, 9, 2, 8)),
    ("bfloat16", 2, 3, (2, 5, 1, 5)),
    ("float32", 8, 32, (2, 3, 2, 4)),
]


def damage(enc: bytes, positions: list[int], xor: list[int]) -> bytes:
    b = bytearray(enc)
    for p, v in zip(positions, xor, strict=True):
        b[p] ^= v
    return bytes(b)


def setup(dtype: str, bits: int, group: int, shape: tuple[int, ...]):  # type: ignore[no-untyped-def]
    q = KiviQuantizer(bits, group)
    x = make_block(11, shape, dtype, "normal")
    enc = q.encode(x)
    lay = q.layout(shape, dtype)
    ref = q.decode(enc, shape, dtype)
    return q, enc, lay, ref


@pytest.mark.parametrize(("dtype", "bits", "group", "shape"), CASES)
def test_every_byte_of_one_copy(dtype: str, bits: int, group: int,
                                shape: tuple[int, ...]) -> None:
    """Any corruption of any single byte of any one copy is repaired exactly."""
    q, enc, lay, ref = setup(dtype, bits, group, shape)
    rng = np.random.default_rng(0)
    for c, off in enumerate(lay.copy_offsets):
        for pos in range(off, off + lay.copy_len):
            bad = damage(enc, [pos], [int(rng.integers(1, 256))])
            res = q.decode_result(bad, shape, dtype)
            assert same_values(res.array, ref), (c, pos - off)
            assert res.status == (CLEAN if c else CORRECTED)
            ok = q.metadata_copies_ok(bad, shape, dtype)
            assert ok == tuple(i != c for i in range(3))


@pytest.mark.parametrize(("dtype", "bits", "group", "shape"), CASES)
def test_same_bytes_in_two_copies(dtype: str, bits: int, group: int,
                                  shape: tuple[int, ...]) -> None:
    """Two copies damaged at the same bytes, with the same pattern: the third copy's
    checksum verifies and it is used, so the values are still exact."""
    q, enc, lay, ref = setup(dtype, bits, group, shape)
    cl = lay.copy_len
    for a, b in ((0, 1), (0, 2), (1, 2)):
        for rel in range(0, cl, 3):
            pos = [lay.copy_offsets[a] + rel, lay.copy_offsets[b] + rel]
            bad = damage(enc, pos, [0x5A, 0x5A])
            res = q.decode_result(bad, shape, dtype)
            assert same_values(res.array, ref)
            assert res.status == (CORRECTED if a == 0 else CLEAN)


@pytest.mark.parametrize(("dtype", "bits", "group", "shape"), CASES)
def test_all_three_copies_damaged(dtype: str, bits: int, group: int,
                                  shape: tuple[int, ...]) -> None:
    q, enc, lay, ref = setup(dtype, bits, group, shape)
    cl = lay.copy_len
    o0, o1, o2 = lay.copy_offsets
    for rel in range(0, cl, 2):
        # different bytes in each copy: the bitwise majority is the original
        other = (rel + 1) % cl
        third = (rel + 2) % cl
        bad = damage(enc, [o0 + rel, o1 + other, o2 + third], [0xFF, 0x01, 0x80])
        res = q.decode_result(bad, shape, dtype)
        assert same_values(res.array, ref)
        assert res.status == CORRECTED and "majority" in res.detail
        # the same byte, different bits in each copy: the majority is still the original
        bad = damage(enc, [o0 + rel, o1 + rel, o2 + rel], [0x01, 0x02, 0x0C])
        assert same_values(q.decode(bad, shape, dtype), ref)
        # the same bit flipped in all three copies: unrecoverable, never wrong values
        bad = damage(enc, [o0 + rel, o1 + rel, o2 + rel], [0x10, 0x10, 0x10])
        with pytest.raises(CorruptRecordError):
            q.decode(bad, shape, dtype)


@settings(max_examples=200)
@given(st.sampled_from(range(len(CASES))), st.lists(
    st.tuples(st.integers(0, 2), st.integers(0, 10_000), st.integers(1, 255)),
    min_size=1, max_size=12))
def test_metadata_damage_never_gives_wrong_values(case: int,
                                                  hits: list[tuple[int, int, int]]) -> None:
    """Whatever happens to the metadata copies: the exact block, or CorruptRecordError."""
    dtype, bits, group, shape = CASES[case]
    q, enc, lay, ref = setup(dtype, bits, group, shape)
    pos = [lay.copy_offsets[c] + r % lay.copy_len for c, r, _ in hits]
    xor = [v for _, _, v in hits]
    b = bytearray(enc)
    for p, v in zip(pos, xor, strict=True):
        b[p] ^= v
    try:
        got = q.decode(bytes(b), shape, dtype)
    except CorruptRecordError:
        return
    assert same_values(got, ref)


def test_code_damage_is_not_detected_here() -> None:
    """Codes are not replicated: a flipped code bit changes values (the record's ECC and
    end-to-end checksum are what catch it)."""
    q, enc, lay, ref = setup("float16", 4, 4, (2, 9, 2, 8))
    bad = damage(enc, [lay.codes_offset], [0x0F])
    res = q.decode_result(bad, (2, 9, 2, 8), "float16")
    assert res.status == CLEAN
    assert not same_values(res.array, ref)


def test_a_copy_for_another_shape_is_rejected() -> None:
    """A verified copy whose header disagrees with the caller is CorruptRecordError."""
    q = KiviQuantizer(4, 4)
    a = q.encode(make_block(1, (2, 8, 2, 4), "float16"))  # same length, other shape
    assert q.encoded_size((2, 8, 2, 4), "float16") == q.encoded_size((2, 8, 1, 8), "float16")
    with pytest.raises(CorruptRecordError, match="another shape"):
        q.decode(a, (2, 8, 1, 8), "float16")
