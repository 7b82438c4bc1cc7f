"""The fault-model interface: error patterns, Poisson event classes, and the model base class.

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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from ._checks import check_hours, check_nbytes
from ._dist import zt_binomial, zt_poisson
from .errors import FaultModelError

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

EVENT_KINDS = frozenset(
    {"bit", "word", "column", "row", "bank", "burst", "sector", "poison", "region", "link",
     "silent"}
)
ERASURE_KINDS = frozenset({"sector", "poison"})

IntArray = npt.NDArray[np.int64]

#: Larger expected event counts are refused (numpy's Poisson sampler cannot draw them and
#: such a buffer is garbage anyway).
MAX_MEAN = 1e15


def _empty_flips() -> IntArray:
    a = np.empty(0, dtype=np.int64)
    a.setflags(write=False)
    return a


def _normalize_erasures(
    erasures: Iterable[tuple[int, int, str]], nbytes: int
) -> tuple[tuple[int, int, str], ...]:
    """Validate, sort and merge overlapping or touching erasures of the same kind."""
    by_kind: dict[str, list[tuple[int, int]]] = {}
    for e in erasures:
        try:
            start, length, kind = e
        except (TypeError, ValueError):
            raise FaultModelError(f"erasure must be (start, length, kind), got {e!r}") from None
        if kind not in ERASURE_KINDS:
            raise FaultModelError(
                f"erasure kind must be one of {sorted(ERASURE_KINDS)}, got {kind!r}")
        start, length = int(start), int(length)
        if length <= 0 or start < 0 or start + length > nbytes:
            raise FaultModelError(
                f"erasure ({start}, {length}) is empty or outside the {nbytes}-byte buffer")
        by_kind.setdefault(kind, []).append((start, start + length))
    out: list[tuple[int, int, str]] = []
    for kind, iv in by_kind.items():
        if len(iv) == 1:
            out.append((iv[0][0], iv[0][1] - iv[0][0], kind))
            continue
        arr = np.array(sorted(iv), dtype=np.int64)
        starts, ends = arr[:, 0], arr[:, 1]
        run_end = np.maximum.accumulate(ends)
        new = np.ones(starts.size, dtype=bool)
        new[1:] = starts[1:] > run_end[:-1]
        gi = np.flatnonzero(new)
        g_end = np.maximum.reduceat(ends, gi)
        out.extend((int(s), int(e - s), kind) for s, e in zip(starts[gi], g_end, strict=True))
    out.sort(key=lambda t: (t[0], t[2]))
    return tuple(out)


def _union_intervals(erasures: Sequence[tuple[int, int, str]]) -> tuple[IntArray, IntArray]:
    """Union of erasure ranges regardless of kind, as sorted disjoint (starts, ends)."""
    if not erasures:
        e = np.empty(0, dtype=np.int64)
        return e, e
    arr = np.array(sorted((s, s + n) for s, n, _ in erasures), dtype=np.int64)
    starts, ends = arr[:, 0], arr[:, 1]
    run_end = np.maximum.accumulate(ends)
    new = np.ones(starts.size, dtype=bool)
    new[1:] = starts[1:] > run_end[:-1]
    gi = np.flatnonzero(new)
    return starts[gi], np.maximum.reduceat(ends, gi)


@dataclass(frozen=True, eq=False)
class ErrorPattern:
    """Concrete errors for a buffer of `nbytes` bytes after a residency (ground truth).

    ``flips``: int64 bit offsets, sorted and unique; bit ``b`` is bit ``b % 8`` (LSB = 0) of
    byte ``b // 8``. ``erasures``: ``(start_byte, length, kind)`` ranges the medium cannot
    return, ``kind`` in ``{"sector", "poison"}`` (detected; the reader gets garbage there).
    ``lost``: the whole buffer is gone (region or controller failure). ``transient``: the
    errors apply to one read only (link errors), not to the stored bytes.

    The constructor sorts/uniquifies flips and merges overlapping erasures of one kind.
    """

    nbytes: int
    flips: IntArray = field(default_factory=_empty_flips)
    erasures: tuple[tuple[int, int, str], ...] = ()
    lost: bool = False
    transient: bool = False

    def __post_init__(self) -> None:
        n = check_nbytes(self.nbytes)
        object.__setattr__(self, "nbytes", n)
        f = np.asarray(self.flips)
        if f.size == 0:
            f = _empty_flips()
        else:
            if f.ndim != 1 or not np.issubdtype(f.dtype, np.integer):
                raise FaultModelError("flips must be a 1-D array of integer bit offsets")
            f = f.astype(np.int64, copy=True)
            if f.size > 1 and not bool(np.all(f[1:] > f[:-1])):
                f = np.unique(f)
            if f[0] < 0 or f[-1] >= 8 * n:
                raise FaultModelError(f"flip bit offsets must lie in [0, {8 * n})")
            f.setflags(write=False)
        object.__setattr__(self, "flips", f)
        object.__setattr__(self, "erasures", _normalize_erasures(self.erasures, n))
        object.__setattr__(self, "lost", bool(self.lost))
        object.__setattr__(self, "transient", bool(self.transient))

    # -- helpers ---------------------------------------------------------------------------
    @classmethod
    def empty(cls, nbytes: int) -> ErrorPattern:
        return cls(nbytes)

    @property
    def is_empty(self) -> bool:
        """No flips, no erasures, not lost."""
        return self.flips.size == 0 and not self.erasures and not self.lost

    @property
    def n_flips(self) -> int:
        return int(self.flips.size)

    @property
    def n_erased_bytes(self) -> int:
        """Bytes covered by erasures (any kind, overlaps counted once)."""
        s, e = _union_intervals(self.erasures)
        return int(np.sum(e - s))

    def corrupted_bytes(self) -> IntArray:
        """Sorted unique byte offsets touched by flips or erasures (not by `lost`)."""
        parts = [self.flips >> 3]
        parts.extend(np.arange(s, s + n, dtype=np.int64) for s, n, _ in self.erasures)
        return np.unique(np.concatenate(parts)).astype(np.int64)

    def expected_wrong_bits(self) -> float:
        """Expected number of wrong bits the reader sees when erased or lost bytes read back
        as uniform random bytes (each such bit wrong with probability 1/2). This is the
        quantity whose mean per bit `FaultModel.bit_error_prob` predicts."""
        if self.lost:
            return 4.0 * self.nbytes
        starts, ends = _union_intervals(self.erasures)
        erased = int(np.sum(ends - starts))
        n_out = self.flips.size
        if starts.size and self.flips.size:
            byte = self.flips >> 3
            i = np.searchsorted(starts, byte, side="right") - 1
            inside = (i >= 0) & (byte < ends[np.maximum(i, 0)])
            n_out = int(np.count_nonzero(~inside))
        return float(n_out) + 4.0 * erased

    def apply(self, buf: npt.NDArray[np.uint8], rng: np.random.Generator) -> None:
        """Corrupt `buf` in place: flip every listed bit, then fill every erasure with random
        bytes from `rng`. `lost` is the caller's business (nothing is done for it)."""
        if not isinstance(buf, np.ndarray) or buf.dtype != np.uint8 or buf.ndim != 1:
            raise FaultModelError("apply() needs a 1-D numpy uint8 array")
        if buf.size != self.nbytes:
            raise FaultModelError(
                f"apply(): buffer has {buf.size} bytes, pattern is for {self.nbytes}")
        if self.flips.size:
            byte = self.flips >> 3
            bit = np.left_shift(np.uint8(1), (self.flips & 7).astype(np.uint8))
            first = np.ones(byte.size, dtype=bool)
            first[1:] = byte[1:] != byte[:-1]
            starts = np.flatnonzero(first)
            masks = np.bitwise_or.reduceat(bit, starts)
            buf[byte[starts]] ^= masks
        for s, n, _ in self.erasures:
            buf[s:s + n] = rng.integers(0, 256, size=n, dtype=np.uint8)

    def merge(self, other: ErrorPattern) -> ErrorPattern:
        """Union of two patterns for the same buffer (a bit flipped by both stays wrong)."""
        return ErrorPattern.combine(self.nbytes, (self, other))

    @classmethod
    def combine(cls, nbytes: int, patterns: Iterable[ErrorPattern]) -> ErrorPattern:
        """Union of many patterns. The result is transient only if every non-empty part is."""
        parts = [p for p in patterns if not p.is_empty]
        for p in parts:
            if p.nbytes != nbytes:
                raise FaultModelError(
                    f"cannot merge a pattern for {p.nbytes} bytes into one for {nbytes}")
        if not parts:
            return cls(nbytes)
        if len(parts) == 1:
            return parts[0]
        flips = [p.flips for p in parts if p.flips.size]
        f = np.unique(np.concatenate(flips)) if flips else _empty_flips()
        er = [e for p in parts for e in p.erasures]
        return cls(
            nbytes,
            f,
            tuple(er),
            lost=any(p.lost for p in parts),
            transient=all(p.transient for p in parts),
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (flips as a list of ints)."""
        return {
            "nbytes": self.nbytes,
            "flips": [int(x) for x in self.flips],
            "erasures": [list(e) for e in self.erasures],
            "lost": self.lost,
            "transient": self.transient,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ErrorPattern:
        return cls(
            int(d["nbytes"]),
            np.asarray(d.get("flips", []), dtype=np.int64),
            tuple((int(s), int(n), str(k)) for s, n, k in d.get("erasures", ())),
            lost=bool(d.get("lost", False)),
            transient=bool(d.get("transient", False)),
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ErrorPattern):
            return NotImplemented
        return (
            self.nbytes == other.nbytes
            and np.array_equal(self.flips, other.flips)
            and self.erasures == other.erasures
            and self.lost == other.lost
            and self.transient == other.transient
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        f = self.flips
        shown = ", ".join(str(int(x)) for x in f[:6]) + (", ..." if f.size > 6 else "")
        er = self.erasures[:3]
        more = ", ..." if len(self.erasures) > 3 else ""
        return (
            f"ErrorPattern(nbytes={self.nbytes}, flips[{f.size}]=[{shown}], "
            f"erasures[{len(self.erasures)}]={list(er)}{more}, lost={self.lost}, "
            f"transient={self.transient})"
        )


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
