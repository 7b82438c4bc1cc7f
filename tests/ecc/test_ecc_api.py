"""The codec interface: registry, specs, configs, buffer types, lengths, round trips."""

from __future__ import annotations

import json

import numpy as np
import pytest
from ecc_helpers import ALL_SPECS, rand_bytes
from hypothesis import given, settings
from hypothesis import strategies as st

from rkv.ecc import (
    BCHCodec,
    Codec,
    DecodeResult,
    RSCodec,
    ShardRSCodec,
    available_codecs,
    get_codec,
    parse_spec,
    register_codec,
)
from rkv.errors import ConfigError, CorruptRecordError, InputError, UncorrectableError


def test_registry_lists_all_codecs() -> None:
    assert set(available_codecs()) >= {"none", "xxh3", "crc32c", "rs", "bch", "shardrs"}


@pytest.mark.parametrize(
    ("spec", "cfg"),
    [
        ("none", {"id": "none"}),
        ("xxh3", {"id": "xxh3"}),
        ("crc32c", {"id": "crc32c"}),
        ("rs(255,223)", {"id": "rs", "n": 255, "k": 223, "interleave": 1}),
        ("rs(255,223,interleave=8)", {"id": "rs", "n": 255, "k": 223, "interleave": 8}),
        (" RS ( 255 , 239 ) ", {"id": "rs", "n": 255, "k": 239, "interleave": 1}),
        ("rs", {"id": "rs", "n": 255, "k": 223, "interleave": 1}),
        ("bch(m=13,t=40)", {"id": "bch", "m": 13, "t": 40, "chunk_bytes": 512}),
        ("bch(m=14,t=40)", {"id": "bch", "m": 14, "t": 40, "chunk_bytes": 1024}),
        ("bch(13,8,chunk_bytes=256)", {"id": "bch", "m": 13, "t": 8, "chunk_bytes": 256}),
        ("shardrs(k=16,m=2)", {"id": "shardrs", "k": 16, "m": 2, "checksum": "xxh3"}),
        ("shardrs(4,2,checksum=crc32c)", {"id": "shardrs", "k": 4, "m": 2, "checksum": "crc32c"}),
    ],
)
def test_spec_strings(spec: str, cfg: dict[str, object]) -> None:
    c = get_codec(spec)
    assert c.get_config() == cfg
    assert get_codec(cfg) == c
    assert get_codec(c) is c
    assert get_codec(c.spec) == c  # the spec string round-trips too


@pytest.mark.parametrize("spec", ALL_SPECS)
def test_config_round_trip(spec: str) -> None:
    c = get_codec(spec)
    cfg = c.get_config()
    assert cfg["id"] == c.codec_id
    again = get_codec(json.loads(json.dumps(cfg)))
    assert again.get_config() == cfg
    assert again == c and hash(again) == hash(c)
    assert type(again).from_config(cfg) == c
    assert c.spec in repr(c)


@pytest.mark.parametrize(
    "bad",
    [
        "nope",
        "rs(",
        "rs(255,223,7,9)",
        "rs(256,223)",
        "rs(255,255)",
        "rs(255,0)",
        "rs(n=255,k=223,interleave=0)",
        "rs(k=223,n=255,foo=1)",
        "rs(n=255,223)",
        "rs(n=255,n=255)",
        "rs(200)",
        "rs(255,abc)",
        "bch(m=4,t=2)",
        "bch(m=16,t=2)",
        "bch(m=13,t=0)",
        "bch(m=5,t=7)",
        "bch(m=13,t=40,chunk_bytes=1024)",
        "bch(m=13,t=40,chunk_bytes=0)",
        "shardrs(k=0,m=2)",
        "shardrs(k=254,m=2)",
        "shardrs(k=16,m=2,checksum=md5)",
        "none(x=1)",
        "crc32c(1)",
        "",
        "rs(,)",
    ],
)
def test_bad_specs(bad: str) -> None:
    with pytest.raises(ConfigError):
        get_codec(bad)


@pytest.mark.parametrize(
    "bad",
    [
        {"id": "rs", "n": 255, "k": 223.0},
        {"id": "rs", "n": True, "k": 1},
        {"id": "rs", "n": "255", "k": 223},
        {"id": "bch", "m": 13, "t": 4, "chunk_bytes": 1.5},
        {"id": "bch", "m": 13, "t": 4, "extra": 1},
        {"id": 7},
        {"n": 255},
        {"id": "unknown"},
    ],
)
def test_bad_configs(bad: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        get_codec(bad)


def test_get_codec_rejects_other_types() -> None:
    with pytest.raises(ConfigError):
        get_codec(42)  # type: ignore[arg-type]


def test_from_config_checks_id() -> None:
    with pytest.raises(ConfigError):
        RSCodec.from_config({"id": "bch", "m": 13, "t": 4})


def test_register_codec_conflict() -> None:
    class Fake(RSCodec):
        codec_id = "rs"

    with pytest.raises(ConfigError):
        register_codec(Fake)
    register_codec(RSCodec)  # re-registering the same class is fine


def test_parse_spec_quotes() -> None:
    assert parse_spec("shardrs(k=2,m=1,checksum='crc32c')")["checksum"] == "crc32c"


def test_maths_properties() -> None:
    rs = get_codec("rs(255,223,interleave=4)")
    assert isinstance(rs, RSCodec)
    assert (rs.n, rs.k, rs.t, rs.nsym, rs.symbol_bits, rs.burst) == (255, 223, 16, 32, 8, 64)
    assert rs.overhead == pytest.approx(255 / 223)
    assert rs.corrects
    bch = get_codec("bch(m=13,t=40)")
    assert isinstance(bch, BCHCodec)
    assert (bch.t, bch.symbol_bits, bch.ecc_bits, bch.ecc_bytes, bch.k) == (40, 1, 520, 65, 4096)
    assert bch.n == 4096 + 520 and bch.prim_poly == 0x201B
    sh = get_codec("shardrs(k=16,m=4)")
    assert isinstance(sh, ShardRSCodec)
    assert (sh.n, sh.k, sh.m, sh.t) == (20, 16, 4, 2)
    for spec in ("none", "xxh3", "crc32c"):
        c = get_codec(spec)
        assert c.t == 0 and not c.corrects and c.overhead == 1.0 and c.n is None


@pytest.mark.parametrize("spec", ALL_SPECS)
@pytest.mark.parametrize("size", [0, 1, 2, 7, 8, 9, 100, 223, 224, 1000, 4099])
def test_round_trip_sizes(spec: str, size: int) -> None:
    c = get_codec(spec)
    data = rand_bytes(np.random.default_rng(size), size)
    enc = c.encode(data)
    assert isinstance(enc, bytes)
    assert len(enc) == c.encoded_size(size)
    res = c.decode(enc)
    assert res == DecodeResult(data, "clean", 0, "")
    assert res.ok
    assert c.decode_or_raise(enc).data == data
    sd = c.systematic_data(enc)
    assert sd is not None and sd.tobytes() == data
    if not isinstance(c, ShardRSCodec):
        assert c.data_size(len(enc)) == size


@settings(max_examples=40)
@given(st.sampled_from(ALL_SPECS), st.binary(max_size=3000))
def test_round_trip_any(spec: str, data: bytes) -> None:
    c = get_codec(spec)
    enc = c.encode(data)
    assert len(enc) == c.encoded_size(len(data))
    assert c.decode(enc).data == data


@pytest.mark.parametrize("spec", ALL_SPECS)
def test_buffer_types(spec: str) -> None:
    c = get_codec(spec)
    data = rand_bytes(np.random.default_rng(1), 777)
    enc = c.encode(data)
    arr = np.frombuffer(data, dtype=np.uint8)
    assert c.encode(bytearray(data)) == enc
    assert c.encode(memoryview(data)) == enc
    assert c.encode(arr.copy()) == enc
    assert c.encode(arr[::1]) == enc
    as16 = np.frombuffer(data[:776], dtype=np.uint16)
    assert c.encode(as16) == c.encode(data[:776])
    strided = np.frombuffer(data, dtype=np.uint8)[::2]
    assert c.encode(strided) == c.encode(data[::2])
    for buf in (bytearray(enc), memoryview(enc), np.frombuffer(enc, dtype=np.uint8)):
        assert c.decode(buf).data == data
    with pytest.raises(InputError):
        c.encode(12345)  # type: ignore[arg-type]


def test_encoded_length_is_monotonic_and_invertible() -> None:
    for spec in ("rs(255,223)", "rs(30,20,interleave=5)", "rs(10,4,interleave=7)",
                 "bch(m=8,t=3)", "xxh3", "crc32c", "none"):
        c = get_codec(spec)
        prev = -1
        for n in range(0, 700):
            e = c.encoded_size(n)
            assert e > prev or (n == 0 and e >= 0)
            prev = e
            assert c.data_size(e) == n


@pytest.mark.parametrize(
    ("spec", "sizes"),
    [
        ("xxh3", [0, 7]),
        ("crc32c", [3]),
        ("rs(255,223)", [1, 32, 255 + 1, 255 + 32]),
        ("rs(10,4,interleave=3)", [1, 2, 6, 8]),
        ("bch(m=13,t=40)", [1, 65, 577 + 1]),
        ("shardrs(k=4,m=2)", [1, 6 * 8 + 1, 6 * 12, 6 * 15, 5]),
    ],
)
def test_impossible_lengths(spec: str, sizes: list[int]) -> None:
    c = get_codec(spec)
    for n in sizes:
        with pytest.raises(CorruptRecordError):
            c.decode(b"\0" * n)
        with pytest.raises(CorruptRecordError):
            c.systematic_data(b"\0" * n)


def test_decode_or_raise() -> None:
    c = get_codec("xxh3")
    enc = bytearray(c.encode(b"hello world"))
    enc[0] ^= 1
    res = c.decode(bytes(enc))
    assert res.status == "uncorrectable" and res.data == b"" and not res.ok
    with pytest.raises(UncorrectableError, match="xxh3"):
        c.decode_or_raise(bytes(enc))


@pytest.mark.parametrize("spec", ["rs(255,223)", "xxh3", "shardrs(k=4,m=2)"])
def test_bad_erasure_offsets(spec: str) -> None:
    c = get_codec(spec)
    enc = c.encode(b"x" * 100)
    with pytest.raises(InputError):
        c.decode(enc, erasures=[len(enc)])
    with pytest.raises(InputError):
        c.decode(enc, erasures=[-1])
    with pytest.raises(InputError):
        c.decode(enc, erasures=["a"])  # type: ignore[list-item]


def test_codec_is_a_codec() -> None:
    for spec in ALL_SPECS:
        assert isinstance(get_codec(spec), Codec)


@pytest.mark.parametrize("spec", ["rs(255,239)", "rs(255,223,interleave=8)", "rs(64,48)",
                                  "bch(m=13,t=8)", "bch(m=14,t=40)", "shardrs(k=16,m=2)",
                                  "shardrs(k=8,m=2,checksum=crc32c)", "xxh3", "crc32c",
                                  "none"])
@pytest.mark.parametrize("size", [1, 239, 4096, 196608, 196609])
def test_units_match_the_encoded_layout(spec: str, size: int) -> None:
    """What a codec tells the reliability model about its units agrees with what its encoder
    writes: parity bytes per unit times units is the encoding's overhead."""
    c = get_codec(spec)
    u = c.units(size)
    extra = c.encoded_size(size) - size
    if u.kind == "rs":
        assert extra == u.units * (u.unit_symbols - (c.k or 0))
        assert u.group == (c.k or 0) * u.interleave
    elif u.kind == "bch":
        assert extra == u.units * c.ecc_bytes            # type: ignore[attr-defined]
        assert u.unit_symbols == 8 * u.group + c.m * c.t  # type: ignore[attr-defined]
    elif u.kind == "shard":
        assert u.units == 1 and extra == (u.unit_symbols * (u.shard_bytes + u.check_bytes)
                                          - size)
    else:
        assert u.kind == "detect" and u.t == 0 and extra in (0, 4, 8)
        assert u.miss == (2.0 ** -(8 * extra) if extra else 1.0)
    assert 0.0 < u.miss <= 1.0 and u.units * u.group >= size
