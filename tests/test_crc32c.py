"""rkv's CRC-32C (``rkv.ecc.crc32c``) against google_crc32c and the standard test vector."""

from __future__ import annotations

import google_crc32c
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rkv.ecc import get_codec
from rkv.ecc.base import as_u8
from rkv.ecc.crc32c import IMPLEMENTATION, crc32c
from rkv.errors import InputError

# The check value of CRC-32C (Castagnoli) in every CRC catalogue, and a few more.
VECTORS = [
    (b"123456789", 0xE3069283),
    (b"", 0x00000000),
    (bytes(32), 0x8A9136AA),  # 32 zero bytes (RFC 3720, B.4)
    (b"\xff" * 32, 0x62A8AB43),  # 32 bytes of 0xff (RFC 3720, B.4)
    (bytes(range(32)), 0x46DD794E),  # 0x00..0x1f (RFC 3720, B.4)
]


@pytest.mark.parametrize(("data", "want"), VECTORS)
def test_known_vectors(data: bytes, want: int) -> None:
    assert crc32c(data) == want
    assert crc32c(as_u8(data)) == want
    assert get_codec("crc32c").encode(data)[len(data):] == want.to_bytes(4, "little")


def test_runs_the_c_extension() -> None:
    # google_crc32c silently degrades to pure Python without its extension (slow, same values)
    assert IMPLEMENTATION == "c" == google_crc32c.implementation


@settings(max_examples=200)
@given(st.binary(max_size=5000))
def test_matches_google_on_bytes_and_arrays(data: bytes) -> None:
    want = google_crc32c.value(data)
    assert crc32c(data) == want
    assert crc32c(as_u8(data)) == want
    assert crc32c(bytearray(data)) == want
    assert crc32c(memoryview(data)) == want


@settings(max_examples=100)
@given(st.binary(min_size=1, max_size=3000), st.integers(1, 7), st.integers(0, 6))
def test_strided_and_sliced_arrays(data: bytes, step: int, start: int) -> None:
    arr = np.frombuffer(data, np.uint8)
    view = arr[start::step]  # not C-contiguous when step > 1: copied first
    assert crc32c(view) == google_crc32c.value(view.tobytes())
    wide = np.frombuffer(data[: len(data) // 4 * 4], np.float32).reshape(-1, 1)
    assert crc32c(wide) == google_crc32c.value(wide.tobytes())  # raw bytes of any dtype


@settings(max_examples=100)
@given(st.binary(max_size=4000), st.integers(0))
def test_extend_composes_with_value(data: bytes, cut: int) -> None:
    # what a streaming caller would do: continue the CRC over a split buffer
    k = cut % (len(data) + 1)
    assert google_crc32c.extend(crc32c(data[:k]), data[k:]) == crc32c(data)


def test_large_buffer() -> None:
    data = np.random.default_rng(0).integers(0, 256, (4 << 20) + 3, dtype=np.uint8)
    assert crc32c(data) == google_crc32c.value(data.tobytes())


@pytest.mark.parametrize("bad", ["abc", 5, None, 1.5])
def test_not_bytes_is_a_typed_error(bad: object) -> None:
    with pytest.raises(InputError, match="bytes-like"):
        crc32c(bad)  # type: ignore[arg-type]
