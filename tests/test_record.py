from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rkv.errors import (
    CorruptRecordError,
    IntegrityError,
    RecordMismatchError,
    TruncatedRecordError,
    UnknownFormatError,
)
from rkv.format.dtypes import numpy_dtype
from rkv.format.record import (
    RecordHeader,
    data_checksum,
    decode_record,
    encode_array_record,
    encode_record,
)

GOLDEN = Path(__file__).parent / "golden"
KEY = bytes(range(32))
FP = bytes(16)


def make(shape: tuple[int, ...] = (2, 3, 2, 4), dtype: str = "float16", layer: int = 1,
         seed: int = 0) -> tuple[bytes, np.ndarray]:
    data = np.random.default_rng(seed).standard_normal(shape).astype(numpy_dtype(dtype))
    h = RecordHeader(key=KEY, layer=layer, fingerprint=FP, shape=shape, dtype=dtype,
                     data_len=0, payload_len=0)
    return bytes(encode_array_record(h, data)), data


def decode_data(rec: bytes | bytearray, dtype: str, shape: tuple[int, ...]) -> np.ndarray | None:
    """Decode and checksum like the engine; None if the data fails verification."""
    dec = decode_record(rec, expect_key=KEY, expect_fingerprint=FP)
    if data_checksum(dec.payload) != dec.header.checksum:
        return None
    return np.frombuffer(dec.payload, dtype=numpy_dtype(dtype)).reshape(shape)


@given(
    st.tuples(st.just(2), st.integers(1, 9), st.integers(1, 3), st.integers(1, 8)),
    st.sampled_from(["float16", "bfloat16", "float32"]),
    st.integers(0, 65535),
)
def test_round_trip(shape: tuple[int, int, int, int], dtype: str, layer: int) -> None:
    rec, data = make(shape, dtype, layer)
    dec = decode_record(rec, expect_key=KEY, expect_layer=layer, expect_fingerprint=FP)
    assert dec.header.shape == shape and dec.header.dtype == dtype
    assert dec.header_repairs == 0
    assert bytes(dec.payload) == data.tobytes()
    assert data_checksum(dec.payload) == dec.header.checksum


def test_strided_source_is_copied_correctly() -> None:
    big = np.random.default_rng(1).standard_normal((4, 2, 10, 3, 4)).astype(np.float16)
    view = big[2, :, 3:8]
    h = RecordHeader(key=KEY, layer=0, fingerprint=FP, shape=view.shape, dtype="float16",
                     data_len=0, payload_len=0)
    dec = decode_record(encode_array_record(h, view))
    assert bytes(dec.payload) == np.ascontiguousarray(view).tobytes()


def test_encode_record_matches_array_path() -> None:
    rec, data = make()
    dec = decode_record(rec)
    assert bytes(encode_record(dec.header, data.tobytes())) == rec


def framing_bytes(rec: bytes) -> list[int]:
    """Byte offsets of the prelude and header copies (leading and trailing)."""
    dec = decode_record(rec)
    end = dec.header_bytes + dec.header.payload_len
    return [*range(dec.header_bytes), *range(end, len(rec))]


def test_every_header_bit_flip_is_corrected_or_detected() -> None:
    rec, data = make()
    outcomes = {"corrected": 0, "detected": 0}
    for bit in (8 * b + i for b in framing_bytes(rec) for i in range(8)):
        bad = bytearray(rec)
        bad[bit // 8] ^= 1 << (bit % 8)
        try:
            got = decode_data(bad, "float16", data.shape)
        except IntegrityError:
            outcomes["detected"] += 1
            continue
        assert got is not None and np.array_equal(got, data), f"bit {bit} gave wrong data"
        outcomes["corrected"] += 1
    # Three copies: every single flip in the prelude or a header copy is corrected.
    assert outcomes["detected"] == 0


def header_copy_offsets(rec: bytes) -> tuple[list[int], int]:
    hlen = int.from_bytes(rec[6:8], "little")
    return [16, 16 + hlen, len(rec) - 8 - hlen], hlen


def test_burst_across_two_header_copies_is_detected_or_corrected() -> None:
    rec, data = make()
    offsets, hlen = header_copy_offsets(rec)
    rng = np.random.default_rng(5)
    for _ in range(300):
        bad = bytearray(rec)
        for copy in rng.choice(3, size=2, replace=False):
            start = offsets[int(copy)] + int(rng.integers(0, hlen - 4))
            for j in range(4):
                bad[start + j] ^= int(rng.integers(1, 256))
        try:
            got = decode_data(bad, "float16", data.shape)
        except IntegrityError:
            continue
        assert got is not None and np.array_equal(got, data)


def test_prelude_survives_in_one_copy_and_fails_in_none() -> None:
    rec, data = make()
    bad = bytearray(rec)
    bad[0] ^= 0xFF
    bad[8] ^= 0xFF                      # two of three copies: the trailing one still verifies
    got = decode_data(bad, "float16", data.shape)
    assert got is not None and np.array_equal(got, data)
    bad[len(rec) - 8] ^= 0xFF           # all three: nothing to trust
    with pytest.raises(CorruptRecordError):
        decode_record(bad)


def flipped(rec: bytes, *bits: int) -> bytearray:
    bad = bytearray(rec)
    for bit in bits:
        bad[bit // 8] ^= 1 << (bit % 8)
    return bad


@pytest.mark.parametrize("shape", [(2, 3, 2, 4), (2, 64, 2, 64)])   # 96 B and 16 KiB
def test_every_pair_of_prelude_bits_is_corrected(shape: tuple[int, ...]) -> None:
    """Exhaustive: all 18,336 pairs of bits in the three prelude copies. The same bit of the
    version, flags or header length flipped in two copies outvotes the third; the decoder
    must then try that intact copy instead of giving up (it raised UnknownFormatError or
    TruncatedRecordError on 48 of these pairs)."""
    rec, data = make(shape=shape)
    bits = [8 * off + i for start in (0, 8, len(rec) - 8) for off in range(start, start + 8)
            for i in range(8)]
    lost = []
    for a in range(len(bits)):
        for b in range(a + 1, len(bits)):
            try:
                got = decode_data(flipped(rec, bits[a], bits[b]), "float16", shape)
            except IntegrityError as exc:
                lost.append((bits[a], bits[b], type(exc).__name__))
                continue
            assert got is not None and np.array_equal(got, data)
    assert not lost, f"{len(lost)} fatal pairs, e.g. {lost[:5]}"


def test_the_same_bit_in_two_header_copies_is_corrected() -> None:
    """Exhaustive over header bits: flipped alike in two copies, the bitwise vote is wrong
    and the third copy alone verifies."""
    rec, data = make()
    offsets, hlen = header_copy_offsets(rec)
    for i, j in ((0, 1), (0, 2), (1, 2)):
        for bit in range(8 * hlen):
            bad = flipped(rec, 8 * offsets[i] + bit, 8 * offsets[j] + bit)
            got = decode_data(bad, "float16", data.shape)
            assert got is not None and np.array_equal(got, data), (i, j, bit)


def test_any_two_framing_bits_are_corrected() -> None:
    """Any two flipped bits in the preludes and header copies leave a readable record
    (a sample of 20,000 pairs; the two tests above cover the aligned pairs exhaustively)."""
    rec, data = make(shape=(2, 16, 2, 8))
    bits = [8 * b + i for b in framing_bytes(rec) for i in range(8)]
    rng = np.random.default_rng(11)
    for _ in range(20_000):
        a, b = rng.choice(len(bits), size=2, replace=False)
        got = decode_data(flipped(rec, bits[a], bits[b]), "float16", data.shape)
        assert got is not None and np.array_equal(got, data), (bits[a], bits[b])


def test_losing_either_end_of_a_record_keeps_its_header() -> None:
    """A lost sector (here: the leading or trailing copies zeroed) leaves one copy."""
    rec, data = make(shape=(2, 64, 2, 16))
    dec = decode_record(rec)
    lead = dec.header_bytes
    tail = len(rec) - dec.header_bytes - dec.header.payload_len
    for lo, hi in ((0, lead), (len(rec) - tail, len(rec))):
        bad = bytearray(rec)
        bad[lo:hi] = bytes(hi - lo)
        got = decode_data(bad, "float16", data.shape)
        assert got is not None and np.array_equal(got, data)
        assert decode_record(bad).header_repairs >= 1


@given(st.data())
def test_random_corruption_never_yields_wrong_data(data: st.DataObject) -> None:
    rec, arr = make(seed=3)
    bad = bytearray(rec)
    for _ in range(data.draw(st.integers(1, 40))):
        pos = data.draw(st.integers(0, len(bad) - 1))
        bad[pos] ^= data.draw(st.integers(1, 255))
    try:
        got = decode_data(bad, "float16", arr.shape)
    except IntegrityError:
        return
    if got is not None:
        assert np.array_equal(got, arr)


def test_every_truncation_is_a_typed_error() -> None:
    rec, _ = make()
    for n in range(len(rec)):
        with pytest.raises(TruncatedRecordError):
            decode_record(rec[:n])
    with pytest.raises(TruncatedRecordError):
        decode_record(rec + b"\x00")


def test_payload_flip_fails_checksum() -> None:
    rec, arr = make()
    bad = bytearray(rec)
    bad[decode_record(rec).header_bytes] ^= 0x10
    assert decode_data(bad, "float16", arr.shape) is None


def test_unknown_version_and_magic() -> None:
    rec, _ = make()
    bad = bytearray(rec)
    for off in (0, 8, len(rec) - 8):
        bad[off + 4] = 9
    with pytest.raises(UnknownFormatError):
        decode_record(bad)
    bad = bytearray(rec)
    for off in (0, 8, len(rec) - 8):
        bad[off] = ord("X")
    with pytest.raises(CorruptRecordError, match="magic"):
        decode_record(bad)
    with pytest.raises(CorruptRecordError):
        decode_record(b"\x00" * 200)


def test_mislabelled_record() -> None:
    rec, _ = make(layer=2)
    with pytest.raises(RecordMismatchError):
        decode_record(rec, expect_key=bytes(32))
    with pytest.raises(RecordMismatchError):
        decode_record(rec, expect_layer=3)
    with pytest.raises(RecordMismatchError):
        decode_record(rec, expect_fingerprint=b"\x01" * 16)


def test_hostile_but_well_checksummed_header_is_rejected() -> None:
    """A header whose checksum is valid but whose fields are nonsense gets a typed error."""
    import struct

    import xxhash

    from rkv.format.record import MAGIC

    good = RecordHeader(key=KEY, layer=0, fingerprint=FP, shape=(2, 1, 1, 1), dtype="float16",
                        data_len=2, payload_len=2).to_bytes()
    fmt = "<32s16sHBB4IQQB16sH"
    fields = list(struct.unpack_from(fmt, good))
    bodies = [b"", b"short", good + b"x"]
    for index, value in [(3, 9), (4, 3), (5, 3), (11, 7), (13, 5)]:
        bad = list(fields)
        bad[index] = value
        bodies.append(struct.pack(fmt, *bad))
    codec_bad = list(fields)
    codec_bad[13] = 5
    bodies.append(struct.pack(fmt, *codec_bad) + b"nope!")
    bodies.append(struct.pack(fmt, *codec_bad[:13], 2) + b"{}")
    for body in bodies:
        hlen = len(body) + 8
        pre = MAGIC + bytes([1, 0]) + hlen.to_bytes(2, "little")
        copy = body + xxhash.xxh3_64_intdigest(pre + body).to_bytes(8, "little")
        lead = pre * 2 + copy * 2
        lead += bytes(-len(lead) % 64)
        with pytest.raises(CorruptRecordError):
            decode_record(lead + b"\0\0" + copy + pre)


def test_codec_list_round_trips() -> None:
    h = RecordHeader(key=KEY, layer=0, fingerprint=FP, shape=(2, 1, 1, 1), dtype="float16",
                     data_len=2, payload_len=2, codecs=({"id": "rs", "n": 255, "k": 223},))
    assert RecordHeader.from_bytes(h.to_bytes()) == h


def _golden_module() -> object:
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_golden", GOLDEN / "make_golden.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("name", ["record_v1_float16", "record_v1_bfloat16", "record_v1_float32",
                                  "record_v2_float16", "record_v2_bfloat16", "record_v2_float32"])
def test_golden_records(name: str) -> None:
    """The byte formats are frozen: v1 files (the first release's) still decode, with an
    unknown write time; v2 files decode and re-encode identically."""
    mod: Any = _golden_module()
    dtype, shape, layer = mod.CASES[name]
    meta = json.loads((GOLDEN / f"{name}.json").read_text())
    raw = (GOLDEN / f"{name}.bin").read_bytes()
    assert len(raw) == meta["bytes"]
    data = mod.case_data(dtype, shape)
    dec = decode_record(raw)
    assert dec.header.shape == shape and dec.header.dtype == dtype
    assert dec.header.layer == layer
    assert dec.header.written_ns == meta.get("written_ns")
    assert bytes(dec.payload) == data.tobytes()
    assert data_checksum(dec.payload) == dec.header.checksum
    assert raw[4] == int(name[8]) and dec.header_repairs == 0
    again = bytes(encode_array_record(mod.case_header(name, dtype, shape, layer), data))
    if name.startswith("record_v2"):
        assert again == raw
    else:       # this build writes v2: the same header, now with a (still unknown) time
        assert again[4] == 2 and decode_record(again).header == dec.header


def test_golden_v3_record() -> None:
    """A v3 record (framing spread over sectors, written for shard codes with shards of a
    sector or more) decodes, verifies and re-encodes byte for byte; its copies lie where
    copy_offsets says."""
    from rkv.codec.blockcodec import read_block
    from rkv.format.record import SPREAD_AT, copy_offsets

    mod: Any = _golden_module()
    (name, (dtype, shape, layer)), = mod.V3_CASES.items()
    meta = json.loads((GOLDEN / f"{name}.json").read_text())
    raw = (GOLDEN / f"{name}.bin").read_bytes()
    assert len(raw) == meta["bytes"] and raw[4] == 3
    dec = decode_record(raw, expect_layer=layer)
    assert dec.header.spread and dec.header.written_ns == meta["written_ns"]
    assert dec.header_repairs == 0 and dec.header_bytes > SPREAD_AT
    out = np.empty(shape, dtype=numpy_dtype(dtype))
    assert read_block(dec, out).corrected == 0
    assert np.array_equal(out, mod.case_data(dtype, shape))
    hlen = int.from_bytes(raw[6:8], "little")
    pre, heads = copy_offsets(hlen, len(raw), True)
    assert len({raw[o:o + 8] for o in pre}) == 1
    assert len({raw[o:o + hlen] for o in heads}) == 1
    assert mod.v3_record(name) == raw
