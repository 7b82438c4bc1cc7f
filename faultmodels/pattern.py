"""Error patterns: the concrete errors a reader sees in one buffer (ground truth of a draw)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from .checks import check_nbytes
from .errors import FaultModelError

EVENT_KINDS = frozenset(
    {"bit", "word", "column", "row", "bank", "burst", "sector", "poison", "region", "link",
     "silent"}
)
ERASURE_KINDS = frozenset({"sector", "poison"})

IntArray = npt.NDArray[np.int64]



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
