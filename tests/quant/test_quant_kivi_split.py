"""KIVI with different key and value widths (``kivi(bits=K, vbits=V)``, layout version 2):
each half decodes exactly as the equal-width quantizer of its own width decodes it, the
layout is what docs/quantization.md says, equal widths still write layout 1, damage to the
metadata is repaired as in layout 1, and records of both layouts read back from frozen
files."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from quant_helpers import make_block

from rkv.errors import ConfigError, CorruptRecordError
from rkv.quant import KiviQuantizer, get_quantizer

GOLDEN = Path(__file__).parents[1] / "golden"
WIDTHS = (8, 4, 2)


@settings(max_examples=60, deadline=None)
@given(kb=st.sampled_from(WIDTHS), vb=st.sampled_from(WIDTHS),
       tokens=st.integers(1, 70), heads=st.integers(1, 3), dim=st.integers(1, 40),
       group=st.sampled_from([1, 3, 16, 32]), dtype=st.sampled_from(["float16", "bfloat16",
                                                                     "float32"]),
       seed=st.integers(0, 2**31), kind=st.sampled_from(["normal", "wide", "constant"]))
def test_each_half_decodes_as_its_own_width(kb: int, vb: int, tokens: int, heads: int,
                                            dim: int, group: int, dtype: str, seed: int,
                                            kind: str) -> None:
    shape = (2, tokens, heads, dim)
    x = make_block(seed, shape, dtype, kind)
    split = KiviQuantizer(kb, group, vbits=vb)
    got = split.decode(split.encode(x), shape, dtype)
    keys = KiviQuantizer(kb, group)
    vals = KiviQuantizer(vb, group)
    assert got[0].tobytes() == keys.decode(keys.encode(x), shape, dtype)[0].tobytes()
    assert got[1].tobytes() == vals.decode(vals.encode(x), shape, dtype)[1].tobytes()
    assert len(split.encode(x)) == split.encoded_size(shape, dtype)


def test_layout_version_2_as_documented() -> None:
    """Header byte 4 = 2, byte 5 = key bits, byte 7 = value bits; the codes are the keys'
    packing then the values', padded together to 8 bytes; copy 2 follows."""
    shape = (2, 5, 1, 3)      # 15 keys: 8 bytes at 4 bits, 4 bytes at 2 bits
    x = make_block(1, shape, "float16")
    q = KiviQuantizer(4, 32, vbits=2)
    enc = q.encode(x)
    lay = q.layout(shape, "float16")
    magic, version, kb, dcode, vb, g, gv, t, h, d = struct.unpack("<4sBBBBHHIII", enc[:24])
    assert (magic, version, kb, dcode, vb, g, gv, t, h, d) == (b"RKVQ", 2, 4, 1, 2, 32, 3,
                                                               5, 1, 3)
    cl = lay.copy_len
    assert lay.codes_offset == 2 * cl and lay.key_codes_len == 8
    assert lay.codes_len == 8 + 4 and lay.copy_offsets[2] == 2 * cl + 16
    assert enc[:cl] == enc[cl:2 * cl] == enc[lay.copy_offsets[2]:]
    assert enc[2 * cl + 12:2 * cl + 16] == bytes(4)          # padding
    assert len(enc) == 3 * cl + 16


def test_equal_widths_write_layout_1() -> None:
    x = make_block(2, (2, 33, 2, 8), "float16")
    assert KiviQuantizer(4, 32, vbits=4).encode(x) == KiviQuantizer(4, 32).encode(x)
    assert get_quantizer("kivi(bits=4,vbits=4)").spec == "kivi(bits=4,group=32)"
    assert get_quantizer("kivi(bits=4,vbits=2)").spec == "kivi(bits=4,group=32,vbits=2)"


def test_metadata_damage_repaired_and_codes_checked() -> None:
    shape = (2, 40, 2, 8)
    x = make_block(3, shape, "bfloat16")
    q = KiviQuantizer(2, 16, vbits=8)
    enc = bytearray(q.encode(x))
    ref = q.decode(bytes(enc), shape, "bfloat16")
    lay = q.layout(shape, "bfloat16")
    enc[5] ^= 0xFF                        # copy 0's key width
    enc[lay.copy_len + 7] ^= 0x0F         # copy 1's value width
    r = q.decode_result(bytes(enc), shape, "bfloat16")
    assert r.status == "corrected" and r.array.tobytes() == ref.tobytes()
    # A version-2 payload handed to the quantizer of other widths is refused, not misread.
    with pytest.raises(CorruptRecordError):
        KiviQuantizer(2, 16, vbits=4).decode(q.encode(x), shape, "bfloat16")


@pytest.mark.parametrize("spec", ["kivi(bits=16,vbits=4)", "kivi(bits=4,vbits=16)",
                                  "kivi(bits=4,vbits=3)", "kivi(bits=4,vbits=true)"])
def test_bad_widths_refused(spec: str) -> None:
    with pytest.raises(ConfigError):
        get_quantizer(spec)


@pytest.mark.parametrize("name", ["record_kivi1_4bit", "record_kivi1_2bit",
                                  "record_kivi2_4k2v", "record_kivi2_2k8v"])
def test_frozen_records_read(name: str) -> None:
    """Records frozen in tests/golden (layout 1 by the release before split widths, layout
    2 by this one): read back verified, the quantizer's round trip of the fixed data, and
    re-encoded byte for byte."""
    import sys

    sys.path.insert(0, str(GOLDEN))
    from make_kivi_golden import case_data, case_record

    from rkv.codec.blockcodec import read_block
    from rkv.codec.stages import header_stages
    from rkv.format.record import decode_record

    meta = json.loads((GOLDEN / f"{name}.json").read_text())
    frozen = (GOLDEN / f"{name}.bin").read_bytes()
    assert len(frozen) == meta["bytes"]
    dec = decode_record(frozen)
    quant, codec = header_stages(dec.header)
    assert quant is not None and quant.spec == get_quantizer(meta["quant"]).spec
    assert codec is not None and codec.spec == "rs(n=255,k=239,interleave=1)"
    out = np.empty(tuple(meta["shape"]), np.float16)
    v = read_block(dec, out)
    assert v.corrected == 0 and v.degraded == 0
    q = get_quantizer(meta["quant"])
    data = case_data()
    want = q.decode(q.encode(data), data.shape, "float16")
    assert out.tobytes() == want.tobytes()
    assert case_record(meta["quant"]) == frozen
