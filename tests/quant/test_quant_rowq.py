"""rowq: symmetric per-row weight quantization (its bound, sizes, config, and records)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rkv.codec.blockcodec import encode_block, read_block
from rkv.errors import ConfigError, CorruptRecordError, ShapeError
from rkv.format.record import RecordHeader, decode_record
from rkv.quant import NoneQuantizer, RowQuantizer, available_quantizers, get_quantizer

DTYPES = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32}


def _block(shape: tuple[int, int, int, int], dtype: str, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32) * rng.uniform(0.01, 3.0, (*shape[:-1], 1))
    return x.astype(DTYPES[dtype])


def test_registered_and_configured() -> None:
    assert "rowq" in available_quantizers()
    q = get_quantizer("rowq(bits=4)")
    assert isinstance(q, RowQuantizer) and q.bits == 4 and q.spec == "rowq(bits=4)"
    assert get_quantizer("rowq(4)") == q
    assert get_quantizer(q.get_config()) == q
    assert get_quantizer("rowq").bits == 8
    assert isinstance(get_quantizer("rowq(bits=16)"), NoneQuantizer)
    for bad in ("rowq(bits=2)", "rowq(bits=3)", "rowq(group=4)"):
        with pytest.raises(ConfigError):
            get_quantizer(bad)


@settings(max_examples=40)
@given(bits=st.sampled_from([4, 8]), dtype=st.sampled_from(list(DTYPES)),
       a=st.integers(1, 5), b=st.integers(1, 3), c=st.integers(1, 33),
       seed=st.integers(0, 2**31))
def test_round_trip_within_half_a_step(bits: int, dtype: str, a: int, b: int, c: int,
                                       seed: int) -> None:
    q = RowQuantizer(bits)
    shape = (2, a, b, c)
    x = _block(shape, dtype, seed)
    enc = q.encode(x)
    assert len(enc) == q.encoded_size(shape, dtype)
    y = q.decode(enc, shape, dtype)
    assert y.shape == shape and y.dtype == x.dtype
    xf = x.astype(np.float32).reshape(-1, c)
    yf = y.astype(np.float32).reshape(-1, c)
    step = np.abs(xf).max(axis=1, keepdims=True) / q.qmax
    ulp = {"float16": 2.0**-10, "bfloat16": 2.0**-7, "float32": 2.0**-23}[dtype]
    bound = step / 2 * (1 + 1e-5) + np.abs(xf) * ulp + 1e-30
    assert (np.abs(xf - yf) <= bound).all()


def test_zero_rows_and_extremes() -> None:
    x = np.zeros((2, 2, 1, 4), np.float16)
    x[1, 1, 0] = [65504, -65504, 1, 0]
    for bits in (4, 8):
        y = RowQuantizer(bits).decode(RowQuantizer(bits).encode(x), x.shape, "float16")
        assert np.isfinite(y.astype(np.float32)).all()
        assert (y[0] == 0).all() and y[1, 1, 0, 0] == 65504 and y[1, 1, 0, 1] == -65504


def test_bad_inputs_are_typed() -> None:
    q = RowQuantizer(8)
    x = np.ones((2, 1, 1, 4), np.float32)
    x[0, 0, 0, 0] = np.nan
    with pytest.raises(ShapeError):
        q.encode(x)
    with pytest.raises(ShapeError):
        q.encode(np.ones((3, 4), np.float32))
    enc = q.encode(np.ones((2, 1, 1, 4), np.float32))
    with pytest.raises(CorruptRecordError):
        q.decode(enc[:-1], (2, 1, 1, 4), "float32")
    with pytest.raises(CorruptRecordError):
        q.decode(enc, (2, 1, 1, 4), "float16")          # dtype differs from the encoding's
    with pytest.raises(CorruptRecordError):
        RowQuantizer(4).decode(enc[:len(enc) - 2], (2, 1, 1, 4), "float32")


def test_smaller_than_raw_and_sizes() -> None:
    shape = (2, 96, 1, 64)
    for dtype in DTYPES:
        raw = int(np.prod(shape)) * np.dtype(DTYPES[dtype]).itemsize
        assert RowQuantizer(8).encoded_size(shape, dtype) < raw
        assert RowQuantizer(4).encoded_size(shape, dtype) == 16 + 4 * 192 + 192 * 64 // 2


def test_through_a_record_with_ecc() -> None:
    from rkv.codec.stages import codec_for

    x = _block((2, 6, 1, 40), "float16", 3)
    q = RowQuantizer(4)
    header = RecordHeader(key=bytes(32), layer=1, fingerprint=bytes(16), shape=x.shape,
                          dtype="float16", data_len=0, payload_len=0)
    rec = encode_block(header, x, codec_for("rs(255,239)"), quant=q)
    dec = decode_record(bytes(rec))
    assert dec.header.codecs[0] == {"id": "rowq", "bits": 4}
    out = np.empty_like(x)
    read_block(dec, out)
    assert np.array_equal(out, q.decode(q.encode(x), x.shape, "float16"))
