"""Importance sampling for campaigns: per-block error patterns with exact log weights.

A campaign under importance sampling draws each block's pattern from a *proposal* ``q``
instead of the fault model's law ``p`` and carries the weight ``w = p(x) / q(x)``; every
weighted outcome rate ``mean(w * 1{outcome})`` is then an unbiased estimate of the outcome's
probability per block, whatever ``q`` is, as long as ``q`` can produce every pattern ``p`` can.

The proposal is a *defensive mixture* (docs/rare-events.md):

* with probability ``alpha``, the pattern conditioned on at least one fault
  (``p(x) 1{x has a fault} / p_any``: what conditional sampling draws);
* otherwise the *tilted* law: every event class's count drawn from its exponentially tilted
  law (``EventClass.draw_count(rng, s)``), and for the model's independent-bit class
  optionally a *window tilt*: one window (a decoding unit's span in the record) picked at
  random from the plan's windows gets bit probability ``window_p``, every other bit keeps the
  model's ``p``.

* with probability ``plant_share``, for records with a voted header, three wrong header
  bits planted where the bitwise vote fails (the same bit in two copies, any bit in the
  third: the fewest errors that lose the header), every other bit at the model's ``p``.
* with probability ``shard_share``, for shard RS codes, ``m + 1`` wrong bits planted where
  the column decoding fails (``m // 2 + 1`` in one byte column, one in each of the other
  shards needed to damage more than ``m``), every other bit at the model's ``p``
  (:mod:`rkv.eval.faults.importance_shard`).

The weight is that of the mixture, computed from the counts of the draw whichever component
drew it: ``w = 1 / (alpha 1{fault} / p_any + (1 - alpha) prod_c r_c(x))`` with ``r_c`` the
class's likelihood ratio (for the window tilt, the mean over windows of the ratio of the
window's count). So a block is never weighted more than ``p_any / alpha`` (the estimate is
never much worse than conditional sampling), and a tilted block that reaches a rare failure
is weighted by the exact ratio that makes it count for what it is.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from faultmodels.base import ErrorPattern, EventClass
from rkv.eval.faults.importance_framing import FramingPlant
from rkv.eval.faults.importance_shard import ShardPlant
from rkv.eval.faults.importance_strata import StrataPlant
from rkv.eval.stats import wilson

#: The conditional share of the defensive mixture when something is tilted.
ALPHA = 0.5


@dataclass(frozen=True)
class TiltPlan:
    """What the proposal tilts, for one fault model, record size and residency.

    ``factors``: per event class (in `FaultModel.event_classes` order), the count tilt
    (1.0: untilted). ``windows``: byte ranges ``(start, length)`` of the record for the
    window tilt of class ``window_class`` (its bits get probability ``window_p`` inside the
    chosen window). ``alpha``: the conditional share of the mixture. ``note``: how the plan
    was chosen (printed with the summary).
    """

    alpha: float
    factors: tuple[float, ...]
    window_class: int = -1
    window_p: float = 0.0
    windows: tuple[tuple[int, int], ...] = ()
    plant: tuple[int, ...] = ()
    plant_len: int = 0
    plant_share: float = 0.0
    shard: tuple[int, ...] = ()
    shard_share: float = 0.0
    note: str = ""
    #: the three prelude copies' offsets, planted like the header's (``plant_len`` 8)
    prelude: tuple[int, ...] = ()
    #: the share of planted framing patterns that are two bits (one bit in two copies of
    #: the header or of the prelude: never fatal for a decoder that tries every copy)
    pair_share: float = 0.0
    #: further count tilts, each drawn instead of ``factors`` with an equal share of the
    #: tilted part (classes that lose a block only as pairs or triples of their events, so
    #: tilting them with the rest would swamp the other classes' weights)
    extra: tuple[tuple[float, ...], ...] = ()
    #: a class whose single event comes in strata, planted from stratum ``strata_from`` up
    #: (:mod:`rkv.eval.faults.importance_strata`) with probability ``strata_share``
    strata_class: int = -1
    strata_from: int = 0
    strata_share: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["windows"] = [list(w) for w in self.windows]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TiltPlan:
        return cls(float(d["alpha"]), tuple(float(f) for f in d["factors"]),
                   int(d["window_class"]), float(d["window_p"]),
                   tuple((int(a), int(b)) for a, b in d["windows"]),
                   tuple(int(a) for a in d.get("plant", ())), int(d.get("plant_len", 0)),
                   float(d.get("plant_share", 0.0)), tuple(int(a) for a in d.get("shard", ())),
                   float(d.get("shard_share", 0.0)), str(d.get("note", "")),
                   tuple(int(a) for a in d.get("prelude", ())),
                   float(d.get("pair_share", 0.0)),
                   tuple(tuple(float(f) for f in e) for e in d.get("extra", ())),
                   int(d.get("strata_class", -1)), int(d.get("strata_from", 0)),
                   float(d.get("strata_share", 0.0)))


def _is_bit_class(c: EventClass, nbytes: int) -> bool:
    """Independent uniform bit errors over the whole buffer (raw BER, raw NAND): a binomial
    class of kind "bit" over 8 * nbytes units, the convention `predict` relies on too."""
    return c.law == "binomial" and c.rate.kind == "bit" and c.units == 8 * nbytes and c.p > 0


def _logsumexp(x: np.ndarray) -> float:
    m = float(np.max(x))
    if m == -math.inf:
        return -math.inf
    return m + math.log(float(np.sum(np.exp(x - m))))


class Sampler:
    """Draws ``(pattern, log_weight)`` for one record size under a plan."""

    def __init__(self, model: Any, nbytes: int, hours: float, plan: TiltPlan) -> None:
        self.nbytes = nbytes
        self.classes: list[EventClass] = model.event_classes(nbytes, hours)
        if len(plan.factors) != len(self.classes):
            raise ValueError(f"plan tilts {len(plan.factors)} classes, the model has "
                             f"{len(self.classes)}")
        self.plan = plan
        self.tilts = (plan.factors, *plan.extra)
        if any(len(f) != len(self.classes) for f in plan.extra):
            raise ValueError("an extra tilt must have a factor per class")
        self.logz = [c.log_p0 for c in self.classes]
        total = math.fsum(self.logz)
        if not total < 0.0:
            raise ValueError("no fault can happen: nothing to sample")
        self.log_p_any = math.log(-math.expm1(total))
        self.suffix = [0.0] * (len(self.logz) + 1)
        for i in range(len(self.logz) - 1, -1, -1):
            self.suffix[i] = self.suffix[i + 1] + self.logz[i]
        self.wc = plan.window_class if plan.windows else -1
        if self.wc >= 0:
            c = self.classes[self.wc]
            if not _is_bit_class(c, nbytes):
                raise ValueError("the window tilt needs an independent-bit class")
            w = np.asarray(plan.windows, dtype=np.int64).reshape(-1, 2)
            self.w_start = 8 * w[:, 0]
            self.w_bits = 8 * w[:, 1]
            if (np.any(self.w_bits <= 0) or np.any(self.w_start[1:] < self.w_start[:-1]
                                                   + self.w_bits[:-1])
                    or self.w_start[-1] + self.w_bits[-1] > 8 * nbytes):
                raise ValueError("windows must be sorted, disjoint and inside the record")
            p, pt = c.p, plan.window_p
            self.w_a = math.log(pt) - math.log(p)
            self.w_b = math.log1p(-pt) - math.log1p(-p)
        self.pc = plan.window_class if plan.plant_share > 0 else -1
        if self.pc >= 0:
            c = self.classes[self.pc]
            if not _is_bit_class(c, nbytes) or len(plan.plant) != 3 or plan.plant_len <= 0 \
                    or len(plan.prelude) not in (0, 3) or not 0.0 <= plan.pair_share < 1.0:
                raise ValueError("planting needs an independent-bit class and three copies")
            self.framing = FramingPlant(plan, c.p)
        self.sc = plan.window_class if plan.shard_share > 0 else -1
        self.shard: ShardPlant | None = None
        if self.sc >= 0:
            c = self.classes[self.sc]
            if not _is_bit_class(c, nbytes):
                raise ValueError("shard planting needs an independent-bit class")
            self.shard = ShardPlant(plan.shard, c.p, nbytes)
        self.stc = plan.strata_class if plan.strata_share > 0 else -1
        self.strata = StrataPlant(self.classes[self.stc], plan.strata_from) \
            if self.stc >= 0 else None
        self._j = -1          # the stratum of the strata class's single event in this draw

    # -- the two components --------------------------------------------------------------
    def _conditional(self, rng: np.random.Generator
                     ) -> tuple[list[int], list[ErrorPattern | None]]:
        """Counts and patterns conditioned on at least one event (as `sample_given_error`)."""
        from faultmodels._dist import zt_binomial, zt_poisson

        counts: list[int] = []
        pats: list[ErrorPattern | None] = []
        chosen = False
        for i, c in enumerate(self.classes):
            if chosen or self.logz[i] == 0.0:
                k, pat = self._count(i, c, rng) if chosen else (0, None)
            else:
                lz, rest = self.logz[i], self.suffix[i]
                q = 1.0 if lz == rest else math.expm1(lz) / math.expm1(rest)
                if q >= 1.0 or rng.random() < q:
                    chosen = True
                    if c.law is None or c.realize is None:
                        k, pat = 1, c.draw_nonzero(rng)
                    else:
                        k = (zt_poisson(c.mu, rng) if c.law == "poisson"
                             else zt_binomial(c.units, c.p, rng))
                        pat = self._realize(i, c, k, rng)
                else:
                    k, pat = 0, None
            counts.append(k)
            pats.append(pat)
        return counts, pats

    def _tilted(self, rng: np.random.Generator
                ) -> tuple[list[int], list[ErrorPattern | None]]:
        j = int(rng.integers(len(self.tilts))) if len(self.tilts) > 1 else 0
        counts: list[int] = []
        pats: list[ErrorPattern | None] = []
        for i, c in enumerate(self.classes):
            if i == self.wc and j == 0:
                k, pat = self._window_draw(c, rng)
            else:
                k, pat = self._count(i, c, rng, self.tilts[j][i])
            counts.append(k)
            pats.append(pat)
        return counts, pats

    def _count(self, i: int, c: EventClass, rng: np.random.Generator, s: float = 1.0
               ) -> tuple[int, ErrorPattern | None]:
        """`EventClass.draw_count`, with the strata class's single event drawn through its
        strata (equal in law; the stratum is remembered for the weight)."""
        if i != self.stc:
            return c.draw_count(rng, s)
        k = int(rng.poisson(s * c.mu))
        return k, (self._realize(i, c, k, rng) if k else None)

    def _realize(self, i: int, c: EventClass, k: int, rng: np.random.Generator
                 ) -> ErrorPattern:
        if i == self.stc and k == 1 and self.strata is not None:
            pat, self._j = self.strata.one(rng)
            return pat
        assert c.realize is not None
        return c.realize(k, rng)

    def _planted(self, rng: np.random.Generator, what: str = "framing"
                 ) -> tuple[list[int], list[ErrorPattern | None]]:
        """Every class at its own law, then (``what``) wrong framing bits, the shard code's
        ``m + 1`` bits (``"shard"``) forced wrong, or the strata class's one event from a
        planted stratum (``"strata"``)."""
        counts: list[int] = []
        pats: list[ErrorPattern | None] = []
        for i, c in enumerate(self.classes):
            pat: ErrorPattern | None
            if i == self.stc and what == "strata" and self.strata is not None:
                pat, self._j = self.strata.one(rng, planted=True)
                k = 1
            else:
                k, pat = self._count(i, c, rng)
            counts.append(k)
            pats.append(pat)
        if what == "strata":
            return counts, pats
        if what == "shard" and self.shard is not None:
            i, planted = self.sc, self.shard.plant(rng)
        else:
            i, planted = self.pc, self.framing.plant(rng)
        old = pats[i]
        flips = np.unique(planted) if old is None else np.union1d(old.flips, planted)
        counts[i] = int(flips.size)
        pats[i] = ErrorPattern(self.nbytes, flips)
        return counts, pats

    def _log_ratio_planted(self, pats: list[ErrorPattern | None]) -> float:
        """log q_plant(x) / p(x) (:meth:`FramingPlant.log_ratio`)."""
        pat = pats[self.pc]
        return -math.inf if pat is None else self.framing.log_ratio(pat.flips)

    def _window_draw(self, c: EventClass, rng: np.random.Generator
                     ) -> tuple[int, ErrorPattern | None]:
        from faultmodels._dist import distinct

        m = int(rng.integers(self.w_start.size))
        s0, wb = int(self.w_start[m]), int(self.w_bits[m])
        n = c.units
        k_in = int(rng.binomial(wb, self.plan.window_p))
        k_out = int(rng.binomial(n - wb, c.p))
        inside = s0 + distinct(wb, k_in, rng)
        outside = distinct(n - wb, k_out, rng)
        outside[outside >= s0] += wb
        k = k_in + k_out
        if not k:
            return 0, None
        return k, ErrorPattern(self.nbytes, np.sort(np.concatenate((inside, outside))))

    # -- the mixture's weight ------------------------------------------------------------
    def _log_ratio_tilted(self, counts: list[int], pats: list[ErrorPattern | None]) -> float:
        """log q_tilted(x) / p(x): the mean over the plan's count tilts of their ratios."""
        if len(self.tilts) == 1:
            return self._log_ratio_primary(counts, pats)
        terms = [self._log_ratio_primary(counts, pats)]
        for f in self.tilts[1:]:
            terms.append(math.fsum(c.log_ratio(counts[i], f[i]) if f[i] != 1.0 else 0.0
                                   for i, c in enumerate(self.classes)))
        return _logsumexp(np.asarray(terms)) - math.log(len(self.tilts))

    def _log_ratio_primary(self, counts: list[int], pats: list[ErrorPattern | None]
                           ) -> float:
        """log q(x) / p(x) of the primary tilt (``factors`` and the window tilt)."""
        total = 0.0
        for i, c in enumerate(self.classes):
            if i == self.wc:
                pat = pats[i]
                flips = pat.flips if pat is not None else np.empty(0, np.int64)
                idx = np.searchsorted(self.w_start, flips, side="right") - 1
                ok = idx >= 0
                ok[ok] = flips[ok] < self.w_start[idx[ok]] + self.w_bits[idx[ok]]
                k = np.bincount(idx[ok], minlength=self.w_start.size).astype(np.float64)
                terms = k * self.w_a + (self.w_bits - k) * self.w_b
                total += _logsumexp(terms) - math.log(self.w_start.size)
            else:
                total += c.log_ratio(counts[i], self.plan.factors[i])
        return total

    def draw(self, rng: np.random.Generator) -> tuple[ErrorPattern, float]:
        """One block's pattern and its log weight log p(x) / q(x)."""
        alpha, gamma = self.plan.alpha, (self.plan.plant_share if self.pc >= 0 else 0.0)
        delta = self.plan.shard_share if self.shard is not None else 0.0
        eps = self.plan.strata_share if self.strata is not None else 0.0
        beta = max(0.0, 1.0 - alpha - gamma - delta - eps)
        u = rng.random() if alpha < 1.0 else 0.0
        self._j = -1
        if u < alpha:
            counts, pats = self._conditional(rng)
        elif u < alpha + gamma:
            counts, pats = self._planted(rng)
        elif u < alpha + gamma + delta:
            counts, pats = self._planted(rng, "shard")
        elif u < alpha + gamma + delta + eps:
            counts, pats = self._planted(rng, "strata")
        else:
            counts, pats = self._tilted(rng)
        parts = [p for p in pats if p is not None]
        pattern = ErrorPattern.combine(self.nbytes, parts)
        if alpha >= 1.0:
            return pattern, self.log_p_any
        terms = []
        if beta > 0.0:
            terms.append(math.log(beta) + self._log_ratio_tilted(counts, pats))
        if gamma > 0.0:
            terms.append(math.log(gamma) + self._log_ratio_planted(pats))
        if delta > 0.0 and self.shard is not None:
            sp = pats[self.sc]
            terms.append(math.log(delta) + (self.shard.log_ratio(sp.flips) if sp is not None
                                            else -math.inf))
        if eps > 0.0 and self.strata is not None:
            terms.append(math.log(eps) + self.strata.log_ratio(counts[self.stc], self._j))
        if any(counts) and alpha > 0.0:
            terms.append(math.log(alpha) - self.log_p_any)
        return pattern, -_logsumexp(np.asarray(terms))


# -- the estimate --------------------------------------------------------------------------
@dataclass(frozen=True)
class Estimate:
    """A weighted estimate of one outcome's probability per block."""

    mean: float
    stderr: float
    hits: int          # blocks with this outcome
    ess: float         # (sum w 1{o})^2 / sum (w 1{o})^2: how many hits it is worth

    @property
    def rel_err(self) -> float:
        return self.stderr / self.mean if self.mean > 0 else math.inf

    def interval(self, z: float = 1.96) -> tuple[float, float]:
        """The 95 % (default ``z``) interval of the probability: Wilson's score interval on
        the effective counts, ``n* = p(1 - p) / se^2`` blocks of which ``k* = p n*`` hit
        (the binomial with this estimate's mean and variance; ``k*`` is ``1 / rel_err^2``
        for a rare outcome). Unlike ``mean +- z se`` it is skewed up like the estimator's
        own distribution when few weighted hits carry it, where the normal interval covers
        far less than 95 % (measured in tests/test_interval_coverage.py). Where the estimate
        is noisier than one Bernoulli draw (``n* < 1``, or ``p >= 1``), no binomial has its
        mean and variance: ``mean +- z se`` (cut at 0) is used. No hits: (0, 0),
        since the weights of the blocks not drawn are unknown (the campaign's plan keeps
        the expected hits well above zero)."""
        if self.stderr <= 0 or self.mean <= 0:
            return self.mean, self.mean
        p = self.mean
        n_eff = p * (1 - p) / self.stderr ** 2 if p < 1 else 0.0
        if n_eff < 1:     # noisier than one Bernoulli draw (or p >= 1): no binomial reading
            return max(0.0, p - z * self.stderr), p + z * self.stderr
        return wilson(p * n_eff, n_eff, z)

    def to_dict(self) -> dict[str, float]:
        lo, hi = self.interval()
        return {"estimate": self.mean, "stderr": self.stderr, "rel_err": self.rel_err,
                "hits": self.hits, "ess": self.ess, "lo": lo, "hi": hi}


def estimate(hit: np.ndarray, log_w: np.ndarray) -> Estimate:
    """mean(w 1{hit}) over all blocks, with its standard error (sample standard deviation
    of the per-block terms over sqrt(n))."""
    n = int(log_w.size)
    lw = log_w[hit]
    if n == 0 or lw.size == 0:
        return Estimate(0.0, 0.0, 0, 0.0)
    top = float(lw.max())
    y = np.zeros(n)
    y[: lw.size] = np.exp(lw - top)          # the order of terms does not matter
    mean = float(y.mean())
    var = float(((y - mean) ** 2).sum() / max(n - 1, 1))
    ess = float(y.sum() ** 2 / (y ** 2).sum())
    scale = math.exp(top)
    return Estimate(mean * scale, math.sqrt(var / n) * scale, int(lw.size), ess)


def weight_ess(log_w: np.ndarray) -> float:
    """Kish's effective sample size of the weights."""
    if log_w.size == 0:
        return 0.0
    y = np.exp(log_w - float(log_w.max()))
    return float(y.sum() ** 2 / (y ** 2).sum())
