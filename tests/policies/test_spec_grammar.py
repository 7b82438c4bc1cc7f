"""The one spec grammar (policies.spec) and the registries that read it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.spec import MAX_SPEC, Call, SpecError, parse_call, split_top, value
from rkv.ecc import parse_spec as codec_spec
from rkv.errors import ConfigError
from rkv.quant import parse_spec as quant_spec

names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True)
scalars = st.one_of(st.integers(-10**9, 10**9), st.booleans(),
                    st.floats(allow_nan=False, allow_infinity=False, width=32),
                    st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True)
                    .filter(lambda s: s not in ("true", "false")))


def written(v: object) -> str:
    return str(v).lower() if isinstance(v, bool) else repr(v) if isinstance(v, float) else str(v)


@given(names, st.lists(scalars, max_size=3),
       st.dictionaries(names.map(str.lower), scalars, max_size=3))
def test_a_written_call_parses_back(name: str, args: list[object],
                                    kwargs: dict[str, object]) -> None:
    parts = [written(a) for a in args] + [f"{k}={written(v)}" for k, v in kwargs.items()]
    spec = f"{name}({', '.join(parts)})" if parts else name
    call = parse_call(spec)
    assert call == Call(name.lower(), tuple(args), kwargs)


def test_values() -> None:
    assert [value(t) for t in (" 12 ", "-3", "0.1", "1e-9", "TRUE", "false", "'crc32c'",
                               '"x"', "none", "rs(255,223)")] == \
        [12, -3, 0.1, 1e-9, True, False, "crc32c", "x", "none", "rs(255,223)"]


def test_nested_specs_stay_whole() -> None:
    assert split_top("high=rs(255,223),low=none") == ["high=rs(255,223)", "low=none"]
    call = parse_call("planes(high=rs(255,223,interleave=8), low=none)")
    assert call == Call("planes", (), {"high": "rs(255,223,interleave=8)", "low": "none"})
    assert parse_call("wrap(rs(k=2), 3)") == Call("wrap", ("rs(k=2)", 3), {})


@pytest.mark.parametrize("bad, needle", [
    ("rs(255", "malformed"), ("rs(255))", "unbalanced"), ("rs(,1)", "empty argument"),
    ("rs(k=1, 2)", "positional argument after keyword"), ("rs(k=1,k=2)", "given twice"),
    ("rs(1k=2)", "bad parameter name"), ("9rs", "malformed"), ("", "malformed"),
    ("x" * (MAX_SPEC + 1), "longer than"),
])
def test_bad_specs_are_one_line_errors(bad: str, needle: str) -> None:
    with pytest.raises(SpecError, match=needle) as info:
        parse_call(bad)
    assert "\n" not in str(info.value)


def test_a_non_string_is_refused() -> None:
    with pytest.raises(SpecError, match="must be a string"):
        parse_call(12)


def test_codecs_and_quantizers_read_the_same_grammar() -> None:
    assert codec_spec("RS(255, 239, interleave=16)") == \
        {"id": "rs", "n": 255, "k": 239, "interleave": 16}
    assert quant_spec("kivi(4, group=32)") == {"id": "kivi", "bits": 4, "group": 32}
    with pytest.raises(ConfigError, match="too many positional arguments"):
        codec_spec("rs(255, 239, 8, 9)")
    with pytest.raises(ConfigError, match="given twice"):
        codec_spec("rs(255, n=255)")
    with pytest.raises(ConfigError, match=r"expected e\.g\."):
        codec_spec("rs(255")


def test_policies_read_the_same_grammar() -> None:
    from policies import PolicyError, make_policy, parse_spec

    assert parse_spec("S3FIFO(small=0.1)") == ("s3fifo", {"small": 0.1})
    assert parse_spec("prefix") == ("prefix", {})
    assert make_policy("s3fifo(small=0.25)", 1000).name.startswith("s3fifo")
    with pytest.raises(PolicyError, match="key=value pairs"):
        parse_spec("lru(3)")
    with pytest.raises(PolicyError, match="malformed policy spec"):
        parse_spec("lru(")
