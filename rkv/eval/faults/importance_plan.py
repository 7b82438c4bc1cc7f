"""Choosing an importance-sampling plan (:class:`~rkv.eval.faults.importance.TiltPlan`) for a
fault model, protection, record and residency: ``tilt = "auto"`` (:func:`auto_plan`) or one
factor for every class (:func:`uniform_plan`). docs/rare-events.md says why each part is there.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from faultmodels.base import EventClass
from rkv.eval.faults.importance import ALPHA, TiltPlan, _is_bit_class
from rkv.eval.faults.importance_shard import ShardPlant
from rkv.format.record import copy_offsets
from rkv.reliability.fatality import class_fatality, fatal_at_count, judge, layout_for
from rkv.reliability.protection import RAW

#: The share of planted framing patterns that are two bits (harmless, if the decoder tries
#: every copy: the campaign checks it).
PAIR_SHARE = 0.25
#: Event counts tried for a class that is never fatal alone (lost sector pairs, triples).
COMBO_COUNTS = (2, 3)


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
      of the time (``rkv.reliability.fatality.class_fatality``): its count tilted to one event per
      record on average, so that combinations of events are drawn; classes that are fatal on
      their own are left to the conditional half of the mixture. When some class is fatal
      alone sometimes, classes never fatal alone are not tilted (they would only add
      second-order combinations and weight variance).
    * Shares: ``alpha = 0.5`` with one other part (tilt, header planting, shard planting),
      ``0.25`` with two or more; the rest split evenly.
    * Nothing to tilt (``none``, ``raw``, or every class fatal on its own): ``alpha = 1``,
      plain conditional sampling.
    """

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
    alone = math.fsum(p * f for _, p, f in judged)      # what single events lose
    strata: tuple[int, int] = (-1, 0)
    for i, (_, _, f) in zip(idx, judged, strict=True):
        c = classes[i]
        mean = c.mu if c.law == "poisson" else c.units * c.p
        first = _fatal_stratum(lay, c, i) if c.strata is not None and c.law == "poisson" \
            and strata[0] < 0 else 0
        if first:
            strata = (i, first)
            notes.append(f"{c.rate.kind} ({c.rate.label or i}): one event planted with "
                         f"{first} or more of its cluster in the record")
        if single and f == 0.0 and c.law is not None and 0.0 < mean < 1.0:
            # Never fatal alone, but perhaps as a pair or triple (lost sectors in three
            # shards): its own tilt to that count, a component of its own.
            for k in COMBO_COUNTS:
                # (pairs rarer than a thousandth of what single events lose are not worth
                # a share of the draws)
                if mean ** k / math.factorial(k) < 1e-3 * alone:
                    break
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
    parts = int(tilt) + int(bool(plant)) + int(bool(shard)) + int(strata[0] >= 0)
    if not parts:
        return TiltPlan(1.0, tuple(factors), note="nothing rare to tilt: conditional sampling")
    alpha = ALPHA if parts == 1 else ALPHA / 2
    share = (1.0 - alpha) / parts
    return TiltPlan(alpha, tuple(factors), window_class, window_p, windows, plant,
                    lay.hlen if plant else 0, share if plant else 0.0, shard,
                    share if shard else 0.0, "; ".join(notes), prelude,
                    PAIR_SHARE if plant else 0.0, tuple(extra), strata[0], strata[1],
                    share if strata[0] >= 0 else 0.0)


def _fatal_stratum(lay: Any, c: EventClass, i: int, draws: int = 200, most: int = 4) -> int:
    """The first stratum (1 .. ``most``) of a class's single event in which some of
    ``draws`` judged patterns lose the block; 0 if none (or stratum 0 already does)."""
    assert c.strata is not None
    strata = c.strata()
    for j, (_, draw) in enumerate(strata[:most + 1]):
        rng = np.random.default_rng([i, j, draws])
        if any(judge(lay, draw(rng))[0] > 0.0 for _ in range(draws)):
            return j
    return 0
