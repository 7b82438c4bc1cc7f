"""The fault-model interface: event classes with their count laws, and the model base class
(error patterns live in :mod:`faultmodels.pattern` and are re-exported here).

A `FaultModel` describes what a reader sees when it reads back a buffer of `nbytes` bytes
after `hours` of residency in one tier, *above* the medium's own protection (the DRAM
controller's ECC, the SSD's LDPC/BCH, the CXL link CRC): silent bit flips, detected
erasures (lost sectors, poisoned cache lines) or a lost buffer.

Every model is a sum of independent event classes (`EventRate`). Each class has a count
distribution (Poisson, or binomial over a fixed number of units) and a way to turn a count
into concrete errors. Every event that a class counts produces a non-empty `ErrorPattern`,
so ``p_any_error = 1 - prod_c P(count_c = 0)`` exactly, and `sample_given_error` draws
from the exact conditional distribution (the first non-empty class is chosen with its exact
conditional probability and drawn zero-truncated; later classes are drawn unconditionally).

For rarer events than "at least one fault", `sample_tilted` draws every class's count from an
exponentially tilted law (Poisson(s mu), Binomial(units, s p)) and returns the exact log
likelihood ratio of the counts, so that weighted outcomes are unbiased
(docs/rare-events.md).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ._dist import zt_binomial, zt_poisson
from .checks import as_float, check_hours, check_nbytes
from .errors import FaultModelError
from .pattern import ERASURE_KINDS, EVENT_KINDS, ErrorPattern

__all__ = [
    "ERASURE_KINDS",
    "EVENT_KINDS",
    "TILT_CAP",
    "ErrorPattern",
    "EventClass",
    "EventRate",
    "FaultModel",
    "FaultModelError",
    "binomial_class",
    "poisson_class",
]

#: Larger expected event counts are refused (numpy's Poisson sampler cannot draw them and
#: such a buffer is garbage anyway).
MAX_MEAN = 1e15


@dataclass(frozen=True)
class EventRate:
    """One Poisson (or binomial) class of events that can hit a buffer.

    ``kind``: one of `EVENT_KINDS`. ``mean``: expected number of events hitting the buffer in
    the residency (for binomial classes, units x probability). ``footprint_bytes``: bytes of
    address space one event spans. ``bits_per_event``: expected number of wrong bits one
    event leaves in the buffer as the reader sees them (erased or lost bytes count 4 bits per
    byte: random garbage is wrong half the time). ``transient``: the event corrupts one read,
    not the stored bytes. ``detected``: the medium reports it (erasure / poison / lost).
    ``label``: human-readable description (e.g. "single-row, permanent").
    """

    kind: str
    mean: float
    footprint_bytes: int
    bits_per_event: float
    transient: bool = False
    detected: bool = False
    label: str = ""

    def __post_init__(self) -> None:
        if self.kind not in EVENT_KINDS:
            raise FaultModelError(f"event kind must be one of {sorted(EVENT_KINDS)}, "
                                  f"got {self.kind!r}")
        if not (self.mean >= 0.0 and math.isfinite(self.mean)):
            raise FaultModelError(f"event mean must be finite and >= 0, got {self.mean!r}")


Realize = Callable[[int, np.random.Generator], ErrorPattern]
Draw = Callable[[np.random.Generator], "ErrorPattern | None"]
DrawNonzero = Callable[[np.random.Generator], ErrorPattern]


class EventClass:
    """An event class with its exact count law (internal to the models).

    ``log_p0``: log P(no event of this class). ``draw_nonzero(rng)``: a pattern conditioned on
    at least one event (never empty). ``draw(rng)``: an unconditional draw (None if nothing).

    Classes built by `poisson_class` and `binomial_class` also know their count law
    (``law`` = "poisson" with ``mu``, or "binomial" with ``units`` and ``p``) and their
    ``realize(k, rng)``, which is what importance sampling tilts: `draw_tilted` draws the
    count from an exponentially tilted law and returns the log likelihood ratio of that
    count. Classes built otherwise (``law`` None, e.g. NAND's beta-binomial bits) are drawn
    untilted with log weight 0.
    """

    __slots__ = ("_draw", "draw_nonzero", "law", "log_p0", "mu", "p", "rate", "realize",
                 "strata", "units")

    def __init__(
        self,
        rate: EventRate,
        log_p0: float,
        draw_nonzero: DrawNonzero,
        draw: Draw | None = None,
    ) -> None:
        self.rate = rate
        self.log_p0 = float(log_p0)
        self.draw_nonzero = draw_nonzero
        self._draw = draw
        self.law: str | None = None
        self.mu = 0.0
        self.units = 0
        self.p = 0.0
        self.realize: Realize | None = None
        #: optional: one event's law split into strata, [(P(stratum), draw one event in
        #: it)], built on demand, so that a judge can weigh rare strata exactly
        #: (`faultmodels.nand_cluster`); None for classes whose events are all alike
        self.strata: Callable[[], list[tuple[float, Callable[[np.random.Generator],
                                                              ErrorPattern]]]] | None = None

    def draw(self, rng: np.random.Generator) -> ErrorPattern | None:
        if self._draw is not None:
            return self._draw(rng)
        if self.log_p0 == 0.0:
            return None
        if rng.random() < -math.expm1(self.log_p0):
            return self.draw_nonzero(rng)
        return None

    # -- tilted sampling (importance sampling) -----------------------------------------------
    def tilted_p(self, s: float) -> float:
        """A binomial class's per-unit probability under tilt ``s``: min(s p, `TILT_CAP`)
        (never below p when s >= 1; p itself when p is already at the cap or above)."""
        if self.p >= TILT_CAP or s == 1.0:
            return self.p
        return min(s * self.p, TILT_CAP)

    def log_ratio(self, k: int, s: float) -> float:
        """log q_s(k) / p(k): how much likelier ``k`` events are under tilt ``s`` than under
        the class's own law (0 for classes without a known law, which are never tilted)."""
        if s == 1.0 or self.law is None:
            return 0.0
        if self.law == "poisson":
            if self.mu <= 0.0:
                return 0.0
            return k * math.log(s) - (s - 1.0) * self.mu
        p, q = self.p, self.tilted_p(s)
        if q == p or p <= 0.0:
            return 0.0
        return k * (math.log(q) - math.log(p)) + (self.units - k) * (
            math.log1p(-q) - math.log1p(-p))

    def draw_count(self, rng: np.random.Generator, s: float = 1.0
                   ) -> tuple[int, ErrorPattern | None]:
        """(count, pattern) with the count drawn from the law tilted by ``s`` (s = 1: the
        class's own law). A class without a known law is drawn untilted and reports count 1
        when it fired, 0 otherwise."""
        _check_tilt(s)
        if self.law is None or self.realize is None:
            pat = self.draw(rng)
            return (0 if pat is None else 1), pat
        if self.law == "poisson":
            k = int(rng.poisson(s * self.mu)) if self.mu > 0.0 else 0
        else:
            k = int(rng.binomial(self.units, min(self.tilted_p(s), 1.0))) if self.p > 0 else 0
        return k, (self.realize(k, rng) if k else None)

    def draw_tilted(self, rng: np.random.Generator, s: float
                    ) -> tuple[ErrorPattern | None, float]:
        """A draw with the count from the law tilted by ``s`` (Poisson(s mu), or
        Binomial(units, min(s p, TILT_CAP))), and its log weight log p(k) / q_s(k):
        E_q[exp(log_weight) f(pattern)] = E_p[f(pattern)] exactly, for any f."""
        k, pat = self.draw_count(rng, s)
        return pat, -self.log_ratio(k, s)


#: The largest per-unit probability a binomial tilt goes to (beyond it the tilted law has
#: less spread than the failures it is meant to reach).
TILT_CAP = 0.5


def _check_tilt(s: float) -> None:
    as_float(s, "tilt factor", lo=0.0, lo_open=True, plain=True)


def poisson_class(rate: EventRate, realize: Realize) -> EventClass:
    """A class whose count is Poisson(rate.mean); `realize(k, rng)` turns k >= 1 events into
    a non-empty pattern."""
    mu = float(rate.mean)
    if mu > MAX_MEAN:
        raise FaultModelError(
            f"{rate.label or rate.kind}: {mu:.3g} expected events per buffer is too many to "
            "sample; lower the rate or the residency")

    def draw(rng: np.random.Generator) -> ErrorPattern | None:
        if mu <= 0.0:
            return None
        k = int(rng.poisson(mu))
        return realize(k, rng) if k else None

    def draw_nonzero(rng: np.random.Generator) -> ErrorPattern:
        return realize(zt_poisson(mu, rng), rng)

    c = EventClass(rate, -mu, draw_nonzero, draw)
    c.law, c.mu, c.realize = "poisson", mu, realize
    return c


def binomial_class(rate: EventRate, units: int, p: float, realize: Realize) -> EventClass:
    """A class whose count is Binomial(units, p) (e.g. independent bits or sectors)."""
    if units <= 0 or p <= 0.0:
        log_p0 = 0.0
    elif p >= 1.0:
        log_p0 = -math.inf
    else:
        log_p0 = units * math.log1p(-p)

    def draw(rng: np.random.Generator) -> ErrorPattern | None:
        if log_p0 == 0.0:
            return None
        k = int(rng.binomial(units, min(p, 1.0)))
        return realize(k, rng) if k else None

    def draw_nonzero(rng: np.random.Generator) -> ErrorPattern:
        return realize(zt_binomial(units, p, rng), rng)

    c = EventClass(rate, log_p0, draw_nonzero, draw)
    c.law, c.units, c.p, c.realize = "binomial", max(int(units), 0), max(float(p), 0.0), realize
    return c


def _check_rng(rng: Any) -> np.random.Generator:
    if not isinstance(rng, np.random.Generator):
        raise TypeError("rng must be a numpy.random.Generator (e.g. numpy.random.default_rng(0))")
    return rng


def combine_bit_probs(p_unreadable: float, p_flip: float) -> float:
    """P(bit wrong) when an unreadable bit reads back as a coin flip."""
    return 0.5 * p_unreadable + (1.0 - p_unreadable) * p_flip


class FaultModel(ABC):
    """Base class of every tier fault model (frozen dataclasses in the subclasses)."""

    name: ClassVar[str]

    # -- what subclasses provide -----------------------------------------------------------
    @abstractmethod
    def params(self) -> dict[str, Any]:
        """JSON/TOML-able parameters, including ``"model": name``; `from_params` inverts it."""

    @classmethod
    @abstractmethod
    def from_params(cls, d: Mapping[str, Any]) -> FaultModel:
        """Build from `params()` output (missing keys take the dataclass defaults)."""

    @abstractmethod
    def _build_classes(self, nbytes: int, hours: float) -> list[EventClass]:
        """The event classes for one buffer and residency."""

    @abstractmethod
    def _bit_probs(self, hours: float) -> tuple[float, float]:
        """(P(a given bit is unreadable: erased/lost), P(it is flipped)) after `hours`."""

    # -- latent faults present before the write ---------------------------------------------
    @property
    def latent_hours(self) -> float:
        """Mean hours a permanent fault stays undetected (until a scrub or a read finds it and
        the memory is retired): permanent faults that arose up to about this long before the
        write still sit in the memory the buffer is written to, so a permanent class's
        exposure is ``hours + latent_hours``. 0 (the default): only faults arising during the
        residency count. Models without such faults (NAND: writes go to fresh pages) keep 0."""
        return 0.0

    def with_latent_hours(self, hours: float) -> FaultModel:
        """This model with `latent_hours` set to ``hours``; a model without latent faults
        returns itself (``hours`` is checked either way)."""
        check_hours(hours)
        return self

    # -- the shared machinery ----------------------------------------------------------------
    def _classes(self, nbytes: int, hours: float) -> list[EventClass]:
        n = check_nbytes(nbytes)
        h = check_hours(hours)
        cache: dict[tuple[int, float], list[EventClass]] | None = self.__dict__.get("_fm_cache")
        if cache is None:
            cache = {}
            object.__setattr__(self, "_fm_cache", cache)
        key = (n, h)
        got = cache.get(key)
        if got is None:
            got = self._build_classes(n, h) if n > 0 else []
            if len(cache) >= 128:
                cache.clear()
            cache[key] = got
        return got

    def bit_error_prob(self, hours: float) -> float:
        """Marginal probability that one given bit of a buffer reads back wrong after `hours`
        (all modes combined, above the medium's own protection). A bit inside an erasure or
        a lost buffer counts as wrong with probability 1/2 (the reader gets random bytes)."""
        pu, pf = self._bit_probs(check_hours(hours))
        return combine_bit_probs(pu, pf)

    def event_classes(self, nbytes: int, hours: float) -> list[EventClass]:
        """The event classes with their count laws and samplers (``draw_nonzero`` gives a
        class's pattern conditioned on it firing): what an analytic model needs to judge a
        class by its footprint distribution rather than its mean."""
        return list(self._classes(nbytes, hours))

    def events(self, nbytes: int, hours: float) -> list[EventRate]:
        """The event classes that can hit a buffer of `nbytes` bytes in `hours`."""
        return [c.rate for c in self._classes(nbytes, hours)]

    def p_any_error(self, nbytes: int, hours: float) -> float:
        """P(the sampled pattern is not empty); exact, accurate down to 1e-300."""
        s = math.fsum(c.log_p0 for c in self._classes(nbytes, hours))
        return -math.expm1(s)

    def sample(self, nbytes: int, hours: float, rng: np.random.Generator) -> ErrorPattern:
        """One draw of the errors a reader sees (deterministic given `rng`)."""
        _check_rng(rng)
        classes = self._classes(nbytes, hours)
        parts = [p for c in classes if (p := c.draw(rng)) is not None]
        return ErrorPattern.combine(check_nbytes(nbytes), parts)

    def sample_given_error(
        self, nbytes: int, hours: float, rng: np.random.Generator
    ) -> ErrorPattern:
        """A pattern drawn from the exact distribution of `sample` conditioned on it being
        non-empty. For rare-event estimation: weight conditional outcomes by `p_any_error`."""
        _check_rng(rng)
        classes = self._classes(nbytes, hours)
        logz = [c.log_p0 for c in classes]
        total = math.fsum(logz)
        if not total < 0.0:
            raise FaultModelError(
                f"{self.name}: no error can happen to {nbytes} bytes in {hours} h "
                "(p_any_error is 0)")
        suffix = [0.0] * (len(logz) + 1)
        for i in range(len(logz) - 1, -1, -1):
            suffix[i] = suffix[i + 1] + logz[i]
        parts: list[ErrorPattern] = []
        chosen = False
        for i, c in enumerate(classes):
            if chosen:
                p = c.draw(rng)
                if p is not None:
                    parts.append(p)
                continue
            if logz[i] == 0.0:
                continue
            # P(this class fires | some class from here on fires); 1 if no later class can
            q = 1.0 if logz[i] == suffix[i] else math.expm1(logz[i]) / math.expm1(suffix[i])
            if q >= 1.0 or rng.random() < q:
                parts.append(c.draw_nonzero(rng))
                chosen = True
        return ErrorPattern.combine(check_nbytes(nbytes), parts)

    def sample_tilted(
        self, nbytes: int, hours: float, rng: np.random.Generator,
        s: float | Mapping[str | int, float],
    ) -> tuple[ErrorPattern, float]:
        """A pattern with every class's count drawn from its exponentially tilted law, and
        the log importance weight: ``E[exp(w) f(pattern)]`` under this draw equals
        ``E[f(sample(...))]`` exactly, for any ``f`` (unbiased importance sampling).

        ``s``: one tilt factor for every class, or a mapping from a class's kind (``"bit"``,
        ``"sector"``, ...) or its index in `event_classes` to its factor (absent: 1). A
        Poisson count is drawn from Poisson(s mu) (log weight k log(1/s) + (s - 1) mu); a
        binomial count from Binomial(units, min(s p, 0.5)) (the exact ratio of the two
        binomial laws). Classes without a known count law are drawn untilted (weight 1).
        """
        _check_rng(rng)
        classes = self._classes(nbytes, hours)
        parts: list[ErrorPattern] = []
        log_w = 0.0
        for i, c in enumerate(classes):
            f = float(s.get(i, s.get(c.rate.kind, 1.0))) if isinstance(s, Mapping) else float(s)
            pat, lw = c.draw_tilted(rng, f)
            log_w += lw
            if pat is not None:
                parts.append(pat)
        return ErrorPattern.combine(check_nbytes(nbytes), parts), log_w

    # -- serialization -----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Same as `params()`."""
        return self.params()

    def to_toml(self) -> str:
        """TOML text that `faultmodels.load` / `get_model` turn back into an equal model."""
        import tomli_w

        params = self.params()
        try:
            body = tomli_w.dumps(params)
        except TypeError as e:  # a parameter that is not a TOML value (a bug in a model)
            raise FaultModelError(f"{self.name}: cannot write parameters to TOML: {e}") from e
        src = str(params.get("source", "")).strip()
        head = [f"# rkv faultmodels: {self.name} model"]
        head.extend(f"# {line}" for line in src.splitlines() if line.strip())
        return "\n".join(head) + "\n" + body
