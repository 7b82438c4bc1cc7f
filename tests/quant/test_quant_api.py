"""The quantizer interface: registry, specs, configs, validation errors, lengths."""

from __future__ import annotations

import json
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from quant_helpers import make_block

from rkv.errors import ConfigError, CorruptRecordError, ShapeError
from rkv.quant import (
    CLEAN,
    KiviQuantizer,
    NoneQuantizer,
    Quantizer,
    available_quantizers,
    get_quantizer,
    parse_spec,
    register_quantizer,
)

SPECS = ["none", "kivi", "kivi(bits=8)", "kivi(bits=4,group=64)", "kivi(bits=2,group=32)",
         "kivi(2,7)"]


def test_registry() -> None:
    assert set(available_quantizers()) >= {"none", "kivi"}
    with pytest.raises(ConfigError, match="already registered"):
        register_quantizer(type("Other", (NoneQuantizer,), {}))


@pytest.mark.parametrize(
    ("spec", "cfg"),
    [
        ("none", {"id": "none"}),
        ("kivi", {"id": "kivi", "bits": 4, "group": 32}),
        ("kivi(bits=4)", {"id": "kivi", "bits": 4, "group": 32}),
        ("kivi(bits=2,group=32)", {"id": "kivi", "bits": 2, "group": 32}),
        (" KIVI ( 8 , 64 ) ", {"id": "kivi", "bits": 8, "group": 64}),
        ("kivi(2, group=1)", {"id": "kivi", "bits": 2, "group": 1}),
        ("kivi(bits=16)", {"id": "none"}),
        ("kivi(bits=16,group=8)", {"id": "none"}),
    ],
)
def test_spec_strings(spec: str, cfg: dict[str, Any]) -> None:
    q = get_quantizer(spec)
    assert q.get_config() == cfg
    assert get_quantizer(cfg) == q
    assert get_quantizer(q) is q
    assert get_quantizer(q.spec) == q
    assert get_quantizer(json.loads(json.dumps(cfg))) == q
    assert hash(get_quantizer(cfg)) == hash(q)


def test_dict_configs() -> None:
    q = get_quantizer({"id": "kivi", "bits": 8, "group": 32})
    assert isinstance(q, KiviQuantizer) and q.bits == 8 and q.group == 32
    assert q.spec == "kivi(bits=8,group=32)"
    assert get_quantizer({"id": "kivi", "bits": 16}) == NoneQuantizer()
    assert get_quantizer({"id": "none", "bits": 16}) == NoneQuantizer()
    assert NoneQuantizer().bits == 16 and NoneQuantizer().lossless
    assert not q.lossless
    assert repr(q) == "<KiviQuantizer kivi(bits=8,group=32)>"
    assert parse_spec("kivi(4)") == {"id": "kivi", "bits": 4}


@pytest.mark.parametrize(
    "spec",
    [
        "kivi(bits=3)", "kivi(bits=1)", "kivi(bits=0)", "kivi(bits=32)", "kivi(bits=-4)",
        "kivi(group=0)", "kivi(group=-1)", "kivi(group=65536)", "kivi(bits=x)",
        "kivi(bits=4,foo=1)", "kivi(4,32,1)", "kivi(bits=4,bits=4)", "kivi(bits=4,)",
        "kivi(group=4,8)", "unknown", "unknown(bits=4)", "kivi(", "4bit", "none(bits=8)",
        "none(x=1)", "", "kivi(b-its=4)",
    ],
)
def test_bad_specs(spec: str) -> None:
    with pytest.raises(ConfigError):
        get_quantizer(spec)


@pytest.mark.parametrize(
    "cfg",
    [
        {"id": "kivi", "bits": 3}, {"id": "kivi", "bits": True}, {"id": "kivi", "bits": 4.0},
        {"id": "kivi", "group": 0}, {"id": "kivi", "group": "32"}, {"id": "nope"}, {"bits": 4},
        {"id": 4}, {"id": "none", "bits": True},
    ],
)
def test_bad_configs(cfg: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        get_quantizer(cfg)


def test_bad_constructor_args() -> None:
    with pytest.raises(ConfigError):
        KiviQuantizer(3)
    with pytest.raises(ConfigError):
        KiviQuantizer(4, 0)
    with pytest.raises(ConfigError):
        KiviQuantizer(16)
    with pytest.raises(ConfigError):
        get_quantizer(3.5)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        KiviQuantizer.from_config([("id", "kivi")])  # type: ignore[arg-type]


@pytest.mark.parametrize("spec", SPECS)
def test_bad_blocks(spec: str) -> None:
    q = get_quantizer(spec)
    good = np.zeros((2, 3, 2, 4), np.float16)
    bad_blocks: list[Any] = [
        good[0],  # 3-D
        good[None],  # 5-D
        np.zeros((3, 3, 2, 4), np.float16),  # not K and V
        np.zeros((1, 3, 2, 4), np.float16),
        np.zeros((2, 0, 2, 4), np.float16),  # no tokens
        np.zeros((2, 3, 0, 4), np.float16),
        np.zeros((2, 3, 2, 0), np.float16),
        good.astype(np.float64),
        good.astype(np.int16),
        good.astype(ml_dtypes.float8_e4m3fn),
        good.tolist(),
        b"\x00" * 48,
    ]
    for block in bad_blocks:
        with pytest.raises(ShapeError):
            q.encode(block)


@pytest.mark.parametrize("spec", SPECS[1:])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_kivi_rejects_non_finite(spec: str, dtype: str) -> None:
    q = get_quantizer(spec)
    for bad in (np.nan, np.inf, -np.inf):
        for where in ((0, 0, 0, 0), (0, 2, 1, 3), (1, 0, 0, 0), (1, 2, 1, 3)):
            x = np.zeros((2, 3, 2, 4), dtype=np.float32)
            x[where] = bad
            with pytest.raises(ShapeError, match="finite"):
                q.encode(x.astype(make_block(0, (2, 1, 1, 1), dtype).dtype))
    if dtype != "float16":  # |x| >= 2**126 is refused too
        x = np.zeros((2, 3, 2, 4), dtype=np.float32)
        x[1, 1, 1, 1] = -(2.0**126)
        with pytest.raises(ShapeError):
            q.encode(x.astype(make_block(0, (2, 1, 1, 1), dtype).dtype))


def test_none_stores_anything() -> None:
    q = NoneQuantizer()
    x = np.array([np.nan, np.inf, -0.0, 1.0] * 6, np.float16).reshape(2, 3, 1, 4)
    assert q.decode(q.encode(x), x.shape, "float16").tobytes() == x.tobytes()


@pytest.mark.parametrize("spec", SPECS)
def test_decode_validation(spec: str) -> None:
    q = get_quantizer(spec)
    shape = (2, 5, 2, 8)
    enc = q.encode(make_block(3, shape, "bfloat16"))
    for bad_shape in [(5, 2, 8), (3, 5, 2, 8), (2, 0, 2, 8), (2, 5, 2, -8), "abc", None,
                      (2, 5.0, 2, 8), (2, True, 2, 8), [2, "5", 2, 8], (2, [5], 2, 8)]:
        with pytest.raises(ShapeError):
            q.decode(enc, bad_shape, "bfloat16")  # type: ignore[arg-type]
    for bad_dtype in ["float64", "int8", "half", np.float64]:
        with pytest.raises(ShapeError):
            q.decode(enc, shape, bad_dtype)  # type: ignore[arg-type]
    n = len(enc)
    for bad_len in (0, 1, n - 1, n + 1, n - 8, n + 8, 2 * n):
        buf = (enc * 3)[:bad_len]
        with pytest.raises(CorruptRecordError):
            q.decode(buf, shape, "bfloat16")
    # the right length for another dtype is still wrong here
    with pytest.raises(CorruptRecordError):
        q.decode(enc, shape, "float32")
    res = q.decode_result(enc, shape, "bfloat16")
    assert res.status == CLEAN and res.detail == ""


@given(st.integers(1, 300), st.integers(1, 9), st.integers(1, 300),
       st.sampled_from(["float16", "bfloat16", "float32"]), st.sampled_from([2, 4, 8, 16]),
       st.integers(1, 200))
def test_encoded_size_formula(t: int, h: int, d: int, dtype: str, bits: int,
                              group: int) -> None:
    q = get_quantizer({"id": "kivi", "bits": bits, "group": group})
    size = q.encoded_size((2, t, h, d), dtype)
    n = 2 * t * h * d
    w = 4 if dtype == "float32" else 2
    if bits == 16:
        assert size == n * w
        return
    gv = min(group, d)
    meta = 2 * w * (-(-t // group) * h * d + t * h * -(-d // gv))
    copy = 24 + -(-meta // 8) * 8 + 8
    codes = -(-n * bits // 8)
    assert size == 3 * copy + -(-codes // 8) * 8
    assert q.bits_per_element((2, t, h, d), dtype) == pytest.approx(8 * size / n)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("spec", SPECS)
def test_encoded_size_matches_encode(spec: str, dtype: str) -> None:
    q = get_quantizer(spec)
    for shape in [(2, 1, 1, 1), (2, 1, 1, 3), (2, 7, 3, 5), (2, 33, 2, 64), (2, 256, 3, 64)]:
        assert len(q.encode(make_block(1, shape, dtype))) == q.encoded_size(shape, dtype)


def test_quantizer_is_abstract() -> None:
    with pytest.raises(TypeError):
        Quantizer()  # type: ignore[abstract]
