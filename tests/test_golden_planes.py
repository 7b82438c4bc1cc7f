"""Records written before quantized planes (tests/golden/make_planes_golden.py, run on the
build before them) still decode byte for byte, and this build writes them identically: a
float16 block in byte planes, and a KIVI 4-bit block under a single code."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rkv.codec.blockcodec import read_block
from rkv.format.record import decode_record

GOLDEN = Path(__file__).parent / "golden"


def _mod() -> Any:
    spec = importlib.util.spec_from_file_location("make_planes_golden",
                                                  GOLDEN / "make_planes_golden.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("name", ["record_planes_float16", "record_kivi4_rs_float16"])
def test_old_records_decode_byte_exact(name: str) -> None:
    mod = _mod()
    meta = json.loads((GOLDEN / f"{name}.json").read_text())
    raw = (GOLDEN / f"{name}.bin").read_bytes()
    want = (GOLDEN / f"{name}.out.bin").read_bytes()
    assert len(raw) == meta["bytes"]
    dec = decode_record(raw)
    out = np.empty(tuple(meta["shape"]), np.float16)
    v = read_block(dec, out)
    assert v.corrected == 0 and v.degraded == 0
    assert out.tobytes() == want
    assert mod.record(name) == raw


def test_an_old_planes_record_still_degrades_with_its_high_bytes_exact() -> None:
    raw = bytearray((GOLDEN / "record_planes_float16.bin").read_bytes())
    want = np.frombuffer((GOLDEN / "record_planes_float16.out.bin").read_bytes(), np.uint8)
    dec = decode_record(bytes(raw))
    end = dec.header_bytes + dec.header.payload_len
    for i in range(12):                    # 12 bytes into the low plane's last codeword
        raw[end - 40 + 3 * i] ^= 0x21
    out = np.empty(tuple(dec.header.shape), np.float16)
    v = read_block(decode_record(bytes(raw)), out)
    assert v.degraded > 0
    got = out.reshape(-1).view(np.uint8)
    assert np.array_equal(got[1::2], want[1::2]) and not np.array_equal(got, want)
