"""The shared value checks (faultmodels.checks, rkv.checks): boundaries, types, error class."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import rkv.checks as rc
from faultmodels import FaultModelError
from faultmodels import checks as fc
from rkv.errors import ConfigError
from rkv.store.config import EngineConfig, TierConfig

finite = st.floats(allow_nan=False, allow_infinity=False)
bounds = st.one_of(st.none(), st.floats(-1e6, 1e6, allow_nan=False))


@given(finite | st.integers(-10**9, 10**9), bounds, bounds, st.booleans(), st.booleans())
def test_as_float_accepts_exactly_the_interval(x: float, lo: float | None, hi: float | None,
                                               lo_open: bool, hi_open: bool) -> None:
    inside = (lo is None or x > lo or (x == lo and not lo_open)) and (
        hi is None or x < hi or (x == hi and not hi_open))
    kw: dict[str, Any] = {"lo": lo, "hi": hi, "lo_open": lo_open, "hi_open": hi_open}
    if inside:
        assert fc.as_float(x, "x", **kw) == float(x)
        assert rc.as_float(x, "x", **kw) == float(x)
    else:
        with pytest.raises(FaultModelError, match=r"^x must be (in|[<>])"):
            fc.as_float(x, "x", **kw)
        with pytest.raises(ConfigError, match=r"^x must be (in|[<>])"):
            rc.as_float(x, "x", **kw)


@given(finite, st.booleans(), st.booleans())
def test_a_bound_itself_is_in_only_when_closed(x: float, at_lo: bool, is_open: bool) -> None:
    kw: dict[str, Any] = ({"lo": x, "lo_open": is_open} if at_lo
                          else {"hi": x, "hi_open": is_open})
    if is_open:
        with pytest.raises(ConfigError, match=r"must be [<>] "):
            rc.as_float(x, "x", **kw)
    else:
        assert rc.as_float(x, "x", **kw) == x
    # Just outside the bound is out, open or not.
    out = math.nextafter(x, -math.inf if at_lo else math.inf)
    if math.isfinite(out):
        with pytest.raises(FaultModelError):
            fc.as_float(out, "x", **kw)


@given(st.integers(-10**6, 10**6), st.none() | st.integers(-1000, 1000),
       st.none() | st.integers(-1000, 1000))
def test_as_int_accepts_exactly_the_range(n: int, lo: int | None, hi: int | None) -> None:
    inside = (lo is None or n >= lo) and (hi is None or n <= hi)
    if inside:
        assert rc.as_int(n, "n", lo=lo, hi=hi) == n == fc.as_int(n, "n", lo=lo, hi=hi)
    else:
        with pytest.raises(ConfigError, match=rf"^n must be .*, got {n}$"):
            rc.as_int(n, "n", lo=lo, hi=hi)


@given(st.booleans())
def test_bools_are_not_numbers(b: bool) -> None:
    for check in (rc.as_float, rc.as_int, rc.as_probability):
        with pytest.raises(ConfigError, match="must be"):
            check(b, "v")
    for fcheck in (fc.as_float, fc.as_int, fc.as_probability):
        with pytest.raises(FaultModelError, match="must be"):
            fcheck(b, "v")
    with pytest.raises(ConfigError):
        rc.one_of(b, (0, 1), "v")           # True == 1, but a bool is not a choice of ints
    assert rc.as_bool(b, "v") is b


@pytest.mark.parametrize("bad", [1, 0, "yes", "true", None, 1.0])
def test_as_bool_takes_bools_only(bad: object) -> None:
    with pytest.raises(ConfigError, match=r"^v must be true or false, got "):
        rc.as_bool(bad, "v")


@given(st.sampled_from([math.nan, math.inf, -math.inf]))
def test_nan_never_and_inf_only_when_asked(x: float) -> None:
    with pytest.raises(ConfigError, match="finite number"):
        rc.as_float(x, "x")
    if math.isnan(x):
        with pytest.raises(ConfigError):
            rc.as_float(x, "x", finite=False)
        with pytest.raises(ConfigError, match="probability"):
            rc.as_probability(x, "p")
    else:
        assert rc.as_float(x, "x", finite=False) == x
        if x > 0:
            assert rc.as_float(x, "x", lo=0, lo_open=True, finite=False) == x
        else:
            with pytest.raises(ConfigError, match=r"^x must be > 0, got -inf$"):
                rc.as_float(x, "x", lo=0, lo_open=True, finite=False)


@given(st.floats(allow_nan=False))
def test_probability_is_the_closed_unit_interval(p: float) -> None:
    if 0.0 <= p <= 1.0:
        assert rc.as_probability(p, "p") == p
    else:
        with pytest.raises(ConfigError, match=r"^p must be a probability in \[0, 1\], got "):
            rc.as_probability(p, "p")


def test_plain_accepts_only_what_toml_holds() -> None:
    # rkv configs are written back to TOML: NumPy scalars, Fractions and whole floats as
    # integers are refused there; the fault models (plain=False) take them.
    for v in (np.int64(3), Fraction(1, 2), np.float32(0.5)):
        with pytest.raises(ConfigError, match="must be a number"):
            rc.as_float(v, "x")
        assert fc.as_float(v, "x") == float(v)
    assert rc.as_float(np.float64(0.5), "x") == 0.5        # a float subclass
    with pytest.raises(ConfigError, match=r"must be an integer, got 3\.0"):
        rc.as_int(3.0, "n")
    with pytest.raises(ConfigError, match="must be an integer"):
        rc.as_int(np.int64(3), "n")
    assert fc.as_int(3.0, "n") == 3 and fc.as_int(np.int64(3), "n") == 3
    assert rc.as_int(np.int64(3), "n", plain=False) == 3
    with pytest.raises(FaultModelError, match="must be an integer"):
        fc.as_int(3.5, "n")
    with pytest.raises(ConfigError, match="must be a table, got mappingproxy"):
        from types import MappingProxyType
        rc.as_table(MappingProxyType({}), "t")


def test_messages_name_the_value_and_what_is_allowed() -> None:
    with pytest.raises(ConfigError, match=r"^mode must be 'a' or 'b', got 'c'$"):
        rc.one_of("c", ("a", "b"), "mode")
    with pytest.raises(ConfigError, match=r"^k must be one of 'a', 'b' or 'c', got 1$"):
        rc.one_of(1, ("a", "b", "c"), "k")
    assert rc.one_of(8, (16, 8, 4), "bits") == 8
    with pytest.raises(ConfigError, match=r"^t: unknown key\(s\) x, y; allowed: a, b$"):
        rc.check_keys({"y": 1, "x": 2, "a": 3}, ("b", "a"), "t")
    with pytest.raises(FaultModelError, match=r"^m: unknown parameter\(s\) z; allowed: a$"):
        fc.check_keys({"z": 1}, ("a",), "m")
    with pytest.raises(ConfigError, match="expected a table of keys, got list"):
        rc.check_keys([], (), "t")
    with pytest.raises(ConfigError, match=r"^s must be a codec spec, got '  '$"):
        rc.as_str("  ", "s", nonempty=True, what="a codec spec")
    assert rc.as_str("", "s") == ""
    with pytest.raises(ConfigError, match=r"^x must be in \[0\.001, 3600\], got 0$"):
        rc.as_float(0, "x", lo=1e-3, hi=3600)


@given(st.sampled_from([ValueError, KeyError, TypeError]), st.floats(-10, -1))
def test_the_error_class_is_the_callers(err: type[Exception], x: float) -> None:
    with pytest.raises(err):
        fc.as_float(x, "x", lo=0, error=err)
    with pytest.raises(err):
        fc.as_int("3", "n", error=err)
    with pytest.raises(err):
        fc.check_keys({"q": 1}, (), "w", error=err)


def test_configs_keep_their_rules() -> None:
    """Spot checks through the configs themselves: bools, NaN and whole floats."""
    with pytest.raises(ConfigError, match=r"^tier t: read_gbps must be a finite number"):
        TierConfig("t", read_gbps=math.nan)
    assert TierConfig("t", read_gbps=math.inf).read_gbps == math.inf
    with pytest.raises(ConfigError, match=r"capacity_bytes must be an integer, got 1024\.0"):
        TierConfig("t", capacity_bytes=1024.0)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="chunk_tokens must be in"):
        EngineConfig(chunk_tokens=(1 << 20) + 1)
    with pytest.raises(ConfigError, match="repair must be true or false, got 1"):
        EngineConfig(repair=1)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="engine config: unknown key"):
        EngineConfig.from_dict({"chunk_tokenz": 4})
