"""The one dtype table (rkv.format.dtypes) against what numpy, torch and the record format say."""

from __future__ import annotations

import numpy as np
import pytest

from rkv.errors import ConfigError
from rkv.format import dtypes
from rkv.format.model import KV_DTYPES, ModelSpec
from rkv.format.record import RecordHeader, decode_record, encode_record


@pytest.mark.parametrize("name", dtypes.NAMES)
def test_each_dtype_agrees_with_numpy_and_torch(name: str) -> None:
    d = dtypes.check_dtype(name)
    np_dt = dtypes.numpy_dtype(name)
    assert np_dt.itemsize == d.itemsize == dtypes.itemsize(name)
    assert np_dt.name == name
    assert dtypes.BY_CODE[d.code] is d
    torch = pytest.importorskip("torch")
    assert getattr(torch, d.torch).itemsize == d.itemsize


@pytest.mark.parametrize("name", dtypes.NAMES)
def test_a_record_stores_the_tables_code(name: str) -> None:
    spec = ModelSpec(model_id="m", n_layers=1, n_kv_heads=1, head_dim=2, dtype=name)
    data = np.zeros((2, 3, 1, 2), dtypes.numpy_dtype(name))
    header = RecordHeader(key=bytes(32), fingerprint=spec.fingerprint(), layer=0, dtype=name,
                          shape=data.shape, data_len=data.nbytes, payload_len=data.nbytes)
    rec = encode_record(header, data.view(np.uint8).reshape(-1))
    assert decode_record(rec).header.dtype == name


def test_names_are_one_tuple_everywhere() -> None:
    assert KV_DTYPES is dtypes.NAMES
    assert [dtypes.DTYPES[n].code for n in dtypes.NAMES] == [1, 2, 3]   # docs/format.md


@pytest.mark.parametrize("bad", ["float64", "fp16", "", None, 16])
def test_unknown_dtypes_are_config_errors(bad: object) -> None:
    with pytest.raises(ConfigError, match="one of float16, bfloat16, float32"):
        dtypes.check_dtype(bad, "x")
