"""The framing's share of P(DUE), modelled exactly and sampled by planting (issue: rare-event
numbers where production targets sit).

* `_log_copies_ok` (three voted copies under independent bits) against enumerating every
  pattern of three 1-byte copies (2^24 patterns, exact weights) and a Markov chain over bit
  positions for real header sizes: agreement to rounding, at rates down to 1e-12.
* The framing plant: its count of planted choices inside a pattern against enumeration, and
  the defensive mixture with it against the exact P(header or prelude lost), two-sided.
* The latent-sector strata (`faultmodels.nand_cluster`): their probabilities against the
  model's own realizations, two-sided, and the fatality they give against plain sampling
  where clusters are common enough to sample.
* An extra count tilt (pairs of a class's events): unbiased for P(two events or more).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import faultmodels
from rkv.eval.faults.importance import Sampler, TiltPlan
from rkv.eval.faults.importance_framing import FramingPlant
from rkv.eval.faults.importance_plan import auto_plan
from rkv.reliability.analytic import _log_copies_ok
from rkv.reliability.fatality import judge, layout_for


def _chain_loss(nbits: int, p: float) -> float:
    """P(three copies of ``nbits`` bits lost) by a Markov chain over bit positions: the state
    is (which copies hold an error, whether some position is wrong in two): only sums of
    positive terms, so it is exact to rounding however small ``p`` is."""
    q = 1.0 - p
    # one position: which of the three copies are wrong there
    pats = [(m, p ** bin(m).count("1") * q ** (3 - bin(m).count("1"))) for m in range(8)]
    state = np.zeros((8, 2))
    state[0, 0] = 1.0
    for _ in range(nbits):
        new = np.zeros_like(state)
        for m, w in pats:
            dbl = int(bin(m).count("1") >= 2)
            for hit in range(8):
                new[hit | m, 0] += state[hit, 0] * w * (1 - dbl)
                new[hit | m, 1] += (state[hit, 1] + state[hit, 0] * dbl) * w
        state = new
    return float(state[7, 1])


def test_copies_loss_against_enumeration_of_every_pattern() -> None:
    pats = np.arange(1 << 24, dtype=np.uint32)
    c = [(pats >> (8 * i)) & 0xFF for i in range(3)]
    lost = ((c[0] > 0) & (c[1] > 0) & (c[2] > 0)
            & (((c[0] & c[1]) | (c[0] & c[2]) | (c[1] & c[2])) > 0))
    weight = np.unpackbits(pats.view(np.uint8)).reshape(-1, 32).sum(1)
    for p in (0.3, 1e-3, 1e-6):
        pw = np.exp(weight * math.log(p) + (24 - weight) * math.log1p(-p))
        want = float(pw[lost].sum())
        assert -math.expm1(_log_copies_ok(1, p)) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize(("nbytes", "p"), [(8, 1e-12), (163, 4e-7), (163, 1e-12), (40, 1e-3)])
def test_copies_loss_against_a_markov_chain(nbytes: int, p: float) -> None:
    want = _chain_loss(8 * nbytes, p)
    assert -math.expm1(_log_copies_ok(nbytes, p)) == pytest.approx(want, rel=1e-9)


def _plan(record: int, hlen: int, pair_share: float) -> TiltPlan:
    return TiltPlan(0.5, (1.0,), 0, plant=(16, 16 + hlen, record - 8 - hlen), plant_len=hlen,
                    plant_share=0.5, prelude=(0, 8, record - 8), pair_share=pair_share)


def test_framing_plant_counts_every_choice() -> None:
    """N2 and N3 of the plant (its log ratio) against enumerating the choices."""
    record, hlen, p = 120, 6, 1e-3
    fp = FramingPlant(_plan(record, hlen, 0.25), p)
    rng = np.random.default_rng(3)
    for i in range(40):
        flips = np.unique(rng.integers(0, 8 * record, size=int(rng.integers(0, 40))))
        if i % 2:
            flips = np.union1d(flips, fp.plant(rng))
        want = 0.0
        for starts, bits in fp.groups:
            sets = [set((flips[(flips >= 8 * s) & (flips < 8 * s + bits)] - 8 * s).tolist())
                    for s in starts]
            for a, b, t in ((0, 1, 2), (0, 2, 1), (1, 2, 0)):
                for j in range(bits):
                    if j in sets[a] and j in sets[b]:
                        want += 0.25 / len(fp.groups) / (3 * bits * p ** 2)
                        want += 0.75 * len(sets[t]) / (3 * sum(g[1] ** 2 for g in fp.groups)
                                                       * p ** 3)
        got = fp.log_ratio(flips)
        assert (got == -math.inf) if want == 0 else math.exp(got) == pytest.approx(want)
        if i % 2:
            assert got > -math.inf


@pytest.mark.parametrize("ber", [2e-7, 1e-12])
def test_framing_mixture_is_unbiased_against_the_exact_loss(ber: float) -> None:
    """The mixture (conditional + framing plant with two-bit patterns) estimates P(header or
    prelude lost) of a 2,000-byte record within 4 standard errors of the exact value (about
    2.7e-13 at 2e-7; 3.6e-28 at 1e-12)."""
    record, hlen = 2000, 160
    plan = _plan(record, hlen, 0.25)
    sampler = Sampler(faultmodels.get_model({"model": "raw-ber", "ber": ber}), record, 1.0,
                      plan)
    rng = np.random.default_rng(11)
    draws = 1500
    terms = np.zeros(draws)
    for i in range(draws):
        pat, lw = sampler.draw(rng)
        lost = False
        for starts, size in ((plan.plant, hlen), (plan.prelude, 8)):
            sets = [pat.flips[(pat.flips >= 8 * s) & (pat.flips < 8 * (s + size))] - 8 * s
                    for s in starts]
            lost |= (all(x.size for x in sets)
                     and bool(np.intersect1d(sets[0], sets[1]).size
                              or np.intersect1d(sets[0], sets[2]).size
                              or np.intersect1d(sets[1], sets[2]).size))
        terms[i] = math.exp(lw) if lost else 0.0
    want = -math.expm1(_log_copies_ok(hlen, ber) + _log_copies_ok(8, ber))
    est, se = terms.mean(), terms.std(ddof=1) / math.sqrt(draws)
    assert se > 0 and abs(est - want) <= 4 * se, (est, se, want)
    assert se < 0.15 * want                     # the planting makes it cheap


def _cluster_model(width_sectors: int) -> faultmodels.FaultModel:
    return faultmodels.get_model({"preset": "nvme-tlc",
                                  "cluster_bytes": 4096 * width_sectors})


def test_lse_strata_match_the_model_realizations() -> None:
    """P(J = j neighbours inside the record) from the strata against the class's own
    realizations (20,000 draws of one event), two-sided per stratum with enough mass."""
    m = _cluster_model(40)
    record = layout_for("shardrs(k=16,m=2)", 196608).record
    cls = m.event_classes(record, 24.0)[2]
    assert cls.strata is not None
    strata = cls.strata()
    assert sum(p for p, _ in strata) == pytest.approx(1.0, abs=1e-12)
    rng = np.random.default_rng(5)
    n = 20000
    counts = np.zeros(len(strata) + 1)
    for _ in range(n):
        pat = cls.realize(1, rng)
        secs = sum(length // 4096 + (1 if length % 4096 else 0) for _, length, _ in
                   pat.erasures)
        counts[min(secs - 1, len(strata))] += 1     # sectors lost besides the primary
    for j, (pj, _) in enumerate(strata[:4]):
        sd = math.sqrt(n * pj * (1 - pj))
        # distinct sectors: coinciding neighbours merge, so J = j shows as at most j extra
        if j == 0:
            assert counts[0] >= n * pj - 4 * sd
        assert abs(counts[: j + 1].sum() - n * sum(p for p, _ in strata[: j + 1])) <= \
            4 * math.sqrt(n * 0.25) + 1


def test_lse_strata_fatality_against_plain_sampling() -> None:
    """With clusters 8 sectors wide, one lost sector often brings neighbours into the record:
    P(fatal | one event) summed over the strata (`fatality._one_event_strata`, what predict
    uses) against judging 1,500 of the model's own draws, two-sided."""
    from rkv.reliability.fatality import _one_event_strata

    m = _cluster_model(8)
    lay = layout_for("shardrs(k=16,m=2)", 196608)
    cls = m.event_classes(lay.record, 24.0)[2]
    # (p_one 1e-24: strata below 1e-6 are dropped and count as fatal, a bound)
    f_strata, _, var = _one_event_strata(lay, cls, 2, 400, 196608, 1e-24)
    rng = np.random.default_rng(9)
    n = 1500
    f = sum(judge(lay, cls.realize(1, rng))[0] for _ in range(n)) / n
    se = math.sqrt(max(f * (1 - f), 1e-4) / n)
    assert f_strata > 0.01
    assert abs(f_strata - f) <= 4 * math.hypot(se, math.sqrt(var)), (f_strata, f)


def test_extra_count_tilt_is_unbiased_for_pairs() -> None:
    """A plan whose only tilt is an extra component pushing one Poisson class to two events:
    P(two or more events of that class) against the Poisson tail, within 4 standard errors."""
    m = faultmodels.get_model("nvme-tlc")
    record = layout_for("shardrs(k=16,m=2)", 196608).record
    classes = m.event_classes(record, 24.0)
    i = 3
    mu = classes[i].mu
    extra = tuple(2.0 / mu if j == i else 1.0 for j in range(len(classes)))
    plan = TiltPlan(0.5, (1.0,) * len(classes), extra=(extra,))
    sampler = Sampler(m, record, 24.0, plan)
    # draw() does not return the class's count: draw the tilted half here and weigh it as
    # draw() does (the conditional half meets two events of this class with probability
    # about mu / 2, 5e-10, and adds nothing measurable)
    rng = np.random.default_rng(2)
    draws = 2000
    hit = np.zeros(draws)
    for d in range(draws):
        if rng.random() < 0.5:
            continue
        counts, pats = sampler._tilted(rng)
        lr = sampler._log_ratio_tilted(counts, pats)
        w = 1.0 / (0.5 * math.exp(lr) + (0.5 * math.exp(-sampler.log_p_any)
                                          if any(counts) else 0.0))
        hit[d] = w if counts[i] >= 2 else 0.0
    want = -math.expm1(-mu) - mu * math.exp(-mu)
    est, se = hit.mean(), hit.std(ddof=1) / math.sqrt(draws)
    assert se > 0 and abs(est - want) <= 4 * se, (est, se, want)


@pytest.mark.parametrize("width", [8, 2441])
def test_strata_plant_is_unbiased(width: int) -> None:
    """The auto plan's strata plant (one latent sector error with two or more neighbours in
    the record): P(exactly one such event, in a stratum j >= 2) estimated from the mixture's
    weights against P(K = 1) sum_{j >= 2} pi_j (the default 10 MB clusters: about 3e-14;
    8-sector clusters: about 2e-10), and P(any fault) against the model's."""
    m = _cluster_model(width)
    code = "shardrs(k=16,m=2)"
    lay = layout_for(code, 196608)
    plan = auto_plan(m, code, 196608, lay.record, 24.0)
    assert plan.strata_share > 0 and plan.strata_from == 2
    sampler = Sampler(m, lay.record, 24.0, plan)
    cls = sampler.classes[plan.strata_class]
    pi = np.array([p for p, _ in cls.strata()])
    want = cls.mu * math.exp(-cls.mu) * pi[2:].sum() / pi.sum()
    rng = np.random.default_rng(8)
    draws = 2000
    hit, anyf = np.zeros(draws), np.zeros(draws)
    for d in range(draws):
        pat, lw = sampler.draw(rng)
        w = math.exp(lw)
        anyf[d] = w if (pat.flips.size or pat.erasures) else 0.0
        # (_j is the stratum of the class's single event in this draw, -1 if none)
        hit[d] = w if sampler._j >= 2 else 0.0
    est, se = hit.mean(), hit.std(ddof=1) / math.sqrt(draws)
    assert se > 0 and abs(est - want) <= 4 * se, (est, se, want)
    assert se < 0.1 * want
    p_any = m.p_any_error(lay.record, 24.0)
    est, se = anyf.mean(), anyf.std(ddof=1) / math.sqrt(draws)
    assert abs(est - p_any) <= 4 * se + 1e-12 * p_any, (est, se, p_any)
