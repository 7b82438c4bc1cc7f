"""Binary BCH: differential tests against bchlib (Linux kernel BCH) and galois, bit errors."""

from __future__ import annotations

import bchlib
import numpy as np
import pytest
from ecc_helpers import rand_bytes
from hypothesis import given, settings
from hypothesis import strategies as st

from rkv.ecc import BCHCodec, get_codec
from rkv.ecc.bch import default_chunk_bytes, max_t
from rkv.ecc.gf import BCH_PRIM_POLYS, _gf2_mod, bch_generator

PARAMS = [(5, 1), (5, 2), (5, 5), (6, 3), (6, 10), (7, 4), (8, 3), (8, 16), (9, 5), (10, 8),
          (11, 12), (12, 16), (13, 1), (13, 4), (13, 8), (13, 40), (14, 20), (14, 40), (15, 8),
          (15, 64)]


def bch(m: int, t: int, chunk: int | None = None) -> BCHCodec:
    cfg: dict[str, object] = {"id": "bch", "m": m, "t": t}
    if chunk is not None:
        cfg["chunk_bytes"] = chunk
    c = get_codec(cfg)
    assert isinstance(c, BCHCodec)
    return c


def coded_bit_offsets(c: BCHCodec, size: int) -> list[list[int]]:
    """Bit offsets (MSB-first numbering of the encoded buffer) of each chunk's codeword."""
    out = []
    nchunks = -(-size // c.chunk_bytes)
    for q in range(nchunks):
        lo = q * c.chunk_bytes
        hi = min(size, lo + c.chunk_bytes)
        bits = list(range(8 * lo, 8 * hi))
        eo = 8 * (size + q * c.ecc_bytes)
        bits += list(range(eo, eo + c.ecc_bits))
        out.append(bits)
    return out


def flip_bits(buf: bytes, bits: list[int]) -> bytes:
    b = bytearray(buf)
    for x in bits:
        b[x // 8] ^= 0x80 >> (x % 8)
    return bytes(b)


@pytest.mark.parametrize(("m", "t"), PARAMS)
def test_parity_matches_bchlib(m: int, t: int) -> None:
    c = bch(m, t)
    ref = bchlib.BCH(t, m=m)
    assert (ref.ecc_bits, ref.ecc_bytes, ref.prim_poly) == (c.ecc_bits, c.ecc_bytes, c.prim_poly)
    rng = np.random.default_rng(m * 100 + t)
    for size in sorted({1, 7, 8, 9, c.chunk_bytes, c.chunk_bytes + 3, 2 * c.chunk_bytes}):
        data = rand_bytes(rng, size)
        enc = c.encode(data)
        for q in range(-(-size // c.chunk_bytes)):
            chunk = data[q * c.chunk_bytes : (q + 1) * c.chunk_bytes]
            mine = enc[size + q * c.ecc_bytes : size + (q + 1) * c.ecc_bytes]
            assert bytes(ref.encode(chunk)) == mine


@pytest.mark.parametrize(("m", "t"), [(8, 3), (13, 8), (13, 40), (14, 40)])
def test_decode_matches_bchlib(m: int, t: int) -> None:
    c = bch(m, t)
    ref = bchlib.BCH(t, m=m)
    rng = np.random.default_rng(t)
    size = c.chunk_bytes
    for nerr in (1, 2, 3, t // 2, t):
        data = rand_bytes(rng, size)
        enc = c.encode(data)
        bits = rng.choice(coded_bit_offsets(c, size)[0], max(nerr, 1), replace=False)
        bad = flip_bits(enc, bits.tolist())
        dd, ee = bytearray(bad[:size]), bytearray(bad[size:])
        assert ref.decode(dd, ee) == len(bits)
        ref.correct(dd, ee)
        res = c.decode(bad)
        assert res.data == bytes(dd) == data
        assert res.n_corrected == len(bits)


def test_matches_galois_bch() -> None:
    """galois.BCH(63, 45, c=1) over GF(2^6) with the kernel's polynomial 0x43 gives the same
    parity bits for the same (MSB-first) message bits, shortened codes included."""
    galois = pytest.importorskip("galois")
    c = bch(6, 3, chunk=5)
    gf = galois.GF(2**6, irreducible_poly=c.prim_poly)
    ref = galois.BCH(63, 63 - c.ecc_bits, extension_field=gf, alpha=gf(2), c=1)
    assert ref.t == 3
    rng = np.random.default_rng(0)
    for size in (1, 3, 5):
        data = rand_bytes(rng, size)
        bits = np.unpackbits(np.frombuffer(data, np.uint8))
        cw = np.asarray(ref.encode(galois.GF2(bits)))
        enc = c.encode(data)
        mine = np.unpackbits(np.frombuffer(enc[size:], np.uint8))[: c.ecc_bits]
        assert (cw[-c.ecc_bits :] == mine).all()
        # both decoders correct the same 3 bit errors
        pos = rng.choice(cw.size, 3, replace=False)
        bad_cw = cw.copy()
        bad_cw[pos] ^= 1
        dec = np.asarray(ref.decode(galois.GF2(bad_cw)))
        offs = coded_bit_offsets(c, size)[0]
        res = c.decode(flip_bits(enc, [offs[p] for p in pos]))
        assert res.data == np.packbits(dec).tobytes() == data and res.n_corrected == 3


def test_generator_degree_and_limits() -> None:
    assert bch_generator(13, 40, BCH_PRIM_POLYS[13]).bit_length() - 1 == 520
    assert bch_generator(5, 5, BCH_PRIM_POLYS[5]).bit_length() - 1 == 20  # coset of 9 == of 5
    assert default_chunk_bytes(13, 520) == 512
    assert default_chunk_bytes(14, 560) == 1024
    assert max_t(5) == 5 and max_t(13) > 300
    bch(5, max_t(5))
    with pytest.raises(ValueError, match="max t"):
        bch(5, max_t(5) + 1)


@st.composite
def bch_case(draw: st.DrawFn) -> tuple[BCHCodec, bytes]:
    m, t = draw(st.sampled_from([(5, 2), (6, 3), (8, 3), (10, 8), (13, 8), (13, 40), (14, 20)]))
    c = bch(m, t)
    size = draw(st.integers(1, 2 * c.chunk_bytes + 5))
    return c, draw(st.binary(min_size=size, max_size=size))


@settings(max_examples=50)
@given(bch_case(), st.data())
def test_corrects_up_to_t_bits(case: tuple[BCHCodec, bytes], draw: st.DataObject) -> None:
    c, data = case
    enc = c.encode(data)
    flips: list[int] = []
    for bits in coded_bit_offsets(c, len(data)):
        ne = draw.draw(st.integers(0, c.t))
        flips += draw.draw(st.lists(st.sampled_from(bits), min_size=ne, max_size=ne, unique=True))
    res = c.decode(flip_bits(enc, flips))
    assert res.data == data
    assert res.n_corrected == len(flips)
    assert res.status == ("corrected" if flips else "clean")


@settings(max_examples=60)
@given(bch_case(), st.data())
def test_beyond_capability_never_lies(case: tuple[BCHCodec, bytes], draw: st.DataObject) -> None:
    c, data = case
    enc = c.encode(data)
    chunks = coded_bit_offsets(c, len(data))
    q = draw.draw(st.integers(0, len(chunks) - 1))
    nerr = min(len(chunks[q]), draw.draw(st.integers(c.t + 1, 3 * c.t + 2)))
    flips = draw.draw(st.lists(st.sampled_from(chunks[q]), min_size=nerr, max_size=nerr,
                               unique=True))
    bad = flip_bits(enc, flips)
    res = c.decode(bad)
    if res.status == "uncorrectable":
        assert res.data == b""
        return
    again = np.unpackbits(np.frombuffer(c.encode(res.data), np.uint8))
    got = np.unpackbits(np.frombuffer(bad, np.uint8))
    for bits in chunks:
        assert int((again[bits] != got[bits]).sum()) <= c.t
    assert res.n_corrected == int(sum((again[b] != got[b]).sum() for b in chunks))


def test_padding_bits_are_not_coded() -> None:
    c = bch(13, 4)  # 52 ecc bits in 7 bytes: 4 padding bits
    data = b"abc" * 100
    enc = c.encode(data)
    bad = flip_bits(enc, [8 * len(enc) - 1])
    res = c.decode(bad)
    assert res.status == "clean" and res.data == data


def test_heavy_errors_every_chunk() -> None:
    c = bch(13, 40)
    rng = np.random.default_rng(9)
    data = rand_bytes(rng, 8 * c.chunk_bytes)
    enc = c.encode(data)
    flips: list[int] = []
    for bits in coded_bit_offsets(c, len(data)):
        flips += rng.choice(bits, 40, replace=False).tolist()
    res = c.decode(flip_bits(enc, flips))
    assert res.data == data and res.n_corrected == 8 * 40


def test_wide_register_scalar_kernel() -> None:
    """Parity registers wider than 32 words (here 375 bytes) use the scalar LFSR kernel;
    checked against a plain GF(2) polynomial division."""
    c = bch(15, 200)
    assert c.ecc_bytes == 375
    g = bch_generator(15, 200, BCH_PRIM_POLYS[15])
    rng = np.random.default_rng(4)
    data = rand_bytes(rng, c.chunk_bytes + 77)
    enc = c.encode(data)
    for q, chunk in enumerate((data[: c.chunk_bytes], data[c.chunk_bytes :])):
        rem = _gf2_mod(int.from_bytes(chunk, "big") << c.ecc_bits, g)
        want = (rem << (8 * c.ecc_bytes - c.ecc_bits)).to_bytes(c.ecc_bytes, "big")
        assert enc[len(data) + q * c.ecc_bytes : len(data) + (q + 1) * c.ecc_bytes] == want
    flips = rng.choice(coded_bit_offsets(c, len(data))[0], 150, replace=False).tolist()
    res = c.decode(flip_bits(enc, flips))
    assert res.data == data and res.n_corrected == 150
