"""Codecs give the same bytes and the same decoding on one thread and on many, including when
one large block's codewords are split across the pool; encode_tail is encode's tail."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TypeVar

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rkv import parallel
from rkv.ecc import get_codec, rs
from rkv.ecc.base import as_u8

T = TypeVar("T")

SPECS = ["rs(255,239)", "rs(255,223,interleave=8)", "rs(40,30)", "bch(m=13,t=8)",
         "bch(m=14,t=4)", "shardrs(k=16,m=2)", "shardrs(k=5,m=3,checksum=crc32c)", "xxh3",
         "crc32c", "none"]


@pytest.fixture(autouse=True)
def _small_pieces(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Split even small blocks, so that hypothesis' sizes exercise the split paths."""
    before = parallel._setting
    monkeypatch.setattr(parallel, "MIN_PIECE_BYTES", 2048)
    monkeypatch.setattr(parallel, "MIN_PARALLEL_BYTES", 0)
    monkeypatch.setattr(rs, "DECODE_PIECE", 3)
    yield
    parallel.configure(before)


def _both(fn: Callable[[], T]) -> tuple[T, T]:
    parallel.configure(1)
    one = fn()
    parallel.configure(4)
    many = fn()
    return one, many


def _damage(enc: bytes, ber: float, rng: np.random.Generator) -> np.ndarray:
    b = np.frombuffer(enc, dtype=np.uint8).copy()
    hit = np.flatnonzero(rng.random(b.size) < ber)
    b[hit] ^= rng.integers(1, 256, hit.size, dtype=np.uint8)
    return b


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(SPECS), st.integers(0, 200_000), st.integers(0, 2**32 - 1))
def test_encode_is_the_same_on_many_threads(spec: str, size: int, seed: int) -> None:
    c = get_codec(spec)
    d = np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)
    one, many = _both(lambda: c.encode(d))
    assert one == many
    assert len(one) == c.encoded_size(size)
    tail = c.encode_tail(as_u8(d))
    assert tail is not None and d.tobytes() + tail == one


@settings(max_examples=25, deadline=None)
@given(st.sampled_from([s for s in SPECS if s[:2] in ("rs", "bc", "sh")]),
       st.integers(1, 120_000), st.sampled_from([1e-4, 1e-3, 1e-2, 5e-2]),
       st.integers(0, 2**32 - 1), st.booleans())
def test_decode_is_the_same_on_many_threads(spec: str, size: int, ber: float, seed: int,
                                            with_erasures: bool) -> None:
    """Same status, corrected count and data, corrected or not (uncorrectable too; beyond
    a code's capability even the same miscorrection)."""
    c = get_codec(spec)
    rng = np.random.default_rng(seed)
    d = rng.integers(0, 256, size, dtype=np.uint8)
    bad = _damage(c.encode(d), ber, rng)
    eras = sorted({int(x) for x in rng.integers(0, bad.size, 20)}) if with_erasures else None
    if eras:
        bad[eras] = 0
    one, many = _both(lambda: c.decode(bad, eras))
    assert (one.status, one.n_corrected, one.data) == (many.status, many.n_corrected,
                                                       many.data)


def test_large_rs_block_is_split_and_decoded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 1 MiB block at BER 1e-3: thousands of damaged codewords decoded in pieces."""
    cuts: list[int] = []
    real = parallel.pieces

    def spy(n: int, parts: int) -> list[tuple[int, int]]:
        cuts.append(parts)
        return real(n, parts)

    monkeypatch.setattr(parallel, "pieces", spy)
    c = get_codec("rs(255,223)")
    rng = np.random.default_rng(5)
    d = rng.integers(0, 256, 1 << 20, dtype=np.uint8)
    bad = _damage(c.encode(d), 1e-3, rng)
    one, many = _both(lambda: c.decode(bad))
    assert many.status == "corrected" and many.data == d.tobytes()
    assert one.n_corrected == many.n_corrected > 500
    assert cuts[-2:] == [4, 4]           # parity and decoding both split four ways
