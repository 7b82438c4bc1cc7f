"""Frozen kivi payloads (tests/quant/golden, made by make_quant_golden.py): the byte layout
must not change silently."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from make_quant_golden import CASES, case_data
from quant_helpers import DTYPE_CODE, dequant_ref, error_bound, parse, per_element, unpack

from rkv.quant import KiviQuantizer, get_quantizer

GOLDEN = Path(__file__).parent / "golden"


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_payload(name: str) -> None:
    spec, dtype, shape = CASES[name]
    meta = json.loads((GOLDEN / f"{name}.json").read_text())
    assert meta == {"spec": spec, "dtype": dtype, "shape": list(shape),
                    "bytes": meta["bytes"]}
    frozen = (GOLDEN / f"{name}.bin").read_bytes()
    out = (GOLDEN / f"{name}.out.bin").read_bytes()
    q = get_quantizer(spec)
    assert isinstance(q, KiviQuantizer)
    x = case_data(dtype, shape)
    # encode reproduces the frozen bytes, decode the frozen values, byte for byte
    assert q.encode(x) == frozen
    assert len(frozen) == meta["bytes"] == q.encoded_size(shape, dtype)
    y = q.decode(frozen, shape, dtype)
    assert y.tobytes() == out
    # an independent reading of the layout agrees with it
    p = parse(frozen, q.bits, q.group, shape, dtype)
    assert p.header == (b"RKVQ", 1, q.bits, DTYPE_CODE[dtype], 0, q.group,
                        min(q.group, shape[3]), *shape[1:])
    for c in (1, 2):
        lo = p.copy_offsets[c]
        assert frozen[lo : lo + p.copy_len] == frozen[: p.copy_len]
    s, z = per_element(p, q.group, shape)
    assert dequant_ref(p.codes, s, z, dtype).tobytes() == out
    err = np.abs(x.astype(np.float64) - y.astype(np.float64))
    assert (err <= error_bound(x, s, z, q.bits, dtype)).all()
    # unused bits of the last code byte and the padding after the codes are zero
    n = 2 * int(np.prod(shape[1:]))
    used = n * q.bits
    last = frozen[p.codes_offset + p.codes_len - 1]
    if used % 8:
        assert last >> (used % 8) == 0
    assert not any(frozen[p.codes_offset + p.codes_len : p.copy_offsets[2]])


def test_packing_order_by_hand() -> None:
    """Element 0 in the low bits of the first code byte, element 1 next, and so on."""
    x = np.zeros((2, 1, 1, 4), np.float16)
    x[0, 0, 0] = [0, 1, 2, 3]  # keys: one channel per element, each group constant
    x[1, 0, 0] = [0, 1, 2, 3]  # values: one group of 4, scale 1, codes 0 1 2 3
    q = KiviQuantizer(2, 32)
    enc = q.encode(x)
    p = parse(enc, 2, 32, x.shape, "float16")
    codes = enc[p.codes_offset : p.codes_offset + p.codes_len]
    assert codes == bytes([0b00000000, 0b11100100])
    q4 = KiviQuantizer(4, 32)
    x[1, 0, 0] = [0, 5, 10, 15]
    enc = q4.encode(x)
    p = parse(enc, 4, 32, x.shape, "float16")
    assert enc[p.codes_offset : p.codes_offset + p.codes_len] == bytes([0, 0, 0x50, 0xFA])
    assert list(unpack(bytes([0xE4]), 2, 4)) == [0, 1, 2, 3]
