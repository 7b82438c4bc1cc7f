"""Importance sampling: the tilted samplers are unbiased against closed forms, tilted campaigns
agree with direct ones where both are feasible, and reach P(DUE) of 1e-12 and below with a
stated relative error that the analytic model falls within."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pytest

import faultmodels
from faultmodels._dist import binom_tail
from faultmodels.base import ErrorPattern, EventRate, poisson_class
from rkv import ConfigError
from rkv.eval.faults.campaign import CampaignConfig, replay_trial, run_campaign
from rkv.eval.faults.importance import Sampler, TiltPlan, estimate
from rkv.eval.faults.importance_plan import auto_plan
from rkv.eval.faults.importance_shard import ShardPlant
from rkv.reliability.fatality import layout_for

SMALL: dict[str, Any] = {"chunk_tokens": 64, "kv_heads": 1, "head_dim": 64}


def raw_ber(ber: float) -> dict[str, object]:
    return {"model": "raw-ber", "ber": ber}


def within(est: float, se: float, exact: float, z: float = 4.0) -> bool:
    return se > 0 and abs(est - exact) <= z * se


def test_poisson_tilt_is_unbiased() -> None:
    """P(K >= 3) for K ~ Poisson(0.01) (1.6e-7), from counts drawn at Poisson(2.0)."""
    mu, n = 0.01, 4000

    def realize(k: int, rng: np.random.Generator) -> ErrorPattern:
        return ErrorPattern(64, np.arange(k, dtype=np.int64))

    cls = poisson_class(EventRate("word", mu, 1, 1.0), realize)
    rng = np.random.default_rng(1)
    hit, lw = np.zeros(n, bool), np.zeros(n)
    for i in range(n):
        pat, lw[i] = cls.draw_tilted(rng, 200.0)
        hit[i] = pat is not None and pat.n_flips >= 3
    exact = 1 - math.exp(-mu) * (1 + mu + mu * mu / 2)
    e = estimate(hit, lw)
    assert within(e.mean, e.stderr, exact), (e, exact)
    assert e.rel_err < 0.05


def test_binomial_tilt_is_unbiased() -> None:
    """FaultModel.sample_tilted on raw BER: P(at least 4 flips in 1 KiB) at BER 1e-6 (7e-11),
    against the exact binomial tail."""
    m = faultmodels.get_model(raw_ber(1e-6))
    rng = np.random.default_rng(2)
    n = 3000
    hit, lw = np.zeros(n, bool), np.zeros(n)
    for i in range(n):
        pat, lw[i] = m.sample_tilted(1024, 1.0, rng, {"bit": 500.0})
        hit[i] = pat.n_flips >= 4
    exact = binom_tail(8192, 1e-6, 3)
    e = estimate(hit, lw)
    assert within(e.mean, e.stderr, exact), (e, exact)
    # the plain estimator over the same number of draws would see nothing
    assert e.hits > 100 and e.rel_err < 0.1


def test_mixture_weights_are_unbiased() -> None:
    """The campaign's defensive mixture (conditional + window tilt + header planting): P(some
    of 60 disjoint 239-byte windows holds more than 8 flips) at BER 2e-6 has the closed form
    1 - (1 - P(Bin(1912, p) > 8))^60 (about 1e-27)."""
    m = faultmodels.get_model(raw_ber(2e-6))
    nbytes, span, wins = 16384, 239, 60
    windows = tuple((64 + j * span, span) for j in range(wins))
    plan = TiltPlan(0.25, (1.0,), 0, 9 / (8 * span), windows, (16, 171, nbytes - 163), 155,
                    0.375)
    s = Sampler(m, nbytes, 1.0, plan)
    rng = np.random.default_rng(3)
    n = 2000
    hit, lw = np.zeros(n, bool), np.zeros(n)
    starts = np.array([8 * a for a, _ in windows])
    for i in range(n):
        pat, lw[i] = s.draw(rng)
        f = pat.flips[(pat.flips >= starts[0]) & (pat.flips < starts[-1] + 8 * span)]
        hit[i] = f.size > 8 and np.bincount((f - starts[0]) // (8 * span)).max() > 8
    per = binom_tail(8 * span, 2e-6, 8)
    exact = -math.expm1(wins * math.log1p(-per))
    e = estimate(hit, lw)
    assert within(e.mean, e.stderr, exact), (e, exact)
    assert e.rel_err < 0.15
    # and the conditional share still estimates P(any flip) (bounded weights)
    anyf = estimate(np.ones(n, bool), lw)
    assert within(anyf.mean, anyf.stderr, m.p_any_error(nbytes, 1.0))


def _count_by_enumeration(sp: ShardPlant, flips: np.ndarray) -> int:
    """N(x) the slow way: every (column, A, B) choice and its bits inside ``flips``."""
    f = set(flips.tolist())

    def bits(sh: int, col: int | None) -> int:
        if col is not None:
            return sum(8 * (sp.off + sh * sp.s + col) + b in f for b in range(8))
        own = [8 * (sp.off + sh * sp.s) + u for u in range(8 * sp.s)]
        own += [8 * (sp.off + sp.n * sp.s + sh * sp.ch) + u for u in range(8 * sp.ch)]
        return sum(b in f for b in own)

    total = 0
    for c in range(sp.s):
        for a in itertools.combinations(range(sp.n), sp.a):
            na = math.prod(bits(sh, c) for sh in a)
            rest = [sh for sh in range(sp.n) if sh not in a]
            for b in itertools.combinations(rest, sp.r):
                total += na * math.prod(bits(sh, None) for sh in b)
    return total


@pytest.mark.parametrize("m", [1, 2, 3, 4])
def test_shard_planting_count_is_exact(m: int) -> None:
    """The planting's N(x) (a generating-function count per column) against enumerating
    every (column, shard set, extra shard set, bits) choice, on random and planted patterns."""
    n, s, ch, off = m + 3, 5, 2, 3
    nbytes = off + n * (s + ch) + 4
    sp = ShardPlant((off, n, m, s, ch), 0.01, nbytes)
    rng = np.random.default_rng(m)
    for i in range(25):
        flips = np.unique(rng.integers(0, 8 * nbytes, size=int(rng.integers(0, 30))))
        if i % 3 == 0:
            flips = np.union1d(flips, sp.plant(rng))
        assert sp.count(flips) == _count_by_enumeration(sp, flips)
        if i % 3 == 0:
            assert sp.count(flips) >= 1


@pytest.mark.parametrize("ber", [1e-7, 1e-5])
def test_shard_mixture_is_unbiased(ber: float) -> None:
    """The mixture with the shard planting on 10 shards of 2056 bytes (m = 2): P(some column
    has wrong bytes in two shards or more and three shards or more are damaged, counting the
    8-byte checksum entries) = P(some column >= 2) - C(n, 2) P(nothing outside a pair)
    P(some column wrong in both of the pair), exactly (8e-10 at 1e-7, 4e-4 at 1e-5)."""
    off, n, m, s, ch = 384, 10, 2, 2056, 8
    nbytes = off + n * (s + ch) + 200
    plan = TiltPlan(0.25, (1.0,), 0, plant=(16, 116, nbytes - 108), plant_len=100,
                    plant_share=0.25, shard=(off, n, m, s, ch), shard_share=0.5)
    sampler = Sampler(faultmodels.get_model(raw_ber(ber)), nbytes, 1.0, plan)
    rng = np.random.default_rng(4)
    draws = 2000
    hit, lw = np.zeros(draws, bool), np.zeros(draws)
    for i in range(draws):
        pat, lw[i] = sampler.draw(rng)
        b = pat.flips // 8 - off
        b = b[(b >= 0) & (b < n * (s + ch))]
        in_sh = b < n * s
        owner = np.where(in_sh, b // s, (b - n * s) // ch)
        cols = np.unique(np.unique(b[in_sh]) % s, return_counts=True)[1]
        hit[i] = np.unique(owner).size > m and cols.size > 0 and cols.max() >= 2
    q = -math.expm1(8 * math.log1p(-ber))
    some = -math.expm1(s * math.log1p(-binom_tail(n, q, 1)))
    both = -math.expm1(s * math.log1p(-q * q))
    exact = some - math.comb(n, 2) * math.exp(8 * (s + ch) * (n - 2) * math.log1p(-ber)) * both
    e = estimate(hit, lw)
    assert within(e.mean, e.stderr, exact), (e, exact)
    assert e.rel_err < 0.05


@pytest.mark.parametrize(("protection", "ber"), [("rs(255,239)", 1e-3),
                                                 ("bch(m=13,t=2)", 4e-5),
                                                 ("shardrs(k=8,m=2)", 8e-5)])
def test_tilted_campaign_agrees_with_direct(protection: str, ber: float) -> None:
    """Both through the real engine at P(DUE) ~ 1e-2: the direct count against the weighted
    estimate, two-sided z <= 4 on the difference."""
    base: dict[str, Any] = dict(fault_model=raw_ber(ber), protection=protection, blocks=10,
                                **SMALL)
    direct = run_campaign(CampaignConfig(trials=200, seed=11, sampling="direct", **base))
    tilted = run_campaign(CampaignConfig(trials=40, seed=12, tilt="auto", **base))
    assert tilted.sampling == "importance" and tilted.importance is not None
    n = direct.blocks
    pd = direct.counts["due"] / n
    sd = math.sqrt(max(pd * (1 - pd), 1 / n) / n)
    e = tilted.importance["due"]
    z = (e["estimate"] - pd) / math.hypot(sd, e["stderr"])
    assert abs(z) <= 4, (pd, e, z)
    assert direct.counts["due"] >= 10 and e["rel_err"] < 0.35
    rec_d = (direct.counts["corrected"] + direct.counts["masked"]) / n
    r = tilted.importance["recovered"]
    z = (r["estimate"] - rec_d) / math.hypot(math.sqrt(rec_d * (1 - rec_d) / n), r["stderr"])
    assert abs(z) <= 4, (rec_d, r, z)


@pytest.mark.parametrize(("protection", "ber"), [
    ("rs(255,239)", 4e-7),        # ~3e-13: three header bits (the vote fails)
    ("bch(m=13,t=8)", 5e-7),      # ~6e-13
    ("rs(255,223)", 1e-9),        # ~5e-21
    ("rs(255,251)", 1e-12),       # ~1e-25: three bytes in one codeword beat the header
    ("shardrs(k=8,m=2)", 1e-8),   # ~8e-13: two bytes in one column, a third shard damaged
])
def test_rare_due_matches_analytic(protection: str, ber: float) -> None:
    """500 blocks through the real engine: the weighted P(DUE) has a relative error below 20 %
    and the analytic prediction lies within 4 of its standard errors."""
    cfg = CampaignConfig(fault_model=raw_ber(ber), protection=protection, trials=50,
                         blocks=10, seed=5, tilt="auto", **SMALL)
    s = run_campaign(cfg)
    assert s.importance is not None
    e = s.importance["due"]
    p = s.prediction.p_due
    assert e["rel_err"] < 0.2, e
    assert within(e["estimate"], e["stderr"], p), (e, p)
    assert s.counts["sdc"] == 0 and s.importance["sdc"]["estimate"] == 0.0
    r = s.importance["recovered"]
    assert within(r["estimate"], r["stderr"], s.prediction.p_corrected), (r, s.prediction)


def test_auto_plan_falls_back_to_conditional() -> None:
    m = faultmodels.get_model(raw_ber(1e-9))
    lay = layout_for("none", 16384)
    plan = auto_plan(m, "none", 16384, lay.record, 1.0)
    assert plan.alpha == 1.0 and "conditional" in plan.note


def test_tilted_replay_and_bad_tilts() -> None:
    cfg = CampaignConfig(fault_model=raw_ber(4e-7), protection="rs(255,239)", trials=3,
                         blocks=3, seed=2, tilt="auto", **SMALL)
    row = replay_trial(cfg, 1)
    assert row == replay_trial(cfg, 1)
    assert all("log_weight" in b for b in row["blocks"])
    for bad in (-1.0, "magic", float("inf"), True):
        with pytest.raises(ConfigError):
            CampaignConfig(tilt=bad)  # type: ignore[arg-type]
