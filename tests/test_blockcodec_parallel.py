"""Blocks encoded and verified on the codec pool are the serial path's, byte for byte and
status for status, damaged or not."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rkv import parallel
from rkv.codec.blockcodec import (
    BlockToEncode,
    BlockToRead,
    RecordArena,
    _encode_data,
    compute_bound,
    encode_block,
    encode_blocks,
    read_block,
    read_blocks,
)
from rkv.codec.pipeline import Pipeline
from rkv.codec.stages import codec_for, quantizer_for
from rkv.errors import IntegrityError
from rkv.format.record import RecordHeader, decode_record

CODES = ["none", "rs(255,239)", "rs(255,223,interleave=8)", "bch(m=13,t=8)",
         "shardrs(k=16,m=2)", "xxh3", "planes(high=rs(255,223),low=none)"]
SHAPE = (2, 64, 2, 32)


pytestmark = pytest.mark.usefixtures("codec_pool4")   # tests/conftest.py


def _header(i: int) -> RecordHeader:
    return RecordHeader(key=i.to_bytes(32, "little"), layer=i % 7, fingerprint=bytes(16),
                        shape=SHAPE, dtype="float16", data_len=0, payload_len=0,
                        written_ns=1_700_000_000 + i)


def _blocks(n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return list(rng.standard_normal((n, *SHAPE), dtype=np.float32).astype(np.float16))


@pytest.mark.parametrize("code", CODES)
@pytest.mark.parametrize("quant", ["none", "kivi(bits=4)"])
def test_encode_blocks_is_encode_block(code: str, quant: str) -> None:
    if quant != "none" and code.startswith("planes"):
        pytest.skip("byte planes do not follow a quantizer")
    codec, q = codec_for(code), quantizer_for(quant)
    data = _blocks(24, 1)
    jobs = [BlockToEncode(_header(i), d, Pipeline(q, codec)) for i, d in enumerate(data)]
    many = [bytes(r) for r in encode_blocks(jobs, threads=True)]
    parallel.configure(1)
    one = [bytes(encode_block(j.header, j.data, j.pipe.codec, quant=j.pipe.quant)) for j in jobs]
    assert many == one
    # ... and the record format did not change: the whole payload built first, then framed.
    for j, rec in zip(jobs, one, strict=True):
        if q is None:
            raw = np.ascontiguousarray(j.data).view(np.uint8).reshape(-1)
        else:
            raw = np.frombuffer(q.encode(np.ascontiguousarray(j.data)), dtype=np.uint8)
        if codec is not None or q is not None:
            assert bytes(_encode_data(j.header, raw, q, codec)) == rec


def test_arena_records_are_the_same_and_reuse_memory() -> None:
    codec = codec_for("rs(255,239)")
    data = _blocks(20, 4)
    jobs = [BlockToEncode(_header(i), d, Pipeline(None, codec)) for i, d in enumerate(data)]
    want = [bytes(encode_block(j.header, j.data, j.pipe.codec)) for j in jobs]
    arena = RecordArena()
    first = encode_blocks(jobs, arena)          # spills: the arena starts empty
    assert [bytes(r) for r in first] == want
    second = encode_blocks(jobs[:12], arena)    # fits the buffer sized by the first batch
    assert [bytes(r) for r in second] == want[:12]
    base = arena._buf.ctypes.data
    assert all(base <= r.ctypes.data < base + arena._buf.size for r in second)
    third = encode_blocks(jobs, arena)
    assert [bytes(r) for r in third] == want
    assert arena._buf.ctypes.data == base       # no new memory


def test_encode_into_a_reused_buffer() -> None:
    codec = codec_for("rs(255,239)")
    scratch = np.empty(1 << 20, dtype=np.uint8)
    d = _blocks(1, 2)[0]
    rec = encode_block(_header(0), d, codec, lambda n: scratch[:n])
    assert rec.base is scratch or rec.ctypes.data == scratch.ctypes.data
    assert bytes(rec) == bytes(encode_block(_header(0), d, codec))


def _outcome(fn: Any) -> tuple[Any, ...]:
    try:
        v = fn()
    except IntegrityError as exc:
        return (type(exc), str(exc))
    return ("ok", bytes(v.data), v.corrected, v.degraded)


@settings(max_examples=12, deadline=None)
@given(st.sampled_from(CODES), st.integers(0, 2**32 - 1),
       st.sampled_from([0.0, 1e-4, 1e-3, 2e-2]))
def test_read_blocks_is_read_block(code: str, seed: int, ber: float) -> None:
    """Damaged payloads and headers: the same outcome per block (data, corrected count,
    degraded values, or the same typed error) and the same values in the destination."""
    rng = np.random.default_rng(seed)
    codec = codec_for(code)
    data = _blocks(16, seed % 1000)
    recs = [np.array(encode_block(_header(i), d, codec), dtype=np.uint8)
            for i, d in enumerate(data)]
    for r in recs:
        hit = np.flatnonzero(rng.random(r.size) < ber)
        r[hit] ^= rng.integers(1, 256, hit.size, dtype=np.uint8)
    decs = []
    for i, r in enumerate(recs):
        try:
            decs.append(decode_record(r, expect_key=_header(i).key))
        except IntegrityError:
            continue
    serial = np.zeros((len(decs), *SHAPE), dtype=np.float16)
    threaded = np.zeros_like(serial)
    parallel.configure(1)
    want = [_outcome(lambda i=i, d=d: read_block(d, serial[i])) for i, d in enumerate(decs)]
    parallel.configure(4)
    got = read_blocks([BlockToRead(d, threaded[i]) for i, d in enumerate(decs)], threads=True)
    assert len(got) == len(want)
    for w, g in zip(want, got, strict=True):
        if isinstance(g, IntegrityError):
            assert w == (type(g), str(g))
        else:
            assert w == ("ok", bytes(g.data), g.corrected, g.degraded)
    assert np.array_equal(serial.view(np.uint16), threaded.view(np.uint16))
    if ber == 0.0:
        assert all(w[0] == "ok" and w[2] == 0 for w in want)


def test_read_blocks_raises_a_bug() -> None:
    """Anything but damage (here a destination of the wrong size) is raised, not captured."""
    codec = codec_for("rs(255,239)")
    decs = [decode_record(encode_block(_header(i), d, codec))
            for i, d in enumerate(_blocks(8, 3))]
    wrong = np.zeros((8, 3), dtype=np.float16)
    with pytest.raises(ValueError):
        read_blocks([BlockToRead(d, wrong[i]) for i, d in enumerate(decs)])


def test_threads_only_for_compute_bound_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Table-driven codes and quantizers go to the pool; raw, checksummed and shardrs
    blocks (memory speed) stay on the calling thread unless forced, and so do reads of
    clean blocks: only decoding goes to the pool."""
    assert compute_bound(codec_for("rs(255,239)")) and compute_bound(codec_for("bch(m=13,t=8)"))
    assert compute_bound(codec_for("planes(high=rs(255,223),low=none)"))
    assert compute_bound(None, quantizer_for("kivi(bits=4)"))
    assert not compute_bound(None) and not compute_bound(codec_for("xxh3"))
    assert not compute_bound(codec_for("shardrs(k=16,m=2)"))
    used: list[bool] = []
    real = parallel.pmap

    def spy(*args: Any, **kw: Any) -> Any:
        used.append(not kw.get("inline", False))
        return real(*args, **kw)

    def spy_strict(*args: Any, **kw: Any) -> Any:
        used.append(True)
        return real(*args, **kw)

    monkeypatch.setattr("rkv.codec.blockcodec.pmap_strict", spy_strict)
    monkeypatch.setattr("rkv.codec.blockcodec.pmap", spy)
    data = _blocks(4, 5)
    for code, want in (("none", False), ("shardrs(k=16,m=2)", False), ("rs(255,239)", True)):
        used.clear()
        pipe = Pipeline(None, codec_for(code))
        jobs = [BlockToEncode(_header(i), d, pipe) for i, d in enumerate(data)]
        recs = encode_blocks(jobs)
        assert used == ([True] if want else [])
        used.clear()
        read_blocks([BlockToRead(decode_record(r), None) for r in recs])
        assert used == [False]          # clean: a hash and a copy each, no pool
        for r in recs:                  # a damaged byte in every block's data
            dec = decode_record(r)
            r[dec.header_bytes + 5] ^= 0xFF
        used.clear()
        read_blocks([BlockToRead(decode_record(r), None) for r in recs])
        assert used == [want]
