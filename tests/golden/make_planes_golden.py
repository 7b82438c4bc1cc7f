"""Frozen records of the layouts quantized planes touch, as the build before them wrote them
(commit 509d409): a float16 block in byte planes, and a KIVI 4-bit block under the planes'
high code over the whole block (what a planes tier gave a quantized block then). Each comes
with what reading it returns (``.out.bin``, the block's values). Never regenerated with a
newer build: they pin that old records keep decoding byte for byte.

    PYTHONPATH=<a checkout of 509d409> .venv/bin/python tests/golden/make_planes_golden.py
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from rkv.format.record import RecordHeader

HERE = Path(__file__).parent
#: name: (quantizer spec, code spec, shape)
CASES = {
    "record_planes_float16": ("none", "planes(high=rs(255,223),low=rs(255,247),tolerant=1)",
                              (2, 16, 2, 8)),
    "record_kivi4_rs_float16": ("kivi(bits=4)", "rs(255,223)", (2, 48, 2, 16)),
}
WRITTEN_NS = 1_796_160_000_000_000_000


def case_data(shape: tuple[int, ...]) -> np.ndarray:
    """Data fixed by construction (no RNG whose stream could change)."""
    n = int(np.prod(shape))
    values = np.sin(np.arange(n, dtype=np.float64) * 0.731) * 3.0 + 0.25
    return values.reshape(shape).astype(np.float16)


def case_header(shape: tuple[int, ...]) -> RecordHeader:
    return RecordHeader(key=bytes(range(32)), layer=1, fingerprint=bytes(range(100, 116)),
                        shape=shape, dtype="float16", data_len=0, payload_len=0,
                        written_ns=WRITTEN_NS)


def record(name: str) -> bytes:
    from rkv.codec.pipeline import Pipeline

    quant, code, shape = CASES[name]
    pipe = Pipeline.parse(quant, code).for_block(shape, "float16")
    return bytes(pipe.encode(case_header(shape), case_data(shape)))


if __name__ == "__main__":
    from rkv.codec.blockcodec import read_block
    from rkv.format.record import decode_record

    for name, (quant, code, shape) in CASES.items():
        rec = record(name)
        out = np.empty(shape, np.float16)
        read_block(decode_record(rec), out)
        (HERE / f"{name}.bin").write_bytes(rec)
        (HERE / f"{name}.out.bin").write_bytes(out.tobytes())
        (HERE / f"{name}.json").write_text(json.dumps(
            {"quant": quant, "ecc": code, "shape": list(shape), "bytes": len(rec)},
            indent=1) + "\n")
        print(name, len(rec))
