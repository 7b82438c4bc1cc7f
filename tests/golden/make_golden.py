"""Regenerate the frozen record files of the current format. Run only when the format
version changes (the files of older versions stay as their release wrote them).

    .venv/bin/python tests/golden/make_golden.py
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from rkv.format.dtypes import numpy_dtype
from rkv.format.record import RecordHeader, encode_array_record

HERE = Path(__file__).parent
#: Format v1 records (no write time), written by the first release; this build reads them
#: but no longer writes v1, so these files are never regenerated.
V1_CASES = {
    "record_v1_float16": ("float16", (2, 5, 2, 4), 3),
    "record_v1_bfloat16": ("bfloat16", (2, 3, 1, 8), 0),
    "record_v1_float32": ("float32", (2, 1, 3, 2), 65535),
}
#: Format v2 records: the same blocks, written at WRITTEN_NS[name] (ns since the epoch).
V2_CASES = {name.replace("_v1_", "_v2_"): case for name, case in V1_CASES.items()}
WRITTEN_NS = {
    "record_v2_float16": 1_764_590_400_123_456_789,     # 2025-12-01 12:00:00.123456789 UTC
    "record_v2_bfloat16": 1,                            # the smallest known time
    "record_v2_float32": (1 << 64) - 1,                 # the largest
}
CASES = {**V1_CASES, **V2_CASES}
#: Format v3 (framing copies spread over sectors), written for shard codes with shards of a
#: sector or more: a block of 16 KiB under shardrs(k=4,m=2) (shards of 4,104 bytes).
V3_CASES = {"record_v3_float16_shardrs": ("float16", (2, 64, 2, 32), 7)}
V3_CODEC = "shardrs(k=4,m=2)"
WRITTEN_NS["record_v3_float16_shardrs"] = 1_796_160_000_000_000_000   # 2026-12-01 UTC


def case_data(dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """Data that is fixed by construction (no RNG whose stream could change)."""
    n = int(np.prod(shape))
    values = (np.arange(n, dtype=np.float64) * 0.37 - n / 5.0) / 3.0
    return values.reshape(shape).astype(numpy_dtype(dtype))


def case_header(name: str, dtype: str, shape: tuple[int, ...], layer: int) -> RecordHeader:
    key = bytes(range(32)) if dtype != "float32" else bytes(range(255, 223, -1))
    return RecordHeader(key=key, layer=layer, fingerprint=bytes(range(100, 116)),
                        shape=shape, dtype=dtype, data_len=0, payload_len=0,
                        written_ns=WRITTEN_NS.get(name))


def v3_record(name: str) -> bytes:
    """The v3 case's record, as this build writes it."""
    from rkv.codec.blockcodec import encode_block
    from rkv.ecc import get_codec

    dtype, shape, layer = V3_CASES[name]
    return bytes(encode_block(case_header(name, dtype, shape, layer), case_data(dtype, shape),
                              get_codec(V3_CODEC)))


if __name__ == "__main__":
    for name, (dtype, shape, layer) in V3_CASES.items():
        rec3 = v3_record(name)
        (HERE / f"{name}.bin").write_bytes(rec3)
        (HERE / f"{name}.json").write_text(json.dumps(
            {"dtype": dtype, "shape": list(shape), "layer": layer, "bytes": len(rec3),
             "written_ns": WRITTEN_NS[name], "ecc": V3_CODEC}, indent=1) + "\n")
        print(name, len(rec3))
    for name, (dtype, shape, layer) in V2_CASES.items():
        data = case_data(dtype, shape)
        rec = encode_array_record(case_header(name, dtype, shape, layer), data)
        (HERE / f"{name}.bin").write_bytes(bytes(rec))
        (HERE / f"{name}.json").write_text(json.dumps(
            {"dtype": dtype, "shape": list(shape), "layer": layer, "bytes": len(rec),
             "written_ns": WRITTEN_NS[name]},
            indent=1) + "\n")
        print(name, len(rec))
