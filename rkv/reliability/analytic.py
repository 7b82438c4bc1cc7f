"""Analytic reliability of one stored block: P(corrected), P(DUE), P(SDC).

For a protection (a codec spec, ``"none"`` for rkv's end-to-end checksum alone, or ``"raw"``
for what peers store: the bare data with no header and no checksum), a block of ``data_bytes``,
a fault model and a residency time, :func:`predict` combines

* the model's independent background bit errors (its ``"bit"`` event class) through the exact
  binomial tail per decoding unit (Reed-Solomon codeword, BCH chunk, shard), computed in log
  space so that probabilities down to 1e-300 stay accurate;
* every clustered event class (word, row, burst, sector, poison, region, ...) by the fraction
  of its patterns that defeat the protection, judged against the real record layout from the
  class's own footprint distribution (:mod:`rkv.reliability.fatality`: strides that alias with
  interleaving, several sectors in one record, damage that spares the data bytes).

Approximations (stated so that a campaign can check them): combinations of several
individually correctable events in one unit are ignored (second order in the event rate); a
shard code fails only if more than ``m`` shards fail their checksums (data or checksum entry)
*and* column decoding fails: some byte column holds more than ``m // 2`` errors (the failing
column's shards count towards the ``m``), or more than ``m`` checksum entries are damaged; the
record's header is lost only if all three copies are hit and a bit position is wrong in two of
them (the vote is bitwise; for background bits), or if one event spans the whole record.

Erasures: bytes the medium reports unreadable (lost sectors, poisoned lines) reach the
decoders with their positions, so a codeword survives ``2e + f <= n - k`` (``e`` wrong bytes,
``f`` erased); the raw baseline sees the same report as a failed read (a DUE).

SDC: rkv checks every block against an xxh3_128 of its data, so a wrong block can only pass if
the decoder miscorrects *and* the checksum collides: ``p_sdc <= p_due * 2**-128``.
``p_sdc_unchecked`` is what the decoder alone would return wrong (no end-to-end checksum), the
risk of systems that trust their ECC: losses the medium reported are excluded (a decoder
handed too many erasures says so). For ``raw`` it is every error the medium did not report.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from rkv.codec.pipeline import Pipeline
from rkv.ecc.base import Part, Units
from rkv.errors import ConfigError
from rkv.format.record import PRELUDE_BYTES
from rkv.reliability.fatality import class_judgements, layout_for
from rkv.reliability.protection import Protection, as_pipeline, geometry

#: Collision probability of the end-to-end checksum (xxh3_128) for a wrong block.
CHECKSUM_MISS = 2.0 ** -128


@dataclass(frozen=True)
class Prediction:
    """Per-block outcome probabilities for one residency."""

    protection: str
    record_bytes: int
    p_error: float            # any fault touched the stored bytes
    p_corrected: float        # faults, all within capability: exact data back
    p_due: float              # detected, uncorrectable (a recompute)
    p_sdc: float              # wrong data returned without complaint
    p_sdc_unchecked: float    # ... if there were no end-to-end checksum
    p_degraded: float = 0.0   # a tolerant part failed, the rest verified: bounded noise
    #: The standard error of ``p_due`` from judging sampled patterns of clustered classes
    #: (:func:`rkv.reliability.fatality.class_judgements`); 0 where every term is exact.
    p_due_se: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_Geometry = Units


def _log1m(x: float) -> float:
    """log(1 - x), -inf for x >= 1 (a certain loss; 1.0 - 1e-300 rounds to 1.0)."""
    return math.log1p(-x) if x < 1.0 else -math.inf


def _log_binom_tail(n: int, q: float, t: int) -> float:
    """log P(Binomial(n, q) > t), accurate for tiny q."""
    if q <= 0.0 or t >= n:
        return -math.inf
    if q >= 1.0:
        return 0.0
    j = np.arange(t + 1, n + 1, dtype=np.float64)
    lg = np.vectorize(math.lgamma)
    terms = (math.lgamma(n + 1) - lg(j + 1) - lg(n - j + 1)
             + j * math.log(q) + (n - j) * math.log1p(-q))
    top = float(terms.max())
    return top + math.log(float(np.exp(terms - top).sum()))


def _log_unit_ok(symbols: int, q: float, t: int) -> float:
    """log P(a unit of ``symbols`` symbols with symbol error probability q decodes)."""
    lt = _log_binom_tail(symbols, q, t)
    fail = math.exp(lt) if lt > -700 else 0.0
    return _log1m(fail)


def _shard_fail(g: _Geometry, p_bit: float) -> float:
    """P(shard RS loses a block) under independent bit errors of probability ``p_bit``.

    The erasure path rebuilds up to m shards that fail their checksums (data or checksum
    entry damaged), so a loss needs more than m of them, and then column decoding must fail
    too: some byte column with more than m // 2 bad bytes, or more than m damaged checksum
    entries (fewer than k shards pass after decoding). A failing column already accounts for
    m // 2 + 1 damaged shards; the rest must come from the others.
    """
    nsh, m = g.unit_symbols, g.t
    qb = -math.expm1(8 * math.log1p(-p_bit))
    lt_col = _log_binom_tail(nsh, qb, m // 2)
    col_fail = -math.expm1(g.shard_bytes * _log1m(math.exp(lt_col)))
    in_col = m // 2 + 1
    q_shard = -math.expm1(8 * (g.shard_bytes + g.check_bytes) * math.log1p(-p_bit))
    others = math.exp(_log_binom_tail(nsh - in_col, q_shard, m - in_col)) \
        if m >= in_col else 1.0
    q_check = -math.expm1(8 * g.check_bytes * math.log1p(-p_bit))
    checks = math.exp(_log_binom_tail(nsh, q_check, m))
    # Either way loses the block; the two are nearly independent (columns vs. the table).
    # a + b - ab, not 1 - (1 - a)(1 - b), which loses everything below 1e-16.
    a = min(1.0, col_fail * others)
    return a + checks - a * checks


def _log_bits_ok(g: Units, payload: int, p_bit: float) -> float:
    """log P(independent bit errors at ``p_bit`` stay within the code's units)."""
    if g.kind == "detect":
        return 8 * payload * math.log1p(-p_bit)
    if g.kind == "shard":
        return _log1m(_shard_fail(g, p_bit))
    q = p_bit if g.kind == "bch" else -math.expm1(8 * math.log1p(-p_bit))
    full = g.units - g.short_units
    out = full * _log_unit_ok(g.unit_symbols, q, g.t)
    if g.short_units:
        out += g.short_units * _log_unit_ok(g.last_symbols, q, g.t)
    return out


def _log_copies_ok(copy_bytes: int, p_bit: float) -> float:
    """log P(three voted copies of ``copy_bytes`` bytes survive independent bit errors).

    The decoder tries each copy and then the bitwise vote (docs/format.md), so the copies are
    lost exactly when every copy holds an error and some bit position is wrong in two copies
    or more. With ``N`` bits per copy, ``P(lost) = P(all hit) - P(all hit, no position wrong
    twice)``; the second term is ``a^N sum_{j >= 3} C(N, j) x^j S(j)`` with ``a = (1 - p)^3``,
    ``x = p / (1 - p)`` and ``S(j) = 3^j - 3 2^j + 3`` the ways to spread ``j`` single-copy
    errors so that every copy gets one (each position is clean or wrong in exactly one copy).
    Every term is positive, so the sum keeps its digits however small ``p`` is; the difference
    loses about ``log10(N)`` of them."""
    if not copy_bytes or p_bit <= 0.0:
        return 0.0
    n = 8 * copy_bytes
    log_hit = math.log(-math.expm1(n * math.log1p(-p_bit))) if p_bit < 1.0 else 0.0
    all_hit = math.exp(3 * log_hit)
    if p_bit >= 0.5:
        return _log1m(all_hit)      # (not a regime a stored record meets; keep it finite)
    j = np.arange(3, n + 1, dtype=np.float64)
    lg = np.vectorize(math.lgamma)
    log_surj = j * math.log(3.0) + np.log1p(-3.0 * (2.0 / 3.0) ** j + 3.0 * 3.0 ** -j)
    terms = (math.lgamma(n + 1) - lg(j + 1) - lg(n - j + 1) + j * math.log(p_bit / (1 - p_bit))
             + log_surj + 3 * n * math.log1p(-p_bit))
    top = float(terms.max())
    spread = math.exp(top + math.log(float(np.exp(terms - top).sum())))
    return _log1m(max(0.0, all_hit - spread))


def _log_framing_ok(header_copy: int, p_bit: float) -> float:
    """log P(the record's framing survives independent bit errors): the three header
    copies and, independently (disjoint bytes), the three 8-byte preludes."""
    if not header_copy:
        return 0.0
    return _log_copies_ok(header_copy, p_bit) + _log_copies_ok(PRELUDE_BYTES, p_bit)


def _events(model: Any, nbytes: int, hours: float) -> list[Any]:
    return list(model.events(nbytes, hours))


def predict(protection: Protection, data_bytes: int, model: Any, hours: float, *,
            ber_multiplier: float = 1.0, exact_counts: bool = True) -> Prediction:
    """Outcome probabilities for one block stored under ``protection`` (a codec spec,
    ``"none"``, ``"raw"``, or a :class:`~rkv.codec.pipeline.Pipeline`) for ``hours``: a pure
    function of the pipeline, the block's data bytes (after any quantizer), the fault model
    and the residency. ``ber_multiplier`` judges the accelerated model
    (:func:`faultmodels.accelerate`), as a campaign with that multiplier injects it.
    ``exact_counts`` (the default): judge each clustered class per event count with the
    exact count law (:func:`rkv.reliability.fatality.class_judgements` ``stratified``), so that
    several individually correctable events of one class (three lost sectors against a
    two-parity shard code) count at their exact probability however rare; off, they count
    as a fraction of the sampled draws and can round to 0 (10-20 % faster). ``p_due_se``
    of the result is the standard error that judging sampled patterns leaves."""
    if data_bytes <= 0:
        raise ConfigError("data_bytes must be positive")
    if isinstance(ber_multiplier, bool) or ber_multiplier != 1.0:
        import faultmodels

        try:
            model = faultmodels.accelerate(model, ber_multiplier)
        except faultmodels.FaultModelError as exc:
            raise ConfigError(str(exc)) from exc
    pipe = as_pipeline(protection)
    parts = pipe.codec.parts(data_bytes) if pipe is not None and pipe.codec else None
    if parts is not None:
        assert pipe is not None
        return _predict_parts(pipe, parts, data_bytes, model, hours, exact_counts)
    g = geometry(protection, data_bytes)
    if g.kind == "raw":
        record, payload, header_copy = data_bytes, data_bytes, 0
    else:
        # The record's real framing (the payload is 64-byte aligned, so the header copies
        # are not simply a third of what is not payload).
        lay = layout_for(protection, data_bytes)
        record, payload, header_copy = lay.record, lay.payload, lay.hlen
    p_error = float(model.p_any_error(record, hours))
    log_ok = 0.0          # log P(no fatal event and background within capability)
    log_undetected = 0.0  # raw: log P(no undetected error)
    log_reported = 0.0    # log P(no fatal event the medium reports)
    var = 0.0             # of p_due, from sampled class judgements
    p_bit = 0.0
    for ev in _events(model, record, hours):
        kind = str(getattr(ev, "kind", "bit"))
        mean = float(getattr(ev, "mean", 0.0))
        if mean <= 0:
            continue
        if kind == "bit":
            p_bit += mean / (8 * record)
            continue
        if g.kind == "raw":
            if kind == "region" or bool(getattr(ev, "detected", False)):
                log_ok -= mean
            else:
                log_undetected -= mean
    if g.kind != "raw":
        # Clustered classes: judged by their own footprint distribution against the record's
        # layout (rkv.reliability.fatality), so strides that alias with interleaving, several
        # sectors in one record and damage that spares the data bytes all count as they are.
        for o in class_judgements(model, protection, data_bytes, hours,
                                  stratified=exact_counts):
            rate, p_fire, fatal = o.rate, o.p_fire, o.fatal
            log_ok += _log1m(p_fire * fatal)
            var += (p_fire * o.fatal_se) ** 2
            if bool(getattr(rate, "detected", False)):
                # The medium reports these (erasures): a decoder given more erasures than it
                # can rebuild says so, it cannot return a wrong word from them.
                log_reported += _log1m(p_fire * fatal)
    # Background independent bit errors, exactly per decoding unit.
    if p_bit > 0:
        if g.kind == "raw":
            log_undetected += 8 * payload * math.log1p(-p_bit)
        else:
            log_ok += _log_bits_ok(g, payload, p_bit) + _log_framing_ok(header_copy, p_bit)
    if g.kind == "raw":
        p_due = -math.expm1(log_ok)
        p_sdc = -math.expm1(log_undetected) * (1 - p_due)
        p_corrected = 0.0
        unchecked = p_sdc
    else:
        # Whatever is not fatal is corrected: by the code, or by the header vote for faults
        # that only touch one header copy.
        p_due = min(p_error, -math.expm1(log_ok))
        p_sdc = p_due * CHECKSUM_MISS
        p_corrected = max(0.0, p_error - p_due)
        # Only losses the medium did not report can come back miscorrected without a check.
        unchecked = max(0.0, -math.expm1(log_ok - log_reported)) * g.miss
    name = protection if isinstance(protection, str) else protection.spec
    e, c, d, s, u = (v if v > 0 else 0.0 for v in (p_error, p_corrected, p_due, p_sdc,
                                                   unchecked))
    return Prediction(name, record, e, c, d, s, u, p_due_se=math.sqrt(var))


def _predict_parts(pipe: Pipeline, parts: tuple[Part, ...], data_bytes: int, model: Any,
                   hours: float, exact_counts: bool = True) -> Prediction:
    """A layout of independently decoded parts (byte planes) in one record: background bits
    per part through its own units; clustered classes judged against the whole record
    (:func:`rkv.reliability.fatality.judge`), so an event that spans two parts fails both at once.
    The read fails when the header or a strict part fails; it is degraded when only tolerant
    parts fail."""
    lay = layout_for(pipe, data_bytes)
    record = lay.record
    p_error = float(model.p_any_error(record, hours))
    p_bit = sum(float(getattr(ev, "mean", 0.0)) for ev in _events(model, record, hours)
                if str(getattr(ev, "kind", "bit")) == "bit") / (8 * record)
    log_strict = log_tol = log_reported = var = 0.0
    for o in class_judgements(model, pipe, data_bytes, hours, stratified=exact_counts):
        rate, p_fire, fatal, degrade = o.rate, o.p_fire, o.fatal, o.degraded
        var += (p_fire * o.fatal_se) ** 2
        log_strict += _log1m(p_fire * fatal)
        log_tol += _log1m(p_fire * degrade)
        if bool(getattr(rate, "detected", False)):
            log_reported += _log1m(p_fire * fatal)
    units = [geometry(Pipeline(None, p.codec), p.data_bytes) for p in parts]
    if p_bit > 0:
        for (sub, tolerant), g in zip(lay.parts, units, strict=True):
            term = _log_bits_ok(g, sub.payload, p_bit)
            if tolerant:
                log_tol += term
            else:
                log_strict += term
        log_strict += _log_framing_ok(lay.hlen, p_bit)
    p_due = min(p_error, -math.expm1(log_strict))
    p_degraded = max(0.0, math.exp(log_strict) * -math.expm1(log_tol))
    # Each part has its own checksum: a miscorrected part passes only by a collision.
    p_sdc = (p_due + p_degraded) * CHECKSUM_MISS
    miss_strict = max(g.miss for (_, tol), g in zip(lay.parts, units, strict=True) if not tol)
    miss_tol = max([g.miss for (_, tol), g in zip(lay.parts, units, strict=True) if tol],
                   default=0.0)
    unchecked = min(1.0, max(0.0, -math.expm1(log_strict - log_reported)) * miss_strict
                    + p_degraded * miss_tol)
    p_corrected = max(0.0, p_error - p_due - p_degraded)
    return Prediction(pipe.spec, record, p_error, p_corrected, p_due, p_sdc, unchecked,
                      p_degraded, math.sqrt(var))
