"""Which fault patterns defeat a protection: the record's layout, byte by byte.

:func:`predict` treats independent bit errors exactly. A clustered event class (a DRAM lane or
row, an NVMe sector, a CXL poisoned line, ...) has a footprint *distribution* and, in DRAM, a
stride, which interleaving can alias: a lane fault that hits every 8th byte puts all its
errors into one codeword of ``rs(255,239,interleave=8)``. So the probability that a class's
events defeat the code is computed here from the class's own patterns: ``draws`` patterns of
the class conditioned on it firing (:meth:`EventClass.draw_nonzero`, so several events of
one class in one record count together), each judged by :func:`is_fatal` against the real
record layout (preludes, three header copies, the payload's decoding units):

* the preludes and the header are lost when all three copies hold an error and some bit is
  wrong in two copies or more (the vote is bitwise);
* ``none``: any wrong payload byte; ``rs``: ``2e + f > n - k`` in some codeword (``e`` wrong
  bytes, ``f`` erased ones; codewords mapped as :mod:`rkv.ecc.rs` lays them out, interleaving
  and the shortened last group included); ``bch``: ``e`` wrong and ``f`` erased bits in a chunk
  with its ecc beyond what the better of the two erasure fills leaves correctable (exact
  when ``2e + f <= 2t``, by a binomial over the erased bits' values otherwise); shard RS: more
  than ``m`` damaged shards or checksum entries, and then more than ``m`` damaged entries or a
  column with ``2e + f > m`` (``f`` of its bytes reported by the medium, ``e`` other wrong
  bytes) (:mod:`rkv.ecc.shardrs`).

A read checks the end-to-end checksum on the systematic data first, so damage that leaves the
data bytes intact (parity, checksum table, one header copy) is never fatal.

A byte the medium cannot return (an erasure: lost sector, poisoned line) is reported by the
medium with its position (:class:`~rkv.errors.MediumError`) and decoded as an erasure; for
the header vote its bits all count as wrong (a bound: the reader zero-fills them). The
estimate has a binomial standard error of at most ``sqrt(f (1 - f) / draws)``; draws use a
fixed seed, so :func:`predict` stays deterministic.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from rkv.codec.pipeline import Pipeline
from rkv.format.record import copy_offsets
from rkv.reliability.protection import as_pipeline, geometry

PRELUDE = 8
#: Patterns drawn per clustered event class.
DRAWS = 2000


@dataclass(frozen=True)
class Layout:
    """Where a record's bytes go, for one protection and block size."""

    kind: str            # detect | rs | bch | shard
    record: int
    hlen: int            # one header copy
    payload_off: int
    payload: int
    data: int            # data bytes before the code's own additions
    params: tuple[int, ...]
    #: The framing copies are spread over sectors (record format v3).
    spread: bool = False
    #: independently decoded parts (byte planes): (their layout, tolerant); the sub-layouts'
    #: ``payload_off`` point into this record. Empty for one code over the whole payload.
    parts: tuple[tuple[Layout, bool], ...] = ()


def layout_for(protection: Any, data_bytes: int) -> Layout:
    """The record's framing (from the record format) and the code's units (from
    :func:`rkv.reliability.protection.geometry`, the one place a codec spec is interpreted)."""
    pipe = as_pipeline(protection) or Pipeline()
    record = pipe.record_bytes_for(data_bytes)
    payload = pipe.codec.encoded_size(data_bytes) if pipe.codec is not None else data_bytes
    off, hlen = pipe.framing(data_bytes)
    spread = pipe.spread(data_bytes)
    parts = pipe.codec.parts(data_bytes) if pipe.codec is not None else None
    if parts is not None:
        subs, at = [], off
        for part in parts:
            sub = layout_for(Pipeline(None, part.codec), part.data_bytes)
            subs.append((Layout(sub.kind, record, hlen, at, sub.payload, sub.data, sub.params),
                         part.tolerant))
            at += sub.payload
        return Layout("parts", record, hlen, off, payload, data_bytes, (), spread, tuple(subs))
    g = geometry(protection, data_bytes)
    params: tuple[int, ...] = ()
    if g.kind == "rs":
        k = g.group // g.interleave
        params = (g.unit_symbols - k, k, g.interleave, g.t)
    elif g.kind == "bch":
        params = (g.group, -(-(g.unit_symbols - 8 * g.group) // 8), g.t)
    elif g.kind == "shard":
        params = (g.unit_symbols - g.t, g.t, g.shard_bytes, g.check_bytes)
    return Layout(g.kind, record, hlen, off, payload, data_bytes, params, spread=spread)


def _masks(pattern: Any, record: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(bit offsets flipped, erased-byte mask, wrong-byte mask) over the record. Masks, not
    sets: a bank fault erases the whole record, and set operations on 200,000 offsets per
    pattern would dominate the estimate."""
    flips = np.asarray(pattern.flips, dtype=np.int64)
    erased = np.zeros(record, dtype=bool)
    for start, n, _ in pattern.erasures:
        erased[max(0, start):min(record, start + n)] = True
    wrong = erased.copy()
    wrong[flips[flips < 8 * record] // 8] = True
    return flips, erased, wrong


def _all_hit(wrong: np.ndarray, starts: tuple[int, ...], size: int) -> bool:
    """Whether every copy has a wrong byte: the cheap test before :func:`_copies_lost`,
    which needs all three hit (most patterns miss a copy, and the bit-level vote costs
    three set operations)."""
    return all(wrong[s:s + size].any() for s in starts)


def _copies_lost(flips: np.ndarray, erased: np.ndarray, starts: tuple[int, ...],
                 size: int) -> bool:
    """Three copies of ``size`` bytes: lost when each has an error and some bit position is
    wrong in two of them (the bitwise vote fails)."""
    sets = []
    for s in starts:
        f = flips[(flips >= 8 * s) & (flips < 8 * (s + size))] - 8 * s
        e = np.flatnonzero(erased[s:s + size])
        bits = np.union1d(f, (e[:, None] * 8 + np.arange(8)).ravel())
        if bits.size == 0:
            return False
        sets.append(bits)
    return bool(np.intersect1d(sets[0], sets[1]).size or np.intersect1d(sets[0], sets[2]).size
                or np.intersect1d(sets[1], sets[2]).size)


def _rs_units(o: np.ndarray, lay: Layout) -> np.ndarray:
    nsym, k, il, _ = lay.params
    size = lay.data
    groups, rem = divmod(size, il * k)
    c = min(il, rem)
    data = o[o < size]
    g, r = np.divmod(data, il * k)
    units = [g * il + r % il]
    par = o[o >= size] - size
    full = groups * il * nsym
    pf, pt = par[par < full], par[par >= full] - full
    units.append((pf // (il * nsym)) * il + (pf % (il * nsym)) % il)
    if c:
        units.append(groups * il + pt % c)
    return np.concatenate(units)


def _bch_fail(e: np.ndarray, f: np.ndarray, t: int) -> float:
    """P(some BCH chunk fails) given its unknown bit errors ``e`` and erased bits ``f``.

    The decoder fills the erasures with zeros and with ones: one fill leaves ``W`` of the
    erased bits wrong, the other ``f - W``, and a chunk is fixed when the better fill has
    at most ``t - e`` wrong erased bits (always when ``2e + f <= 2t``). The bits under an
    erasure are taken as fair coins: ``W ~ Binomial(f, 1/2)``."""
    ok = 1.0
    for ei, fi in zip(e.tolist(), f.tolist(), strict=True):
        room = t - ei
        if room < 0:
            return 1.0
        if 2 * ei + fi <= 2 * t:
            continue
        # P(min(W, f - W) <= room) = P(W <= room) + P(W >= f - room), disjoint here.
        w = np.arange(0, room + 1)
        logc = [math.lgamma(fi + 1) - math.lgamma(x + 1) - math.lgamma(fi - x + 1) for x in w]
        p = 2.0 * float(np.exp(np.array(logc) - fi * math.log(2.0)).sum())
        ok *= min(1.0, p)
    return 1.0 - ok


def is_fatal(lay: Layout, pattern: Any) -> float:
    """P(the read of a record hit by ``pattern`` (an ErrorPattern over the whole record)
    fails): 0 or 1 except for BCH chunks beyond the erasure guarantee, whose outcome depends
    on the erased bits' values."""
    return judge(lay, pattern)[0]


def judge(lay: Layout, pattern: Any) -> tuple[float, float]:
    """(P(the read fails), P(it is degraded | it does not fail)) for a record hit by
    ``pattern``. Only layouts with a tolerant part degrade: the read fails when the header
    or a strict part fails, and is degraded when only tolerant parts fail."""
    if pattern.lost:
        return 1.0, 0.0
    flips, erased, wrong = _masks(pattern, lay.record)
    preludes, headers = copy_offsets(lay.hlen, lay.record, lay.spread)
    if _all_hit(wrong, preludes, PRELUDE) and _copies_lost(flips, erased, preludes, PRELUDE):
        return 1.0, 0.0
    if _all_hit(wrong, headers, lay.hlen) and _copies_lost(flips, erased, headers, lay.hlen):
        return 1.0, 0.0     # (the third copy ends where the last prelude starts)
    if not lay.parts:
        return _payload_fatal(lay, flips, erased, wrong), 0.0
    ok = tol_ok = 1.0
    for sub, tolerant in lay.parts:
        f = _payload_fatal(sub, flips, erased, wrong)
        if tolerant:
            tol_ok *= 1.0 - f
        else:
            ok *= 1.0 - f
    return 1.0 - ok, 1.0 - tol_ok


def _payload_fatal(lay: Layout, flips: np.ndarray, erased: np.ndarray,
                   wrong: np.ndarray) -> float:
    """P(the payload described by ``lay`` fails to decode) under the record's masks."""
    p0 = lay.payload_off
    o = np.flatnonzero(wrong[p0:p0 + lay.payload])
    if o.size == 0 or o[0] >= lay.data:
        return 0.0     # the data comes first: intact data passes the end-to-end checksum
    if lay.kind == "detect":
        return 1.0
    er = erased[p0:p0 + lay.payload]
    oe = o[er[o]]       # erased payload bytes: the medium said where
    ou = o[~er[o]]      # wrong bytes nobody reported
    if lay.kind == "rs":
        nsym = lay.params[0]
        cnt = 2 * np.bincount(_rs_units(ou, lay)) if ou.size else np.zeros(1, np.int64)
        if oe.size:
            ce = np.bincount(_rs_units(oe, lay))
            n = max(cnt.size, ce.size)
            cnt = np.pad(cnt, (0, n - cnt.size)) + np.pad(ce, (0, n - ce.size))
        return float(cnt.max() > nsym)
    if lay.kind == "bch":
        chunk, ecc, t = lay.params

        def unit(b: np.ndarray) -> np.ndarray:
            return np.where(b < lay.data, b // chunk, (b - lay.data) // ecc)

        pf = flips // 8 - p0
        keep = (pf >= 0) & (pf < lay.payload)
        pf = pf[keep]
        pf = pf[~er[pf]]
        nunits = int(unit(np.array([lay.payload - 1]))[0]) + 1
        e = np.bincount(unit(pf), minlength=nunits) if pf.size else np.zeros(nunits, np.int64)
        f = 8 * np.bincount(unit(oe), minlength=nunits) if oe.size else \
            np.zeros(nunits, np.int64)
        hit = (e > 0) | (f > 0)
        return _bch_fail(e[hit], f[hit], t)
    k, m, s, check = lay.params
    nsh = k + m
    in_shards = o[o < nsh * s]
    entries = np.unique((o[o >= nsh * s] - nsh * s) // check)
    damaged = np.union1d(np.unique(in_shards // s), entries)
    if damaged.size <= m:
        return 0.0
    # Checksum entries the medium reported lost (r) cannot be checked; the others that are
    # wrong (u) fail their shards. After column decoding every checkable shard must pass
    # when more than m entries are lost, else k must (rkv.ecc.shardrs): fatal when
    # r + u > m with r <= m, or u > 0 with r > m.
    table = oe[oe >= nsh * s]
    r = int(np.unique((table - nsh * s) // check).size)
    u = int(entries.size) - r
    if (r <= m and r + u > m) or (r > m and u > 0):
        return 1.0
    # Column decoding: in each column, the bytes the medium reported are erasures (f), the
    # other bad bytes errors (e); the column is fixed when 2e + f <= m.
    cost = np.zeros(s, dtype=np.int64)
    ue = ou[ou < nsh * s]
    ee = oe[oe < nsh * s]
    if ue.size:
        cost += 2 * np.bincount(ue % s, minlength=s)
    if ee.size:
        cost += np.bincount(ee % s, minlength=s)
    return float(cost.max() > m)


_CACHE: dict[tuple[str, str, int, float, int, bool], list[tuple[float, float, float]]] = {}
#: Draws per event count beyond the first in the stratified estimate.
STRATUM_DRAWS = 400
#: The stratified estimate drops a class's counts whose P(fire and count) is below this.
STRATUM_TINY = 1e-30
_STRATUM_KMAX = 256


def class_fatality(model: Any, protection: Any, data_bytes: int, hours: float,
                   draws: int = DRAWS, *, stratified: bool = False
                   ) -> list[tuple[Any, float, float]]:
    """Per clustered class: (its rate, P(it fires in the record), P(fatal | it fires)).
    Cached per (model parameters, protection, size, hours, draws, stratified)."""
    return [(o.rate, o.p_fire, o.fatal)
            for o in class_judgements(model, protection, data_bytes, hours, draws,
                                      stratified=stratified)]


def _count_law(cls: Any) -> Iterator[tuple[int, float, float]]:
    """(k, P(K = k | K >= 1), a bound on P(K > k | K >= 1)) for k = 1, 2, ... of a class
    with a Poisson or binomial count law (the tail bound: the next term over one minus the
    following term ratio, the ratios decreasing)."""
    if cls.law == "poisson":
        mu = float(cls.mu)
        lognorm = math.log(-math.expm1(-mu))

        def logp(k: int) -> float:
            return k * math.log(mu) - mu - math.lgamma(k + 1) - lognorm

        def ratio(k: int) -> float:   # p_k / p_(k-1)
            return mu / k
        top = _STRATUM_KMAX
    else:
        n, p = int(cls.units), float(cls.p)
        lognorm = math.log(-math.expm1(n * math.log1p(-p)))

        def logp(k: int) -> float:
            return (math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
                    + k * math.log(p) + (n - k) * math.log1p(-p) - lognorm)

        def ratio(k: int) -> float:
            return (n - k + 1) / k * p / (1.0 - p)
        top = min(n, _STRATUM_KMAX)
    for k in range(1, top + 1):
        nxt = ratio(k + 2) if k + 2 <= top else 0.0
        tail = 0.0 if k >= top else (math.exp(logp(k + 1)) / (1.0 - nxt) if nxt < 1.0
                                     else math.inf)
        yield k, math.exp(logp(k)), tail


def _mean_se(values: list[float]) -> tuple[float, float]:
    """The mean of judged outcomes and its standard error (0 for a constant outcome)."""
    d = len(values)
    mean = math.fsum(values) / d
    var = math.fsum((v - mean) ** 2 for v in values) / max(d - 1, 1)
    return mean, math.sqrt(var / d)


def _one_event_strata(lay: Layout, cls: Any, i: int, draws: int, data_bytes: int,
                      p_one: float) -> tuple[float, float, float]:
    """(P(fatal | one event), P(degraded | one event), the first one's variance) of a class
    whose single event comes in strata (`EventClass.strata`: a lost sector with 0, 1, 2, ...
    clustered neighbours in the record): each stratum judged over its own draws, weighted by
    its exact probability; strata below `STRATUM_TINY` (with ``p_one`` = P(exactly one
    event)) are dropped, and the mass the strata leave out counts as fatal."""
    strata = cls.strata()
    f_acc = g_acc = var = 0.0
    mass = 0.0
    for j, (pj, draw) in enumerate(strata):
        if j and p_one * pj < STRATUM_TINY:
            break
        mass += pj
        d = draws if j == 0 else min(draws, STRATUM_DRAWS)
        rng = np.random.default_rng([i, draws, data_bytes, 1, j])
        judged = [judge(lay, draw(rng)) for _ in range(d)]
        f, se = _mean_se([x for x, _ in judged])
        f_acc += pj * f
        var += (pj * se) ** 2
        g_acc += pj * math.fsum((1 - x) * g for x, g in judged) / d
    return min(1.0, f_acc + max(0.0, 1.0 - mass)), g_acc, var


def _stratified(lay: Layout, cls: Any, i: int, draws: int, data_bytes: int
                ) -> tuple[float, float, float]:
    """(P(fatal | fires), P(degraded | fires), the first one's sampling standard error)
    summed over the class's event count: the
    exact P(K = k | K >= 1) times :func:`judge` over draws of exactly k events, so that
    combinations of several individually correctable events count at their exact (tiny)
    probability instead of as a fraction of ``draws``; counts whose P(fire and count) is
    below `STRATUM_TINY` are dropped, a tail beyond the last count judged counts as fatal."""
    p_fire = -math.expm1(cls.log_p0)
    f_acc = g_acc = var = 0.0
    tail = 0.0
    for k, pk, tail in _count_law(cls):
        if k == 1 and pk > 0.0 and cls.strata is not None:
            f, g, v = _one_event_strata(lay, cls, i, draws, data_bytes, p_fire * pk)
            f_acc += pk * f
            g_acc += pk * g
            var += pk * pk * v
        elif pk > 0.0 and (k == 1 or p_fire * pk >= STRATUM_TINY):
            d = draws if k == 1 else min(draws, STRATUM_DRAWS)
            rng = np.random.default_rng([i, draws, data_bytes, k])
            judged = [judge(lay, cls.realize(k, rng)) for _ in range(d)]
            f, se = _mean_se([x for x, _ in judged])
            f_acc += pk * f
            var += (pk * se) ** 2
            g_acc += pk * math.fsum((1 - x) * g for x, g in judged) / d
        if p_fire * tail < STRATUM_TINY or tail <= 1e-9 * f_acc:
            tail = 0.0
            break
    return min(1.0, f_acc + tail), min(1.0, g_acc), math.sqrt(var)


def fatal_at_count(model: Any, protection: Any, data_bytes: int, hours: float, index: int,
                   k: int, draws: int = STRATUM_DRAWS) -> float:
    """P(fatal | exactly ``k`` events) of event class ``index`` (in ``event_classes`` order),
    from ``draws`` judged realizations (deterministic seed); 0 for a class without a
    realization of a given count."""
    lay = layout_for(protection, data_bytes)
    cls = model.event_classes(lay.record, hours)[index]
    if cls.realize is None:
        return 0.0
    rng = np.random.default_rng([index, draws, data_bytes, k, 7])
    return math.fsum(judge(lay, cls.realize(k, rng))[0] for _ in range(draws)) / draws


@dataclass(frozen=True)
class ClassOutcome:
    """One clustered class judged against a record: its rate, P(it fires in the record),
    P(fatal | it fires), P(degraded | it fires), and the sampling standard error of the
    fatal share (the judged draws' own; 0 when every draw agreed)."""

    rate: Any
    p_fire: float
    fatal: float
    degraded: float
    fatal_se: float


def class_judgements(model: Any, protection: Any, data_bytes: int, hours: float,
                     draws: int = DRAWS, *, stratified: bool = False) -> list[ClassOutcome]:
    """Every clustered class of ``model`` judged by :func:`judge` over ``draws`` of its own
    patterns. ``stratified``: per event count instead (:func:`_stratified`, for classes with
    a known count law), exact for rare combinations of several events (what a refresh
    schedule needs)."""
    lay = layout_for(protection, data_bytes)
    classes = [(i, c) for i, c in enumerate(model.event_classes(lay.record, hours))
               if c.rate.kind != "bit" and c.log_p0 != 0.0]
    spec = protection if isinstance(protection, str) else protection.spec
    key = (json.dumps(model.params(), sort_keys=True, default=str), spec, data_bytes,
           float(hours), draws, stratified)
    fatal = _CACHE.get(key)
    if fatal is None:
        fatal = []
        for i, cls in classes:
            if (stratified and cls.law is not None and cls.realize is not None
                    and cls.log_p0 > -math.inf):
                fatal.append(_stratified(lay, cls, i, draws, data_bytes))
                continue
            rng = np.random.default_rng([i, draws, data_bytes])
            judged = [judge(lay, cls.draw_nonzero(rng)) for _ in range(draws)]
            f, se = _mean_se([d for d, _ in judged])
            fatal.append((f, math.fsum((1 - d) * g for d, g in judged) / draws, se))
        if len(_CACHE) >= 256:
            _CACHE.clear()
        _CACHE[key] = fatal
    return [ClassOutcome(c.rate, -math.expm1(c.log_p0), f, g, se)
            for (_, c), (f, g, se) in zip(classes, fatal, strict=True)]
