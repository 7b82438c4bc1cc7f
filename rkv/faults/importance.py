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
  (:mod:`rkv.faults.importance_shard`).

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
from rkv.faults.importance_framing import FramingPlant
from rkv.faults.importance_shard import ShardPlant

#: The conditional share of the defensive mixture when something is tilted.
ALPHA = 0.5
#: The share of planted framing patterns that are two bits (harmless, if the decoder tries
#: every copy: the campaign checks it).
PAIR_SHARE = 0.25
#: Event counts tried for a class that is never fatal alone (lost sector pairs, triples).
COMBO_COUNTS = (2, 3)


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
                   tuple(tuple(float(f) for f in e) for e in d.get("extra", ())))


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
                k, pat = c.draw_count(rng) if chosen else (0, None)
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
                        pat = c.realize(k, rng)
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
                k, pat = c.draw_count(rng, self.tilts[j][i])
            counts.append(k)
            pats.append(pat)
        return counts, pats

    def _planted(self, rng: np.random.Generator, shard: bool = False
                 ) -> tuple[list[int], list[ErrorPattern | None]]:
        """Every class at its own law, then three header bits (or, ``shard``, the shard
        code's ``m + 1``) forced wrong."""
        counts, pats = [], []
        for c in self.classes:
            k, pat = c.draw_count(rng)
            counts.append(k)
            pats.append(pat)
        if shard and self.shard is not None:
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
        beta = max(0.0, 1.0 - alpha - gamma - delta)
        u = rng.random() if alpha < 1.0 else 0.0
        if u < alpha:
            counts, pats = self._conditional(rng)
        elif u < alpha + gamma:
            counts, pats = self._planted(rng)
        elif u < alpha + gamma + delta:
            counts, pats = self._planted(rng, shard=True)
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
        if any(counts) and alpha > 0.0:
            terms.append(math.log(alpha) - self.log_p_any)
        return pattern, -_logsumexp(np.asarray(terms))


# -- choosing the plan ---------------------------------------------------------------------
def uniform_plan(model: Any, nbytes: int, hours: float, s: float,
                 alpha: float = ALPHA) -> TiltPlan:
    """Every class with a known count law tilted by the same factor ``s``."""
    classes = model.event_classes(nbytes, hours)
    factors = tuple(float(s) if c.law is not None else 1.0 for c in classes)
    return TiltPlan(alpha, factors, note=f"every class's count tilted by {s:g}")


def auto_plan(model: Any, protection: str, data_bytes: int, nbytes: int, hours: float
              ) -> TiltPlan:
    """The tilt a campaign uses with ``tilt = "auto"``.

    * Independent bit errors under a code that corrects ``t`` symbols per unit (RS, BCH):
      the window tilt, one window per decoding unit's data bytes in the record, with the bit
      probability that puts ``t + 1`` wrong symbols in the window's codeword on average
      (the mean shifted to the failure threshold: the exponential tilt that is efficient for
      a tail ``P(K > t)``). Under a shard code: the shard planting (``m // 2 + 1`` wrong
      bytes in one column, ``m + 1`` damaged shards: the fewest bits that lose a block).
    * A clustered class (sector, row, poison, ...) whose single event is fatal less than half
      of the time (``rkv.faults.fatality.class_fatality``): its count tilted to one event per
      record on average, so that combinations of events are drawn; classes that are fatal on
      their own are left to the conditional half of the mixture. When some class is fatal
      alone sometimes, classes never fatal alone are not tilted (they would only add
      second-order combinations and weight variance).
    * Shares: ``alpha = 0.5`` with one other part (tilt, header planting, shard planting),
      ``0.25`` with two or more; the rest split evenly.
    * Nothing to tilt (``none``, ``raw``, or every class fatal on its own): ``alpha = 1``,
      plain conditional sampling.
    """
    from rkv.faults.fatality import class_fatality, fatal_at_count, layout_for
    from rkv.faults.reliability import RAW
    from rkv.record import copy_offsets

    classes = model.event_classes(nbytes, hours)
    factors = [1.0] * len(classes)
    notes: list[str] = []
    window_class, window_p = -1, 0.0
    windows: tuple[tuple[int, int], ...] = ()
    if protection == RAW:
        return TiltPlan(1.0, tuple(factors), note="raw: conditional sampling")
    lay = layout_for(protection, data_bytes)
    plant: tuple[int, ...] = ()
    prelude: tuple[int, ...] = ()
    shard: tuple[int, ...] = ()
    extra: list[tuple[float, ...]] = []
    for i, c in enumerate(classes):
        if not _is_bit_class(c, nbytes):
            continue
        h = lay.hlen
        if lay.kind == "shard":
            # Both plantings need the fewest bits of their failure; drop the header's when
            # its share of the planted mass (|W| p^(bits), to leading order) is below 1e-3.
            k, m, s, check = lay.params
            shard = (lay.payload_off, k + m, m, s, check)
            window_class = i
            notes.append(f"bits: shard columns planted ({m // 2 + 1} wrong bytes in a column "
                         f"of {k + m} shards, {m + 1} damaged shards)")
            if h > 0 and math.log(3 * (8 * h) ** 2) + 3 * math.log(c.p) < \
                    ShardPlant(shard, c.p, nbytes).log_norm + math.log(1e-3):
                h = 0
        if lay.kind != "detect" and h > 0 and 24 * h * c.p < 1.0:
            # The header's copies, where the record format puts them.
            plant, prelude = copy_offsets(h, lay.record, lay.spread)[::-1]
            window_class = i
            notes.append(f"bits: framing planted (3 wrong bits in the 3 copies of the {h}-byte "
                         f"header or of the prelude; {PAIR_SHARE:g} of them 2 bits)")
        if lay.kind in ("rs", "bch"):
            if lay.kind == "rs":
                _, k, il, t = lay.params
                span = k * il
                q = min(0.5, (t + 1) / k)                 # byte error probability wanted
                pt = -math.expm1(math.log1p(-q) / 8)
            else:
                span, _, t = lay.params
                pt = min(0.5, (t + 1) / (8 * span))
            if pt > c.p:
                starts = range(lay.payload_off, lay.payload_off + lay.data, span)
                windows = tuple((a, min(span, lay.payload_off + lay.data - a)) for a in starts)
                window_class, window_p = i, pt
                notes.append(f"bits: window tilt {pt / c.p:.3g}x over {len(windows)} "
                             f"{lay.kind} units of {span} data bytes (t + 1 = {t + 1} per unit)")
    # class_fatality judges the clustered classes in event_classes order (at the layout's
    # record size, which is the stored record's).
    idx = [i for i, c in enumerate(classes) if c.rate.kind != "bit" and c.log_p0 != 0.0]
    judged = class_fatality(model, protection, data_bytes, hours)
    if len(judged) != len(idx) or lay.record != nbytes:
        idx, judged = [], []
    # Classes that are sometimes fatal alone are the route to a loss; classes never fatal
    # alone matter only in combination, so they are tilted only when no class is.
    single = any(0.0 < f < 0.5 and classes[i].law is not None
                 for i, (_, _, f) in zip(idx, judged, strict=True))
    for i, (_, _, f) in zip(idx, judged, strict=True):
        c = classes[i]
        mean = c.mu if c.law == "poisson" else c.units * c.p
        if single and f == 0.0 and c.law is not None and 0.0 < mean < 1.0:
            # Never fatal alone, but perhaps as a pair or triple (lost sectors in three
            # shards): its own tilt to that count, a component of its own.
            for k in COMBO_COUNTS:
                fk = fatal_at_count(model, protection, data_bytes, hours, i, k)
                if fk > 0.0:
                    s = k / mean if c.law == "poisson" else min(k / mean, 0.5 / c.p)
                    extra.append(tuple(s if j == i else 1.0 for j in range(len(classes))))
                    notes.append(f"{c.rate.kind} ({c.rate.label or i}): count tilt {s:.3g}x "
                                 f"alone (never fatal alone, {fk:.3g} of {k} events are)")
                    break
            continue
        if c.law is None or f >= 0.5 or (single and f == 0.0):
            continue
        if 0.0 < mean < 1.0:
            factors[i] = 1.0 / mean if c.law == "poisson" else min(1.0 / mean, 0.5 / c.p)
            notes.append(f"{c.rate.kind} ({c.rate.label or i}): count tilt {factors[i]:.3g}x "
                         f"(fatal alone {f:.3g})")
    tilt = bool(windows) or any(f != 1.0 for f in factors) or bool(extra)
    parts = int(tilt) + int(bool(plant)) + int(bool(shard))
    if not parts:
        return TiltPlan(1.0, tuple(factors), note="nothing rare to tilt: conditional sampling")
    alpha = ALPHA if parts == 1 else ALPHA / 2
    share = (1.0 - alpha) / parts
    return TiltPlan(alpha, tuple(factors), window_class, window_p, windows, plant,
                    lay.hlen if plant else 0, share if plant else 0.0, shard,
                    share if shard else 0.0, "; ".join(notes), prelude,
                    PAIR_SHARE if plant else 0.0, tuple(extra))


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

    def to_dict(self) -> dict[str, float]:
        return {"estimate": self.mean, "stderr": self.stderr, "rel_err": self.rel_err,
                "hits": self.hits, "ess": self.ess}


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
