"""Byte planes (``planes(high=..., low=..., tolerant=...)``): layout, sizes, strict and
tolerant decoding, the bound on a degraded value, and the high plane against reedsolo."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import reedsolo
import xxhash
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rkv.ecc import PlanesCodec, get_codec
from rkv.errors import ConfigError, CorruptRecordError

SUBS = ["none", "xxh3", "crc32c", "rs(255,239)", "rs(255,223,interleave=4)", "bch(m=13,t=4)"]


def _planes(high: str, low: str, tolerant: int = 1, width: int = 2) -> PlanesCodec:
    c = get_codec(f"planes(high={high},low={low},tolerant={tolerant},width={width})")
    assert isinstance(c, PlanesCodec)
    return c


@settings(max_examples=80, deadline=None)
@given(st.sampled_from(SUBS), st.sampled_from(SUBS), st.sampled_from([2, 4, 8]),
       st.integers(0, 3000), st.integers(0, 2**32 - 1))
# A 3-byte tail opens a new RS codeword in the high plane: 2803 bytes encode longer than
# 2804 (data_size once assumed sizes increase with the length).
@example(high="rs(255,239)", low="none", width=4, n=2803, seed=0)
def test_round_trip_and_sizes(high: str, low: str, width: int, n: int, seed: int) -> None:
    c = _planes(high, low, width=width)
    data = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()
    enc = c.encode(data)
    assert len(enc) == c.encoded_size(n)
    assert c.data_size(len(enc)) == n
    res = c.decode(enc)
    assert res.status == "clean" and res.data == data
    sys_view = c.systematic_data(enc)
    assert sys_view is not None and sys_view.tobytes() == data


def test_sizes_are_strictly_increasing_and_invalid_lengths_raise() -> None:
    c = _planes("rs(255,223)", "bch(m=13,t=4)")
    sizes = [c.encoded_size(n) for n in range(0, 1200)]
    assert all(b > a for a, b in itertools.pairwise(sizes))
    gaps = [s + 1 for s, t in itertools.pairwise(sizes) if t > s + 1]
    with pytest.raises(CorruptRecordError):
        c.data_size(gaps[0])


def test_config_and_spec_round_trip_and_validation() -> None:
    c = _planes("rs(255,223,interleave=8)", "rs(255,247)", tolerant=0, width=4)
    assert get_codec(c.get_config()) == c and get_codec(c.spec) == c
    assert not c.tolerant and c.high == get_codec("rs(255,223,interleave=8)")
    assert c.for_itemsize(2).get_config()["width"] == 2
    assert c.for_itemsize(4) is c
    for bad in ["planes(high=planes(high=none,low=none),low=none)",
                "planes(high=shardrs(k=4,m=2),low=none)",
                "planes(high=rs(255,223),low=none,tolerant=maybe)",
                "planes(high=rs(255,223),low=none,width=2,high_bytes=2)",
                "planes(high=rs(255,223),low=none,width=1)",
                "planes(high=rs(255,223),low=none,depth=3)",
                "planes(high=rs(255,223),low=none"]:
        with pytest.raises(ConfigError):
            get_codec(bad)


@pytest.mark.parametrize("k", [223, 239])
def test_high_plane_is_reedsolo_codeword_of_the_top_bytes(k: int) -> None:
    """Differential: the high part of the payload is exactly reedsolo's RS(255,k) of the
    values' top bytes followed by the two plane checksums."""
    c = _planes(f"rs(255,{k})", "none")
    rng = np.random.default_rng(k)
    vals = rng.standard_normal(700).astype(np.float16)
    raw = vals.view(np.uint8)
    top, bottom = raw[1::2].tobytes(), raw[0::2].tobytes()
    data = top + xxhash.xxh3_128_digest(top) + xxhash.xxh3_128_digest(bottom)
    enc = c.encode(raw)
    henc = c.high.encoded_size(len(data))
    assert enc[:len(data)] == data and enc[henc:] == bottom
    ref, nsym = reedsolo.RSCodec(255 - k, nsize=255), 255 - k
    for j in range(-(-len(data) // k)):
        d = data[j * k:(j + 1) * k]
        p = enc[len(data) + j * nsym:len(data) + (j + 1) * nsym]
        assert bytes(ref.encode(d)) == d + p


def _errors(buf: bytes, where: np.ndarray) -> bytes:
    b = np.frombuffer(buf, np.uint8).copy()
    b[where] ^= 0x5A
    return b.tobytes()


def test_errors_within_the_high_code_are_corrected() -> None:
    c = _planes("rs(255,223)", "rs(255,247)")
    raw = np.random.default_rng(1).standard_normal(4000).astype(np.float16).view(np.uint8)
    enc = c.encode(raw)
    henc = c.high.encoded_size(2000 + 32)
    bad = _errors(enc, np.array([3, 100, 1000, henc + 5, henc + 900]))
    res = c.decode(bad)
    assert res.ok and res.data == raw.tobytes() and res.n_corrected == 5


def test_tolerant_low_plane_degrades_with_the_high_bytes_exact() -> None:
    """Too many errors in the low plane: strict decoding refuses, degraded decoding returns
    every value's top byte exact (float16: within 2^-2 of the value's magnitude)."""
    c = _planes("rs(255,223)", "none")
    vals = np.random.default_rng(2).standard_normal(5000).astype(np.float16)
    raw = vals.view(np.uint8)
    enc = c.encode(raw)
    henc = c.high.encoded_size(5000 + 32)
    where = henc + np.random.default_rng(3).choice(5000, 300, replace=False)
    bad = _errors(enc, where)
    assert c.decode(bad).status == "uncorrectable"
    deg = c.decode_degraded(bad)
    assert deg is not None and deg.values == 5000
    got = np.frombuffer(deg.data, np.float16)
    g8, v8 = got.view(np.uint8), raw
    assert np.array_equal(g8[1::2], v8[1::2])
    assert np.sum(got != vals) == 300
    x, y = vals.astype(np.float64), got.astype(np.float64)
    assert np.all(np.abs(x - y) <= 0.25 * np.abs(x) + 2.0 ** -24 * 256)
    # strict layouts never degrade; a failed high plane is lost
    assert _planes("rs(255,223)", "none", tolerant=0).decode_degraded(bad) is None
    hbad = _errors(bad, np.arange(0, 40))
    assert c.decode(hbad).status == "uncorrectable" and c.decode_degraded(hbad) is None


def test_erasures_per_plane_and_lost_low_bytes_at_mid_range() -> None:
    c = _planes("rs(255,223)", "rs(255,247)")
    raw = np.random.default_rng(4).standard_normal(3000).astype(np.float16).view(np.uint8)
    enc = c.encode(raw)
    henc = c.high.encoded_size(3000 + 32)
    # 8 erased bytes in one low codeword: 2e + f <= 8 holds, rebuilt exactly.
    eras = henc + np.arange(10, 18)
    res = c.decode(_errors(enc, eras), eras.tolist())
    assert res.ok and res.data == raw.tobytes()
    # 20 erased: beyond the low code; degraded, the erased low bytes set to 0x80.
    eras = henc + np.arange(10, 30)
    bad = _errors(enc, eras)
    assert not c.decode(bad, eras.tolist()).ok
    deg = c.decode_degraded(bad, eras.tolist())
    assert deg is not None
    low = np.frombuffer(deg.data, np.uint8)[0::2]
    assert np.all(low[10:30] == 0x80)
    assert np.array_equal(low[30:], raw[0::2][30:])


def test_float32_keeps_the_top_half_exact() -> None:
    c = _planes("rs(255,239)", "none", width=4)
    assert c.get_config()["high_bytes"] == 2
    vals = np.random.default_rng(5).standard_normal(1000).astype(np.float32)
    enc = c.encode(vals.view(np.uint8))
    henc = c.high.encoded_size(2000 + 32)
    bad = _errors(enc, henc + np.arange(0, 2000, 7))
    deg = c.decode_degraded(bad)
    assert deg is not None
    got = np.frombuffer(deg.data, np.float32).astype(np.float64)
    assert np.all(np.abs(got - vals) <= 2.0 ** -7 * np.abs(vals))
