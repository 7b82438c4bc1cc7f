"""Reed-Solomon: differential tests against reedsolo and galois, error/erasure patterns."""

from __future__ import annotations

import numpy as np
import pytest
import reedsolo
from ecc_helpers import flip, rand_bytes
from hypothesis import given, settings
from hypothesis import strategies as st

from rkv.ecc import RSCodec, get_codec
from rkv.ecc.gf import gf256, rs_generator, rs_slicing_tables

SPECS = [(255, 223, 1), (255, 239, 1), (255, 251, 1), (20, 12, 1), (40, 32, 3), (255, 223, 8),
         (12, 2, 2), (255, 254, 1), (9, 1, 1), (255, 213, 1), (255, 203, 1)]


def rs(n: int, k: int, i: int = 1) -> RSCodec:
    c = get_codec({"id": "rs", "n": n, "k": k, "interleave": i})
    assert isinstance(c, RSCodec)
    return c


def codeword_of(c: RSCodec, enc: bytes, size: int, q: int) -> tuple[bytes, bytes]:
    """(data, parity) of codeword ``q`` for a non-interleaved codec."""
    lens = c._lens(size)
    start = int(lens[:q].sum())
    data = enc[start : start + int(lens[q])]
    par = enc[size + q * c.nsym : size + (q + 1) * c.nsym]
    return data, par


# ----------------------------------------------------------------------- conventions
def test_generator_matches_reedsolo() -> None:
    reedsolo.init_tables(0x11D)
    for nsym in (1, 2, 10, 16, 32, 64, 254):
        assert list(rs_generator(nsym)) == list(reedsolo.rs_generator_poly(nsym, fcr=0))


@pytest.mark.parametrize("nsym", [1, 2, 3, 7, 8, 9, 16, 17, 24, 32, 33, 40, 64, 100, 200])
def test_parity_matches_reedsolo(nsym: int) -> None:
    """Same codewords as reedsolo's RSCodec(nsym, nsize=255) for every length (shortened)."""
    rng = np.random.default_rng(nsym)
    c = rs(255, 255 - nsym)
    ref = reedsolo.RSCodec(nsym, nsize=255)
    for size in (1, 5, 8, 9, 100, 255 - nsym, 255 - nsym + 3):
        data = rand_bytes(rng, size)
        enc = c.encode(data)
        for q in range(len(c._lens(size))):
            d, p = codeword_of(c, enc, size, q)
            assert bytes(ref.encode(d)) == d + p


def test_slicing_tables_width() -> None:
    """Tables are padded to the encoder's vector register widths (1..16, 20, 24, 28, 32)."""
    for nsym, want in ((1, 1), (8, 1), (9, 2), (16, 2), (17, 3), (32, 4), (33, 5), (129, 20),
                       (200, 28), (254, 32)):
        t, w = rs_slicing_tables(nsym)
        assert w == want and t.shape == (8 * 256 * w,)
        assert not t.flags.writeable


# ----------------------------------------------------------------------- galois
@pytest.fixture(scope="module")
def galois_rs() -> object:
    galois = pytest.importorskip("galois")
    return galois.ReedSolomon(255, 223, c=0)


def test_matches_galois(galois_rs: object) -> None:
    """galois.ReedSolomon(255, 223, c=0) over its default GF(2^8) (0x11d, alpha = x) gives
    the same systematic codewords, and both decoders make the same corrections."""
    galois_code = galois_rs
    rng = np.random.default_rng(7)
    c = rs(255, 223)
    msgs = rng.integers(0, 256, (4, 223))
    ref = np.asarray(galois_code.encode(galois_code.field(msgs)))  # type: ignore[attr-defined]
    for row, m in zip(ref, msgs, strict=True):
        assert c.encode(m.astype(np.uint8)) == row.astype(np.uint8).tobytes()
    bad = ref.copy()
    for r in range(bad.shape[0]):
        pos = rng.choice(255, 16, replace=False)
        bad[r, pos] ^= rng.integers(1, 256, 16, dtype=np.uint8)
    dec = np.asarray(galois_code.decode(galois_code.field(bad)))  # type: ignore[attr-defined]
    for r in range(bad.shape[0]):
        mine = c.decode(bad[r].astype(np.uint8).tobytes())
        assert mine.n_corrected == 16
        assert mine.data == dec[r].astype(np.uint8).tobytes() == msgs[r].astype(np.uint8).tobytes()


# ----------------------------------------------------------------------- properties
@st.composite
def rs_case(draw: st.DrawFn) -> tuple[RSCodec, bytes]:
    n, k, i = draw(st.sampled_from(SPECS))
    size = draw(st.integers(1, 3 * n * i))
    data = draw(st.binary(min_size=size, max_size=size))
    return rs(n, k, i), data


def _per_codeword_positions(c: RSCodec, size: int) -> list[list[int]]:
    """Byte offsets in the encoded buffer of each codeword's symbols, in codeword order."""
    lens = c._lens(size)
    out = []
    for q, ln in enumerate(lens):
        qq = np.full(int(ln) + c.nsym, q, dtype=np.int64)
        p = np.arange(int(ln) + c.nsym, dtype=np.int64)
        data_offs = c._data_offsets(qq[: int(ln)], p[: int(ln)])
        out.append(data_offs.tolist())
    # parity offsets: invert _map_erasures over the whole parity region
    enc_size = c.encoded_size(size)
    par_offs = np.arange(size, enc_size, dtype=np.int64)
    pq, pp = c._map_erasures(par_offs, size, lens)
    for o, q, p in zip(par_offs.tolist(), pq.tolist(), pp.tolist(), strict=True):
        assert p >= lens[q]
        out[q].append(o)
    return out


@settings(max_examples=60)
@given(rs_case(), st.data())
def test_corrects_up_to_t_errors(case: tuple[RSCodec, bytes], draw: st.DataObject) -> None:
    c, data = case
    enc = c.encode(data)
    offs, vals = [], []
    for cw in _per_codeword_positions(c, len(data)):
        ne = draw.draw(st.integers(0, min(c.t, len(cw))))
        pos = draw.draw(st.lists(st.sampled_from(cw), min_size=ne, max_size=ne, unique=True))
        offs += pos
        vals += draw.draw(st.lists(st.integers(1, 255), min_size=ne, max_size=ne))
    res = c.decode(flip(enc, offs, vals))
    assert res.data == data
    assert res.n_corrected == len(offs)
    assert res.status == ("corrected" if offs else "clean")


@settings(max_examples=60)
@given(rs_case(), st.data())
def test_errors_and_erasures(case: tuple[RSCodec, bytes], draw: st.DataObject) -> None:
    """Any e errors + f erasures with 2e + f <= n - k per codeword are corrected exactly;
    erased symbols may or may not actually be wrong."""
    c, data = case
    enc = c.encode(data)
    offs, vals, eras = [], [], []
    for cw in _per_codeword_positions(c, len(data)):
        f = draw.draw(st.integers(0, min(c.nsym, len(cw))))
        e = draw.draw(st.integers(0, min((c.nsym - f) // 2, len(cw) - f)))
        pos = draw.draw(st.lists(st.sampled_from(cw), min_size=e + f, max_size=e + f, unique=True))
        eras += pos[:f]
        for j, o in enumerate(pos):
            if j >= f or draw.draw(st.booleans()):  # some erasures hold the right value
                offs.append(o)
                vals.append(draw.draw(st.integers(1, 255)))
    res = c.decode(flip(enc, offs, vals), erasures=eras)
    assert res.data == data
    assert res.n_corrected == len(offs)


@settings(max_examples=80)
@given(rs_case(), st.data())
def test_beyond_capability_never_lies(case: tuple[RSCodec, bytes], draw: st.DataObject) -> None:
    """Random patterns with more than t errors: exact data, or uncorrectable, or (rarely) a
    miscorrection to *another valid codeword within t of the received word* - never a result
    that is not a codeword. The caller's end-to-end checksum catches miscorrections."""
    c, data = case
    enc = c.encode(data)
    nerr = draw.draw(st.integers(c.t + 1, c.t + 1 + c.nsym))
    nerr = min(nerr, len(enc))
    offs = draw.draw(
        st.lists(st.integers(0, len(enc) - 1), min_size=nerr, max_size=nerr, unique=True)
    )
    vals = draw.draw(st.lists(st.integers(1, 255), min_size=nerr, max_size=nerr))
    bad = flip(enc, offs, vals)
    res = c.decode(bad)
    if res.status == "uncorrectable":
        assert res.data == b"" and res.n_corrected == 0
        return
    # claimed success: the result re-encodes to a codeword within t symbols per codeword
    again = c.encode(res.data)
    diff = np.frombuffer(again, np.uint8) != np.frombuffer(bad, np.uint8)
    for cw in _per_codeword_positions(c, len(data)):
        assert int(diff[cw].sum()) <= c.t
    assert res.n_corrected == int(diff.sum())
    # "clean" only when the received word was itself a valid encoding (an error pattern that
    # is a codeword is undetectable by any decoder of this code)
    assert (res.status == "clean") == (again == bad)


def test_beyond_capability_statistics() -> None:
    """With t+1 .. 2t errors per codeword, decoding is overwhelmingly uncorrectable and a
    miscorrection (if any) is still a valid codeword."""
    rng = np.random.default_rng(5)
    c = rs(255, 239)
    data = rand_bytes(rng, 239)
    enc = c.encode(data)
    outcomes = {"uncorrectable": 0, "miscorrected": 0}
    for _ in range(300):
        nerr = int(rng.integers(c.t + 1, 2 * c.t + 1))
        pos = rng.choice(255, nerr, replace=False)
        bad = flip(enc, pos.tolist(), rng.integers(1, 256, nerr).tolist())
        res = c.decode(bad)
        assert res.data != data
        if res.status == "uncorrectable":
            outcomes["uncorrectable"] += 1
        else:
            outcomes["miscorrected"] += 1
            assert c.decode(c.encode(res.data)).status == "clean"
    assert outcomes["uncorrectable"] >= 280


def test_interleaved_burst() -> None:
    """With interleave I, any burst of I*t bytes (data or parity region) is corrected."""
    rng = np.random.default_rng(11)
    for n, k, i in ((255, 223, 8), (40, 32, 3), (20, 12, 5)):
        c = rs(n, k, i)
        data = rand_bytes(rng, 5 * i * k + 17)
        enc = c.encode(data)
        burst = c.burst
        for start in (0, 7, len(data) - burst // 2, len(data), len(enc) - burst):
            start = max(0, min(start, len(enc) - burst))
            offs = list(range(start, start + burst))
            res = c.decode(flip(enc, offs, [0xFF] * burst))
            assert res.data == data and res.n_corrected == burst
        # one byte more than the burst length breaks some codeword
        offs = list(range(0, burst + 1))
        assert c.decode(flip(enc, offs, [0xA5] * (burst + 1))).data != data or i * c.t == 0


def test_interleave_layout() -> None:
    """Byte j of a group goes to codeword j mod I; parity byte p of codeword i is at p*I+i."""
    c = rs(20, 12, 3)
    ref = reedsolo.RSCodec(8, nsize=255)
    data = bytes(range(100))  # 2 full groups (72 bytes) + 28 bytes: 3 short codewords
    enc = c.encode(data)
    size = len(data)
    assert len(enc) == size + 6 * 8 + 3 * 8
    for g in range(2):
        grp = data[g * 36 : (g + 1) * 36]
        par = enc[size + g * 24 : size + (g + 1) * 24]
        for i in range(3):
            cw = grp[i::3]
            assert bytes(ref.encode(cw))[-8:] == par[i::3]
    tail = data[72:]
    par = enc[size + 48 :]
    for i in range(3):
        assert bytes(ref.encode(tail[i::3]))[-8:] == par[i::3]


def test_short_group_fewer_codewords_than_interleave() -> None:
    c = rs(20, 12, 8)
    for size in range(1, 20):
        data = bytes(range(size))
        enc = c.encode(data)
        assert len(enc) == size + min(8, size) * 8
        assert c.decode(enc).data == data
        bad = flip(enc, [0], [1])
        assert c.decode(bad).data == data


def test_too_many_erasures_is_uncorrectable() -> None:
    c = rs(20, 12)
    data = bytes(12)
    enc = c.encode(data)
    res = c.decode(enc, erasures=range(9))
    assert res.status == "uncorrectable"
    assert c.decode(enc, erasures=range(8)).data == data


def test_erasures_in_parity_region() -> None:
    rng = np.random.default_rng(3)
    c = rs(255, 223, 4)
    data = rand_bytes(rng, 2000)
    enc = c.encode(data)
    offs = list(range(len(data), len(data) + 100))
    bad = flip(enc, offs, [0x55] * 100)
    res = c.decode(bad, erasures=offs)
    assert res.data == data and res.n_corrected == 100


def test_forney_against_field_arithmetic() -> None:
    """A single error of every magnitude at several positions is found exactly."""
    f = gf256()
    assert f.mul(2, 128) == 0x1D and f.inv(1) == 1
    c = rs(255, 251)
    data = bytes(range(251))
    enc = c.encode(data)
    for pos in (0, 1, 100, 250, 251, 254):
        for mag in (1, 2, 0x80, 0xFF):
            res = c.decode(flip(enc, [pos], [mag]))
            assert res.data == data and res.n_corrected == 1
