"""Regenerate the frozen record files. Run only when the format version changes.

    .venv/bin/python tests/golden/make_golden.py
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from rkv.record import RecordHeader, encode_array_record
from rkv.tensors import numpy_dtype

HERE = Path(__file__).parent
CASES = {
    "record_v1_float16": ("float16", (2, 5, 2, 4), 3),
    "record_v1_bfloat16": ("bfloat16", (2, 3, 1, 8), 0),
    "record_v1_float32": ("float32", (2, 1, 3, 2), 65535),
}


def case_data(dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """Data that is fixed by construction (no RNG whose stream could change)."""
    n = int(np.prod(shape))
    values = (np.arange(n, dtype=np.float64) * 0.37 - n / 5.0) / 3.0
    return values.reshape(shape).astype(numpy_dtype(dtype))


def case_header(name: str, dtype: str, shape: tuple[int, ...], layer: int) -> RecordHeader:
    key = bytes(range(32)) if dtype != "float32" else bytes(range(255, 223, -1))
    return RecordHeader(key=key, layer=layer, fingerprint=bytes(range(100, 116)),
                        shape=shape, dtype=dtype, data_len=0, payload_len=0)


if __name__ == "__main__":
    for name, (dtype, shape, layer) in CASES.items():
        data = case_data(dtype, shape)
        rec = encode_array_record(case_header(name, dtype, shape, layer), data)
        (HERE / f"{name}.bin").write_bytes(bytes(rec))
        (HERE / f"{name}.json").write_text(json.dumps(
            {"dtype": dtype, "shape": list(shape), "layer": layer, "bytes": len(rec)},
            indent=1) + "\n")
        print(name, len(rec))
