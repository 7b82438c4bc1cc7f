"""Detection-only codecs: none, xxh3, crc32c (the CRC itself: tests/test_crc32c.py)."""

from __future__ import annotations

import google_crc32c
import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from rkv.ecc import get_codec
from rkv.ecc.base import as_u8
from rkv.ecc.crc32c import crc32c


def test_crc32c_known_vector() -> None:
    assert crc32c(as_u8(b"123456789")) == 0xE3069283


def test_digest_layout() -> None:
    data = b"rkv ecc"
    assert get_codec("xxh3").encode(data) == data + xxhash.xxh3_64_intdigest(data).to_bytes(
        8, "little"
    )
    assert get_codec("crc32c").encode(data) == data + google_crc32c.value(data).to_bytes(
        4, "little"
    )
    assert get_codec("none").encode(data) == data


@pytest.mark.parametrize("spec", ["xxh3", "crc32c"])
@settings(max_examples=50)
@given(data=st.binary(max_size=500), where=st.integers(0), bit=st.integers(0, 7))
def test_detects_any_single_bit_flip(spec: str, data: bytes, where: int, bit: int) -> None:
    c = get_codec(spec)
    enc = bytearray(c.encode(data))
    enc[where % len(enc)] ^= 1 << bit
    res = c.decode(bytes(enc))
    assert res.status == "uncorrectable" and res.data == b"" and res.n_corrected == 0


def test_none_detects_nothing() -> None:
    c = get_codec("none")
    res = c.decode(b"abc")
    assert res.status == "clean" and res.data == b"abc"
    assert c.decode(b"", erasures=[]).data == b""


@pytest.mark.parametrize("spec", ["xxh3", "crc32c"])
def test_crc_of_large_buffer(spec: str) -> None:
    data = np.random.default_rng(0).integers(0, 256, 100_003, dtype=np.uint8)
    assert crc32c(as_u8(data)) == google_crc32c.value(data.tobytes())
    c = get_codec(spec)
    assert c.decode(c.encode(data)).data == data.tobytes()
