"""The kivi quantizer: round trips, error bounds, format fields, axes, edge values."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from quant_helpers import (
    DT,
    DTYPE_CODE,
    KINDS,
    dequant_ref,
    error_bound,
    make_block,
    parse,
    per_element,
    same_values,
)

from rkv.quant import KiviQuantizer, get_quantizer
from rkv.quant import _kernels as K

DTYPES = ("float16", "bfloat16", "float32")

block_cases = st.tuples(
    st.integers(1, 70),  # tokens
    st.integers(1, 3),  # heads
    st.sampled_from([1, 4, 8, 64]),  # head_dim
    st.sampled_from(DTYPES),
    st.sampled_from([2, 4, 8]),
    st.sampled_from([1, 2, 3, 5, 8, 16, 32, 64, 100]),  # group
    st.sampled_from(KINDS),
    st.integers(0, 2**32 - 1),  # seed
)


@settings(max_examples=150)
@given(block_cases)
def test_round_trip_and_error_bound(case: tuple[int, int, int, str, int, int, str, int]) -> None:
    t, h, d, dtype, bits, group, kind, seed = case
    shape = (2, t, h, d)
    x = make_block(seed, shape, dtype, kind)
    q = KiviQuantizer(bits, group)
    enc = q.encode(x)
    assert len(enc) == q.encoded_size(shape, dtype)
    y = q.decode(enc, shape, dtype)
    assert y.shape == shape and y.dtype == x.dtype

    p = parse(enc, bits, group, shape, dtype)
    assert p.header == (b"RKVQ", 1, bits, DTYPE_CODE[dtype], 0, group, min(group, d), t, h, d)
    assert int(p.codes.max()) <= (1 << bits) - 1
    s, z = per_element(p, group, shape)
    assert (s >= 0).all()
    # the decoded block is exactly z + q*s rounded into the dtype
    assert same_values(y, dequant_ref(p.codes, s, z, dtype))
    # and within s/2 (+ float rounding) of the input, element by element
    x64 = x.astype(np.float64)
    err = np.abs(x64 - y.astype(np.float64))
    assert (err <= error_bound(x, s, z, bits, dtype)).all()
    # every group's range fits the code range and the zero point is its minimum
    levels = (1 << bits) - 1
    assert (x64 >= z).all()
    assert (x64 <= z + levels * s).all()
    # encoding is deterministic
    assert q.encode(x) == enc


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bits", [2, 4, 8])
def test_scale_is_the_smallest_fitting_value(dtype: str, bits: int) -> None:
    x = make_block(7, (2, 64, 2, 64), dtype, "wide")
    q = KiviQuantizer(bits, 16)
    p = parse(q.encode(x), bits, 16, x.shape, dtype)
    levels = (1 << bits) - 1
    k = x[0].astype(np.float64).reshape(4, 16, 2, 64)
    want = (k.max(axis=1) - k.min(axis=1)) / levels
    assert (p.ks >= want).all()
    # one step down in the dtype would be too small
    stored = p.ks.astype(DT[dtype])
    if dtype == "float32":
        below = np.nextafter(stored, np.float32(0))
    else:
        below = np.maximum(stored.view(np.uint16).astype(np.int64) - 1, 0).astype(
            np.uint16).view(DT[dtype])
    assert ((below.astype(np.float64) < want) | (p.ks == 0)).all()


def test_keys_per_channel_values_per_token() -> None:
    """An outlier channel ruins per-token groups, not per-channel ones (and vice versa)."""
    rng = np.random.default_rng(3)
    t, h, d = 64, 2, 64
    base = rng.standard_normal((t, h, d))
    chan = base.copy()
    chan[:, 1, 5] *= 500.0  # an outlier channel
    x = np.stack([chan, chan]).astype(np.float16)
    q = KiviQuantizer(4, 32)
    y = q.decode(q.encode(x), x.shape, "float16").astype(np.float64)
    err = np.abs(y - x.astype(np.float64))
    mask = np.ones((t, h, d), bool)
    mask[:, 1, 5] = False
    key_err, val_err = err[0][mask].max(), err[1][:, 1][mask[:, 1]].max()
    # keys (per channel): the other channels keep their own small scales
    assert key_err < 0.3
    # values (per token): the outlier widens the group of every token of head 1
    assert val_err > 10 * key_err

    tok = base.copy()
    tok[7] *= 500.0  # an outlier token
    x = np.stack([tok, tok]).astype(np.float16)
    y = q.decode(q.encode(x), x.shape, "float16").astype(np.float64)
    err = np.abs(y - x.astype(np.float64))
    others = np.ones(t, bool)
    others[7] = False
    val_err = err[1][others].max()
    key_err = err[0][:32][others[:32]].max()  # tokens sharing the outlier's key groups
    assert val_err < 0.3
    assert key_err > 10 * val_err


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bits", [2, 4, 8])
def test_constant_block_is_exact(dtype: str, bits: int) -> None:
    for value in (0.0, -0.0, 1.5, -3.25, 1e-7):
        x = np.full((2, 5, 2, 8), value).astype(DT[dtype])
        q = KiviQuantizer(bits)
        y = q.decode(q.encode(x), x.shape, dtype)
        assert np.array_equal(y.astype(np.float64), x.astype(np.float64))
        # the codes are all 0 and the scales 0
        p = parse(q.encode(x), bits, 32, x.shape, dtype)
        assert not p.codes.any() and not p.ks.any() and not p.vs.any()


@pytest.mark.parametrize("dtype", DTYPES)
def test_two_valued_groups_are_exact(dtype: str) -> None:
    """A group's min and max decode exactly when the scale needs no rounding."""
    pattern = np.arange(2 * 8 * 1 * 16).reshape(2, 8, 1, 16) % 3 == 0
    for bits in (2, 4, 8):
        hi = -1.0 + ((1 << bits) - 1) * 0.25  # scale 0.25, exact in every dtype
        x = np.where(pattern, -1.0, hi).astype(DT[dtype])
        q = KiviQuantizer(bits, 8)
        y = q.decode(q.encode(x), x.shape, dtype)
        assert np.array_equal(y.astype(np.float64), x.astype(np.float64))


def test_float16_extremes_do_not_overflow() -> None:
    x = np.zeros((2, 4, 1, 4), np.float16)
    x[:, 0::2] = -65504
    x[:, 1::2] = 65504
    for bits in (2, 4, 8):
        q = KiviQuantizer(bits, 4)
        y = q.decode(q.encode(x), x.shape, "float16")
        assert np.isfinite(y).all()
        assert np.array_equal(y, x)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_large_magnitudes(dtype: str) -> None:
    big = 2.0**125
    x = np.zeros((2, 4, 1, 4))
    x[:, 0::2] = -big * 1.9
    x[:, 1::2] = big * 1.9
    x[:, 2, 0, 0] = 3.0
    x = x.astype(DT[dtype])
    q = KiviQuantizer(2, 4)
    y = q.decode(q.encode(x), x.shape, dtype)
    assert np.isfinite(y.astype(np.float32)).all()
    p = parse(q.encode(x), 2, 4, x.shape, dtype)
    s, z = per_element(p, 4, x.shape)
    assert (np.abs(x.astype(np.float64) - y.astype(np.float64))
            <= error_bound(x, s, z, 2, dtype)).all()


def test_subnormal_float16_inputs() -> None:
    sub = np.arange(-40, 40, dtype=np.float64) * 2.0**-24  # float16 subnormals
    x = np.resize(sub, (2, 10, 1, 8)).astype(np.float16)
    q = KiviQuantizer(8, 4)
    y = q.decode(q.encode(x), x.shape, "float16")
    # 8 bits over at most 2*40 subnormal steps per group: exact
    assert np.array_equal(y, x)


def test_identity_for_sixteen_bits() -> None:
    q = get_quantizer("kivi(bits=16)")
    for dtype in DTYPES:
        x = make_block(1, (2, 9, 3, 8), dtype, "wide")
        enc = q.encode(x)
        assert enc == x.tobytes()
        assert same_values(q.decode(enc, x.shape, dtype), x)


def test_non_contiguous_and_readonly_inputs() -> None:
    x = make_block(2, (2, 16, 4, 64), "float16")
    q = KiviQuantizer(4)
    ref = q.encode(x)
    ro = x.copy()
    ro.flags.writeable = False
    assert q.encode(ro) == ref
    wide = np.zeros((2, 16, 4, 128), np.float16)
    wide[..., ::2] = x
    assert q.encode(wide[..., ::2]) == ref
    assert q.decode(bytearray(ref), x.shape, "float16").tobytes() == \
        q.decode(memoryview(ref), x.shape, np.dtype(np.float16)).tobytes()
    # big-endian input is the same block
    assert q.encode(x.astype(">f2")) == ref
    assert get_quantizer("none").encode(x.astype(">f2")) == x.tobytes()
    # decoding from a buffer at an odd offset (unaligned metadata) gives the same values
    padded = b"\x00" + ref
    assert same_values(q.decode(memoryview(padded)[1:], x.shape, "float16"),
                       q.decode(ref, x.shape, "float16"))


# ---------------------------------------------------------------------- conversion kernels
def test_soft_float16_widening_matches_numpy() -> None:
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    out = np.empty(bits.shape[0], np.float32)
    K.f16_to_f32_soft(bits, out, out.view(np.uint32))
    ref = bits.view(np.float16).astype(np.float32)
    nan = np.isnan(ref)
    assert np.array_equal(np.isnan(out), nan)
    assert np.array_equal(out[~nan].view(np.uint32), ref[~nan].view(np.uint32))


def test_soft_float16_narrowing_matches_numpy() -> None:
    rng = np.random.default_rng(5)
    # every float16 value, the midpoints between neighbours (ties), and random float32s
    h = np.arange(0x7C00, dtype=np.uint16).view(np.float16).astype(np.float64)
    mids = (h[:-1] + h[1:]) / 2
    rand = rng.standard_normal(200_000) * 2.0 ** rng.integers(-30, 16, 200_000)
    v = np.concatenate([h, mids, rand, np.nextafter(mids, 0), np.nextafter(mids, 1)])
    v = v[np.abs(v) <= 65504].astype(np.float32)
    v = np.concatenate([v, -v])
    out = np.empty(v.shape[0], np.uint16)
    K.f32_to_f16_soft(v.view(np.uint32), out)
    assert np.array_equal(out, v.astype(np.float16).view(np.uint16))


def test_bfloat16_narrowing_matches_ml_dtypes() -> None:
    rng = np.random.default_rng(6)
    v = (rng.standard_normal(100_000) * 2.0 ** rng.integers(-130, 120, 100_000)).astype(
        np.float32)
    ties = (rng.integers(0, 1 << 16, 5000, dtype=np.uint32) << 16 | 0x8000).view(np.float32)
    v = np.concatenate([v[:1000], ties[np.isfinite(ties)][:1000]])
    got = np.array([K.f32_bits_to_bf16(int(u)) for u in v.view(np.uint32)], np.uint16)
    assert np.array_equal(got, v.astype(DT["bfloat16"]).view(np.uint16))


@pytest.mark.slow
@settings(max_examples=3000)
@given(block_cases)
def test_round_trip_and_error_bound_many(
        case: tuple[int, int, int, str, int, int, str, int]) -> None:
    test_round_trip_and_error_bound.hypothesis.inner_test(case)  # type: ignore[attr-defined]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("shape", [(2, 256, 3, 64), (2, 256, 8, 128), (2, 1000, 1, 96)])
def test_error_bound_real_shapes(shape: tuple[int, ...], dtype: str, bits: int) -> None:
    for group in (32, 64, 128):
        for kind in KINDS:
            x = make_block(group, shape, dtype, kind)
            q = KiviQuantizer(bits, group)
            enc = q.encode(x)
            y = q.decode(enc, shape, dtype)
            p = parse(enc, bits, group, shape, dtype)
            s, z = per_element(p, group, shape)
            assert same_values(y, dequant_ref(p.codes, s, z, dtype))
            err = np.abs(x.astype(np.float64) - y.astype(np.float64))
            assert (err <= error_bound(x, s, z, bits, dtype)).all()


@given(st.integers(1, 70), st.integers(1, 3), st.sampled_from([1, 4, 8, 64]),
       st.sampled_from(DTYPES), st.sampled_from(KINDS), st.integers(0, 2**32 - 1),
       st.sampled_from(["none", "kivi(bits=16)", {"id": "kivi", "bits": 16, "group": 8}]))
def test_sixteen_bits_is_exact(t: int, h: int, d: int, dtype: str, kind: str, seed: int,
                               spec: str | dict[str, object]) -> None:
    shape = (2, t, h, d)
    x = make_block(seed, shape, dtype, kind)
    x.reshape(-1)[seed % x.size] = np.nan  # anything goes, NaN included
    q = get_quantizer(spec)
    enc = q.encode(x)
    assert len(enc) == q.encoded_size(shape, dtype) == x.nbytes
    assert same_values(q.decode(enc, shape, dtype), x)
