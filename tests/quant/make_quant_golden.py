"""Regenerate the frozen kivi payloads. Run only when the kivi layout version changes.

    .venv/bin/python tests/quant/make_quant_golden.py

For each case it writes ``golden/<name>.bin`` (the encoding), ``golden/<name>.out.bin`` (the
decoded block's raw bytes) and ``golden/<name>.json`` (spec, dtype, shape, sizes).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
GOLDEN = HERE / "golden"
sys.path.insert(0, str(HERE.parents[1]))

from rkv.format.dtypes import numpy_dtype  # noqa: E402
from rkv.quant import get_quantizer  # noqa: E402

CASES: dict[str, tuple[str, str, tuple[int, int, int, int]]] = {
    "kivi_b8_g4_float16": ("kivi(bits=8,group=4)", "float16", (2, 5, 2, 8)),
    "kivi_b4_g32_float16": ("kivi(bits=4,group=32)", "float16", (2, 37, 2, 64)),
    "kivi_b4_g16_bfloat16": ("kivi(bits=4,group=16)", "bfloat16", (2, 20, 1, 8)),
    "kivi_b2_g3_float32": ("kivi(bits=2,group=3)", "float32", (2, 7, 3, 5)),
    "kivi_b2_g32_float16": ("kivi(bits=2,group=32)", "float16", (2, 3, 1, 3)),
}


def case_data(dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """Data fixed by construction (integer arithmetic and one division, no RNG): a pseudo-random
    pattern, an outlier channel in the keys, an outlier token in the values, a constant value
    row, exact zeros and negative zeros."""
    n = int(np.prod(shape))
    i = np.arange(n, dtype=np.int64)
    x = (((i * 7919 + 13) % 1009) - 504).astype(np.float64) / 61.0
    x = x.reshape(shape)
    x[0, :, :, 1 % shape[3]] *= 40.0  # outlier key channel
    x[1, shape[1] // 2] *= 25.0  # outlier value token
    x[1, 0, 0, :] = 1.5  # a constant value row
    x[0, 0, 0, :] = 0.0
    x[0, -1, -1, -1] = -0.0
    return x.astype(numpy_dtype(dtype))


if __name__ == "__main__":
    GOLDEN.mkdir(exist_ok=True)
    for name, (spec, dtype, shape) in CASES.items():
        q = get_quantizer(spec)
        enc = q.encode(case_data(dtype, shape))
        out = q.decode(enc, shape, dtype)
        (GOLDEN / f"{name}.bin").write_bytes(enc)
        (GOLDEN / f"{name}.out.bin").write_bytes(out.tobytes())
        (GOLDEN / f"{name}.json").write_text(json.dumps(
            {"spec": spec, "dtype": dtype, "shape": list(shape), "bytes": len(enc)},
            indent=1) + "\n")
        print(name, len(enc))
