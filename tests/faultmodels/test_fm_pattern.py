"""ErrorPattern semantics and the exact samplers in faultmodels._dist."""

from __future__ import annotations

import math

import numpy as np
import pytest
from fm_helpers import chi2_ok
from hypothesis import given, settings
from hypothesis import strategies as st

import faultmodels as fm
from faultmodels import ErrorPattern, FaultModelError
from faultmodels import _dist as D

# -- ErrorPattern ----------------------------------------------------------------------------


@st.composite
def buffers_and_flips(draw: st.DrawFn) -> tuple[int, list[int], int]:
    n = draw(st.integers(1, 96))
    flips = draw(st.lists(st.integers(0, 8 * n - 1), max_size=64, unique=True))
    seed = draw(st.integers(0, 2**32 - 1))
    return n, flips, seed


@settings(max_examples=150, deadline=None)
@given(buffers_and_flips())
def test_apply_flips_exactly_the_listed_bits(case: tuple[int, list[int], int]) -> None:
    n, flips, seed = case
    rng = np.random.default_rng(seed)
    buf = rng.integers(0, 256, size=n, dtype=np.uint8)
    before = buf.copy()
    pat = ErrorPattern(n, np.array(flips, dtype=np.int64))
    pat.apply(buf, rng)
    diff = np.unpackbits(before ^ buf, bitorder="little")
    assert np.array_equal(np.flatnonzero(diff), np.sort(np.array(flips, dtype=np.int64)))
    assert pat.n_flips == len(flips)
    assert np.array_equal(pat.corrupted_bytes(), np.unique(np.array(flips, dtype=np.int64) >> 3))


def test_apply_fills_erasures_and_keeps_the_rest() -> None:
    rng = np.random.default_rng(1)
    n = 4096
    buf = np.zeros(n, dtype=np.uint8)
    pat = ErrorPattern(n, np.array([3, 30001]), ((1024, 512, "sector"), (4032, 64, "poison")))
    pat.apply(buf, rng)
    assert buf[0] == 8 and buf[30001 // 8] == 2
    outside = np.ones(n, dtype=bool)
    outside[1024:1536] = outside[4032:] = False
    outside[[0, 30001 // 8]] = False
    assert not buf[outside].any()
    assert buf[1024:1536].any() and buf[4032:].any()  # random garbage, 1 - 2^-4096 sure
    assert pat.n_erased_bytes == 576
    assert pat.corrupted_bytes().size == 576 + 2


def test_pattern_normalizes_and_validates() -> None:
    p = ErrorPattern(8, np.array([5, 1, 5, 63]), ((0, 2, "sector"), (2, 2, "sector"),
                                                  (1, 1, "poison")))
    assert p.flips.tolist() == [1, 5, 63]
    assert p.erasures == ((0, 4, "sector"), (1, 1, "poison"))
    assert not p.flips.flags.writeable
    assert p == ErrorPattern.from_dict(p.to_dict())
    assert ErrorPattern(8).is_empty and not p.is_empty
    with pytest.raises(FaultModelError):
        ErrorPattern(8, np.array([64]))
    with pytest.raises(FaultModelError):
        ErrorPattern(8, np.array([-1]))
    with pytest.raises(FaultModelError):
        ErrorPattern(8, erasures=((4, 5, "sector"),))
    with pytest.raises(FaultModelError):
        ErrorPattern(8, erasures=((0, 1, "garbage"),))
    with pytest.raises(FaultModelError):
        ErrorPattern(8, np.array([0.5]))
    with pytest.raises(FaultModelError):
        ErrorPattern(-1)
    with pytest.raises(FaultModelError):
        p.apply(np.zeros(7, dtype=np.uint8), np.random.default_rng(0))
    with pytest.raises(FaultModelError):
        p.apply(np.zeros(8, dtype=np.int16), np.random.default_rng(0))  # type: ignore[arg-type]


def test_merge_is_a_union_and_transient_only_if_all_parts_are() -> None:
    a = ErrorPattern(16, np.array([1, 2]), transient=True)
    b = ErrorPattern(16, np.array([2, 100]), ((8, 8, "poison"),))
    m = a.merge(b)
    assert m.flips.tolist() == [1, 2, 100] and m.erasures == ((8, 8, "poison"),)
    assert not m.transient
    assert a.merge(ErrorPattern(16)).transient  # an empty part is neutral
    assert a.merge(ErrorPattern(16, np.array([7]), transient=True)).transient
    assert b.merge(ErrorPattern(16, lost=True)).lost
    with pytest.raises(FaultModelError):
        a.merge(ErrorPattern(8, np.array([1])))


def test_expected_wrong_bits() -> None:
    p = ErrorPattern(64, np.array([0, 9, 300]), ((0, 8, "sector"),))
    assert p.expected_wrong_bits() == 1 + 4 * 8  # flips 0 and 9 fall inside the erasure
    assert ErrorPattern(64, lost=True).expected_wrong_bits() == 4 * 64


# -- exact samplers --------------------------------------------------------------------------


@pytest.mark.parametrize("mu", [1e-3, 0.7, 4.0])
def test_zt_poisson_matches_pmf(mu: float) -> None:
    rng = np.random.default_rng(7)
    x = np.array([D.zt_poisson(mu, rng) for _ in range(4000)])
    assert x.min() >= 1
    k = np.arange(1, 40)
    pmf = np.exp(k * math.log(mu) - mu - np.array([math.lgamma(i + 1) for i in k]))
    pmf /= -math.expm1(-mu)
    counts = np.bincount(x, minlength=41)[1:40]
    assert chi2_ok(counts, pmf)


@pytest.mark.parametrize(("n", "p"), [(1000, 1e-5), (50, 0.01), (40, 0.2), (1, 0.3)])
def test_zt_binomial_matches_pmf(n: int, p: float) -> None:
    rng = np.random.default_rng(11)
    x = np.array([D.zt_binomial(n, p, rng) for _ in range(4000)])
    assert x.min() >= 1 and x.max() <= n
    k = np.arange(1, n + 1)
    pmf = np.array([math.comb(n, int(i)) * p**i * (1 - p) ** (n - i) for i in k])
    pmf /= 1 - (1 - p) ** n
    counts = np.bincount(x, minlength=n + 1)[1:]
    assert chi2_ok(counts, pmf)


def test_first_nonzero_index_is_truncated_geometric() -> None:
    rng = np.random.default_rng(3)
    units, z = 20, 0.9
    x = np.array([D.first_nonzero_index(units, math.log(z), rng) for _ in range(5000)])
    pmf = z ** np.arange(units) * (1 - z)
    pmf /= pmf.sum()
    assert chi2_ok(np.bincount(x, minlength=units), pmf)


def test_distinct_and_runs() -> None:
    rng = np.random.default_rng(0)
    d = D.distinct(1 << 40, 1000, rng)
    assert d.size == 1000 and np.all(np.diff(d) > 0)
    assert D.distinct(5, 5, rng).tolist() == [0, 1, 2, 3, 4]
    s, e = D.runs(np.array([1, 2, 3, 7, 9, 10], dtype=np.int64))
    assert s.tolist() == [1, 7, 9] and e.tolist() == [4, 8, 11]


def test_tails_match_direct_sums() -> None:
    n, p, t = 60, 0.05, 6
    direct = sum(math.comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(t + 1, n + 1))
    assert D.binom_tail(n, p, t) == pytest.approx(direct, rel=1e-10)
    a, b = D.beta_params(p, 0.05)

    def bb(k: int) -> float:
        return math.exp(math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
                        + math.lgamma(k + a) + math.lgamma(n - k + b) - math.lgamma(n + a + b)
                        - (math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)))

    assert D.bb_tail(n, a, b, t) == pytest.approx(sum(bb(k) for k in range(t + 1, n + 1)),
                                                  rel=1e-9)
    assert math.exp(D.bb_log_p0(n, a, b)) == pytest.approx(bb(0), rel=1e-10)
    assert D.bb_tail(n, a, b, t) > D.binom_tail(n, p, t)  # overdispersion fattens the tail
    # tiny tails stay accurate (no 1 - cdf cancellation)
    lam = 8752 * 1e-5  # leading term of the tail: P(X = 41)
    lead = math.exp(41 * math.log(lam) - lam - math.lgamma(42))
    assert D.binom_tail(8752, 1e-5, 40) == pytest.approx(lead, rel=0.01)


def test_zt_betabinomial_sampler() -> None:
    m, a, b = 30, *D.beta_params(0.02, 0.1)
    cdf = D.bb_zt_cdf(m, a, b)
    x = D.sample_from_cdf(cdf, 5000, np.random.default_rng(5))

    def logpmf(k: int) -> float:
        return (math.lgamma(m + 1) - math.lgamma(k + 1) - math.lgamma(m - k + 1)
                + math.lgamma(k + a) + math.lgamma(m - k + b) - math.lgamma(m + a + b))

    pmf = np.exp([logpmf(k) for k in range(1, m + 1)])
    pmf /= pmf.sum()
    assert chi2_ok(np.bincount(x, minlength=m + 1)[1:], pmf)


def test_rng_must_be_a_generator() -> None:
    with pytest.raises(TypeError):
        fm.get_model("raw-ber").sample(8, 1.0, 42)  # type: ignore[arg-type]
