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
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ._checks import check_hours, check_nbytes
from ._dist import zt_binomial, zt_poisson
from .errors import FaultModelError
from .pattern import ERASURE_KINDS, EVENT_KINDS, ErrorPattern

__all__ = [
    "ERASURE_KINDS",
    "EVENT_KINDS",
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
    """

    __slots__ = ("_draw", "draw_nonzero", "log_p0", "rate")

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

    def draw(self, rng: np.random.Generator) -> ErrorPattern | None:
        if self._draw is not None:
            return self._draw(rng)
        if self.log_p0 == 0.0:
            return None
        if rng.random() < -math.expm1(self.log_p0):
            return self.draw_nonzero(rng)
        return None


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

    return EventClass(rate, -mu, draw_nonzero, draw)


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

    return EventClass(rate, log_p0, draw_nonzero, draw)


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

    # -- serialization -----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Same as `params()`."""
        return self.params()

    def to_toml(self) -> str:
        """TOML text that `faultmodels.load` / `get_model` turn back into an equal model."""
        from ._toml import dumps

        src = str(self.params().get("source", "")).strip()
        head = [f"# rkv faultmodels: {self.name} model"]
        head.extend(f"# {line}" for line in src.splitlines() if line.strip())
        return "\n".join(head) + "\n" + dumps(self.params())
