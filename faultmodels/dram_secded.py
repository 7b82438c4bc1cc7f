"""Multi-bit DRAM faults behind a SEC-DED memory controller (internal to `faultmodels.dram`):
each fault is detected (its 64-byte lines are poisoned) or silent (undetected or miscorrected),
lane by lane with the exact fractions of the Hsiao code in :mod:`faultmodels.wordecc`.

A fault's wrong bits are the same in every word it touches (the FaultSim convention the DRAM
model follows), so the decoder does the same thing in every one of them: a silent fault leaves
its wrong bits, plus the bit the decoder flips on a miscorrection, in every word it touches.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

import faultmodels.wordecc as wordecc

from ._dist import IntArray
from ._dram_geom import _Cls, _hit_origin, _hits, _in_range, _line_erasures, lane_counts
from .base import ErrorPattern, EventClass, EventRate, poisson_class

__all__ = ["DramBus", "lanes", "secded_classes"]


class DramBus(Protocol):
    """What the split reads of the DRAM model (a `DramModel` is one): its bus word and
    poison line geometry."""

    @property
    def bus_bits(self) -> int: ...
    @property
    def device_width(self) -> int: ...
    @property
    def word_bytes(self) -> int: ...
    @property
    def poison_bytes(self) -> int: ...



def lanes(m: DramBus, c: _Cls, n: int) -> tuple[wordecc.LaneOutcomes, IntArray, IntArray, int]:
    """The Hsiao outcome table of a class, the bytes of each byte lane in [0, n), the
    origins of each lane whose positions touch [0, n), and the stride in words."""
    wb = m.word_bytes
    lo = wordecc.lane_outcomes(m.bus_bits, m.device_width, c.bits)
    sw = max(1, c.stride // wb)
    nl = lane_counts(n, wb)
    hits = np.array([_hits(int(x), c.count, sw) if x > 0 else 0 for x in nl.tolist()],
                    dtype=np.int64)
    return lo, nl, hits, sw

def secded_classes(m: DramBus, c: _Cls, n: int, h: float) -> list[EventClass]:
    """A multi-bit fault under SEC-DED: detected (poisoned lines) or silent (undetected or
    miscorrected: its wrong bits plus the decoder's flip in every word it touches), split
    lane by lane with the exact fractions of the Hsiao code (`faultmodels.wordecc`)."""
    wb, pb = m.word_bytes, m.poison_bytes
    lo, nl, hits, sw = lanes(m, c, n)
    f = lo.silent_fraction()
    full, rest = divmod(n, pb)
    rl = lane_counts(rest, wb)
    covered = np.array([
        full * pb * _hits(pb // wb, c.count, sw)
        + (rest * _hits(int(rl[i]), c.count, sw) if rest and rl[i] else 0)
        for i in range(wb)], dtype=np.float64)
    g = np.array(lo.wrong_bits)
    tag = f"{c.mode}, {'transient' if c.transient else 'permanent'}"
    out: list[EventClass] = []
    for silent in (False, True):
        w = (f if silent else 1.0 - f) * hits
        tot = float(w.sum())
        if tot <= 0.0:
            continue
        if silent:
            bpe = float(np.sum(f * c.count * nl * g)) / tot
            label = f"{tag} (SEC-DED miscorrected or undetected: silent)"
        else:
            bpe = 4.0 * float(np.sum((1.0 - f) * covered)) / tot
            label = f"{tag} (uncorrectable, poisoned)"
        rate = EventRate(c.kind, c.rate * h * tot, c.span, bpe, transient=False,
                         detected=not silent, label=label)
        lane_p = w / tot

        def realize(k: int, rng: np.random.Generator, silent: bool = silent,
                    lane_p: np.ndarray = lane_p) -> ErrorPattern:
            return _realize(m, c, n, k, rng, silent, lane_p, lo, nl, sw)

        out.append(poisson_class(rate, realize))
    return out

def _realize(m: DramBus, c: _Cls, n: int, k: int, rng: np.random.Generator, silent: bool,
                    lane_p: np.ndarray, lo: wordecc.LaneOutcomes, nl: IntArray,
                    sw: int) -> ErrorPattern:
    wb, pb = m.word_bytes, m.poison_bytes
    flips: list[IntArray] = []
    erasures: list[tuple[int, int, str]] = []
    for lane in rng.choice(wb, size=k, p=lane_p).tolist():
        o = _hit_origin(c.count, sw, int(nl[lane]), rng)
        klo, khi = _in_range(o, c.count, sw, int(nl[lane]))
        words = o + sw * np.arange(klo, khi + 1, dtype=np.int64)
        if not silent:
            byts = words * wb + lane
            if sw * wb <= pb:  # the touched lines form one run
                a = (int(byts[0]) // pb) * pb
                b = min((int(byts[-1]) // pb + 1) * pb, n)
                erasures.append((a, b - a, "poison"))
            else:
                erasures.extend(_line_erasures(byts, pb, n))
            continue
        masks = lo.masks[lane]
        mask, extra = masks[int(rng.integers(masks.shape[0]))].tolist()
        bits = np.flatnonzero((mask >> np.arange(8)) & 1).astype(np.int64)
        pos = [((words * wb + lane) * 8)[:, None] + bits[None, :]]
        if extra >= 0:
            pos.append((words * wb * 8 + extra)[:, None])
        allpos = np.concatenate([x.ravel() for x in pos])
        vals, cnt = np.unique(allpos, return_counts=True)
        vals = vals[(cnt % 2 == 1) & (vals < 8 * n)]  # the decoder's flip may undo one
        flips.append(vals)
    fl = np.concatenate(flips) if flips else np.empty(0, np.int64)
    return ErrorPattern(n, fl, tuple(erasures))
