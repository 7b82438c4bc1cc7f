"""Quantized planes (a planes spec on a KIVI block: ``qplanes(meta=..., codes=...)``): the
metadata strict, the packed codes tolerant. Clean blocks decode to the exact bytes; metadata
damaged beyond its code loses the block; codes damaged beyond theirs read back degraded, and
every degraded value lies within its group's [min, max] of the original block."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rkv.codec.pipeline import Pipeline
from rkv.ecc import QuantPlanesCodec, get_codec
from rkv.ecc.qplanes import FILL
from rkv.errors import ConfigError, CorruptRecordError
from rkv.quant import KiviQuantizer
from rkv.quant.kivi_groups import within_ranges

SHAPE = (2, 48, 2, 16)          # a ragged last key group (48 = 32 + 16)
TOLERANT = "planes(high=rs(255,223),low=none,tolerant=1)"


def bound(bits: int, dtype: str = "float16", ecc: str = TOLERANT,
          shape: tuple[int, ...] = SHAPE) -> tuple[KiviQuantizer, QuantPlanesCodec]:
    p = Pipeline.parse(f"kivi(bits={bits})", ecc).for_block(shape, dtype)
    assert isinstance(p.quant, KiviQuantizer) and isinstance(p.codec, QuantPlanesCodec)
    return p.quant, p.codec


def block(seed: int, dtype: str = "float16", shape: tuple[int, ...] = SHAPE) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * rng.uniform(0.1, 4) + rng.uniform(-2, 2)
    x[..., 3] *= 20                                    # an outlier channel
    import ml_dtypes

    dt = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32}[dtype]
    return x.astype(dt)


def codes_start(c: QuantPlanesCodec) -> int:
    return c.high.encoded_size(c.head + c.tail + 32)


def test_binding_follows_the_kivi_layout_and_sizes_invert() -> None:
    q, c = bound(4)
    lay = q.layout(SHAPE, "float16")
    assert (c.head, c.tail) == (lay.codes_offset, lay.total - lay.copy_offsets[2])
    n = lay.total
    assert c.data_size(c.encoded_size(n)) == n
    assert c.parts(n)[0].data_bytes == c.head + c.tail + 32 and not c.parts(n)[0].tolerant
    assert c.parts(n)[1].data_bytes == n - c.head - c.tail and c.parts(n)[1].tolerant
    assert get_codec(c.spec) == c and get_codec(c.get_config()) == c
    # another shape rebinds the same codes
    q2, c2 = bound(4, shape=(2, 16, 2, 16))
    assert c.for_quantized(q2.tolerant_span((2, 16, 2, 16), "float16")) == c2
    assert c.for_quantized(None) == c.high
    with pytest.raises(CorruptRecordError):
        c.data_size(10)
    with pytest.raises(ConfigError):
        get_codec("qplanes(meta=rs(255,223),codes=none)")      # unbound
    with pytest.raises(ConfigError):
        get_codec("qplanes(meta=shardrs(k=4,m=2),codes=none,head=8,tail=8)")


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_clean_and_correctable_blocks_decode_exact(bits: int, dtype: str) -> None:
    q, c = bound(bits, dtype, "planes(high=rs(255,223),low=rs(255,247),tolerant=1)",
                 SHAPE)
    data = q.encode(block(bits, dtype))
    enc = c.encode(data)
    assert c.decode(enc).status == "clean" and c.decode(enc).data == data
    assert c.systematic_data(enc) is not None
    assert c.systematic_data(enc).tobytes() == data      # type: ignore[union-attr]
    b = np.frombuffer(enc, np.uint8).copy()
    b[[5, 300, codes_start(c) + 1, codes_start(c) + 700]] ^= 0xA5
    res = c.decode(b.tobytes())
    assert res.status == "corrected" and res.data == data and res.n_corrected == 4


def test_metadata_damaged_beyond_repair_is_uncorrectable_never_degraded() -> None:
    q, c = bound(4)
    enc = np.frombuffer(c.encode(q.encode(block(1))), np.uint8).copy()
    enc[:40] ^= 0xFF                  # 40 bytes in one rs(255,223) codeword: beyond 16
    assert c.decode(enc.tobytes()).status == "uncorrectable"
    assert c.decode_degraded(enc.tobytes()) is None
    # a strict (not tolerant) layout never degrades either
    q, s = bound(4, ecc="planes(high=rs(255,223),low=none,tolerant=0)")
    bad = np.frombuffer(s.encode(q.encode(block(1))), np.uint8).copy()
    bad[codes_start(s) + 9] ^= 1
    assert s.decode(bad.tobytes()).status == "uncorrectable"
    assert s.decode_degraded(bad.tobytes()) is None


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_damaged_codes_read_degraded_within_the_group_ranges(bits: int) -> None:
    q, c = bound(bits)
    x = block(bits)
    data = q.encode(x)
    enc = np.frombuffer(c.encode(data), np.uint8).copy()
    start = codes_start(c)
    rng = np.random.default_rng(bits)
    hit = start + rng.choice(enc.size - start, 200, replace=False)
    enc[hit] = rng.integers(0, 256, hit.size, dtype=np.uint8)
    enc[[3, 400]] ^= 0x0F                            # and two metadata bytes, corrected
    assert c.decode(enc.tobytes()).status == "uncorrectable"
    deg = c.decode_degraded(enc.tobytes())
    assert deg is not None and deg.n_corrected == 2 and deg.values == enc.size - start
    got = np.frombuffer(deg.data, np.uint8)
    # metadata exact, codes as read
    assert np.array_equal(got[:c.head], np.frombuffer(data, np.uint8)[:c.head])
    assert np.array_equal(got[c.head:len(data) - c.tail], enc[start:])
    y = q.decode(deg.data, SHAPE, "float16")
    assert within_ranges(y, x, q.group, bits).all()
    # the check can fail: values pushed out of their group's range are caught
    y2 = y.copy()
    y2[0, 0, 0, 0] = np.float16(x.astype(np.float64).max() + 1)
    assert not within_ranges(y2, x, q.group, bits).all()


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), bits=st.sampled_from([2, 4, 8]),
       dtype=st.sampled_from(["float16", "bfloat16", "float32"]),
       frac=st.floats(0.0, 1.0), tokens=st.integers(1, 70))
def test_any_damage_to_the_codes_stays_within_the_group_ranges(
        seed: int, bits: int, dtype: str, frac: float, tokens: int) -> None:
    """Property: overwrite any share of the codes region with anything, erase some more:
    the block reads back (exact or degraded), every value within its group's [min, max]."""
    shape = (2, tokens, 2, 16)
    p = Pipeline.parse(f"kivi(bits={bits})", TOLERANT).for_block(shape, dtype)
    if p.quant is None:                 # too short to shrink: stored unquantized
        return
    q, c = p.quant, p.codec
    assert isinstance(c, QuantPlanesCodec)
    x = block(seed, dtype, shape)
    enc = np.frombuffer(c.encode(q.encode(x)), np.uint8).copy()
    start = codes_start(c)
    rng = np.random.default_rng(seed)
    n_codes = enc.size - start
    hit = start + np.flatnonzero(rng.random(n_codes) < frac)
    enc[hit] = rng.integers(0, 256, hit.size, dtype=np.uint8)
    eras = start + rng.choice(n_codes, min(n_codes, 5), replace=False)
    res = c.decode(enc.tobytes(), eras.tolist())
    if res.ok:                          # the erased bytes happened to verify: exact
        assert res.data == q.encode(x)
        return
    deg = c.decode_degraded(enc.tobytes(), eras.tolist())
    assert deg is not None
    data = np.frombuffer(deg.data, np.uint8)
    assert np.all(data[c.head + eras - start] == FILL)
    y = q.decode(deg.data, shape, dtype)
    assert within_ranges(y, x, q.group, bits).all()


def test_lost_codes_are_filled_and_lost_metadata_is_rebuilt() -> None:
    q, c = bound(4, ecc="planes(high=rs(255,223),low=rs(255,251),tolerant=1)")
    x = block(7)
    data = q.encode(x)
    enc = c.encode(data)
    start = codes_start(c)
    # 4 erasures in one codes codeword: 2e + f <= 4, rebuilt exactly
    eras = [start + i for i in range(4)] + [10, 11]
    assert c.decode(enc, eras).data == data
    # 30: beyond it, degraded, those bytes at FILL (a 4-bit pair of codes 8 and 7)
    eras = list(range(start, start + 30))
    bad = np.frombuffer(enc, np.uint8).copy()
    bad[eras] = 0
    deg = c.decode_degraded(bad.tobytes(), eras)
    assert deg is not None
    got = np.frombuffer(deg.data, np.uint8)
    assert np.all(got[c.head:c.head + 30] == 0x78)
    assert np.array_equal(got[c.head + 30:c.head + 200],
                          np.frombuffer(data, np.uint8)[c.head + 30:c.head + 200])
    assert within_ranges(q.decode(deg.data, SHAPE, "float16"), x, q.group, 4).all()
