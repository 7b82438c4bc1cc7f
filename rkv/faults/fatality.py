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
* ``none``: any wrong payload byte; ``rs``: more than ``t`` wrong bytes in some codeword
  (codewords mapped as :mod:`rkv.ecc.rs` lays them out, interleaving and the shortened last
  group included); ``bch``: more than ``t`` wrong bits in some chunk with its ecc; shard RS:
  more than ``m`` damaged shards or checksum entries, and a column with more than ``m // 2``
  bad bytes or more than ``m`` damaged entries (:mod:`rkv.ecc.shardrs`).

A read checks the end-to-end checksum on the systematic data first, so damage that leaves the
data bytes intact (parity, checksum table, one header copy) is never fatal.

A byte the medium cannot return (an erasure: lost sector, poisoned line) is read as garbage by
rkv today, so it counts as a wrong byte (its bits as wrong for the header vote, half of them for
BCH). The estimate has a binomial standard error of ``sqrt(f (1 - f) / draws)``; draws use a
fixed seed, so :func:`predict` stays deterministic.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from rkv.blockcodec import codec_for, record_framing, record_size
from rkv.record import RecordHeader

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


def layout_for(protection: str, data_bytes: int) -> Layout:
    """The record's framing (from the record format) and the code's units (from
    :func:`rkv.faults.reliability.geometry`, the one place a codec spec is interpreted)."""
    from rkv.faults.reliability import geometry

    codec = codec_for(protection)
    header = RecordHeader(key=bytes(32), layer=0, fingerprint=bytes(16), shape=(2, 1, 1, 1),
                          dtype="float16", data_len=0, payload_len=0)
    record = record_size(header, data_bytes, codec)
    payload = codec.encoded_size(data_bytes) if codec is not None else data_bytes
    off, hlen = record_framing(header, data_bytes, codec)
    g = geometry(protection, data_bytes)
    params: tuple[int, ...] = ()
    if g.kind == "rs":
        k = g.group // g.interleave
        params = (g.unit_symbols - k, k, g.interleave, g.t)
    elif g.kind == "bch":
        params = (g.group, -(-(g.unit_symbols - 8 * g.group) // 8), g.t)
    elif g.kind == "shard":
        params = (g.unit_symbols - g.t, g.t, g.shard_bytes, g.check_bytes)
    return Layout(g.kind, record, hlen, off, payload, data_bytes, params)


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


def is_fatal(lay: Layout, pattern: Any) -> bool:
    """Whether ``pattern`` (an ErrorPattern over the whole record) makes the read fail."""
    if pattern.lost:
        return True
    flips, erased, wrong = _masks(pattern, lay.record)
    last = lay.record - PRELUDE
    if _copies_lost(flips, erased, (0, PRELUDE, last), PRELUDE):
        return True
    h = lay.hlen
    if _copies_lost(flips, erased, (2 * PRELUDE, 2 * PRELUDE + h, last - h), h):
        return True     # (the third copy ends where the last prelude starts)
    p0 = lay.payload_off
    o = np.flatnonzero(wrong[p0:p0 + lay.payload])
    if o.size == 0 or o[0] >= lay.data:
        return False    # the data comes first: intact data passes the end-to-end checksum
    if lay.kind == "detect":
        return True
    if lay.kind == "rs":
        return bool(np.bincount(_rs_units(o, lay)).max() > lay.params[3])
    if lay.kind == "bch":
        chunk, ecc, t = lay.params
        pf = flips // 8 - p0
        pf = pf[(pf >= 0) & (pf < lay.payload)]
        pe = np.flatnonzero(erased[p0:p0 + lay.payload])

        def unit(b: np.ndarray) -> np.ndarray:
            return np.where(b < lay.data, b // chunk, (b - lay.data) // ecc)

        bits = np.bincount(unit(pf)).astype(float) if pf.size else np.zeros(1)
        if pe.size:
            garbage = 4.0 * np.bincount(unit(pe))
            n = max(bits.size, garbage.size)
            bits = np.pad(bits, (0, n - bits.size)) + np.pad(garbage, (0, n - garbage.size))
        return bool(bits.max() > t)
    k, m, s, check = lay.params
    nsh = k + m
    in_shards = o[o < nsh * s]
    entries = np.unique((o[o >= nsh * s] - nsh * s) // check)
    damaged = np.union1d(np.unique(in_shards // s), entries)
    if damaged.size <= m:
        return False
    col_fail = in_shards.size > 0 and np.bincount(in_shards % s).max() > m // 2
    return bool(col_fail or entries.size > m)


_CACHE: dict[tuple[str, str, int, float, int], list[float]] = {}


def class_fatality(model: Any, protection: str, data_bytes: int, hours: float,
                   draws: int = DRAWS) -> list[tuple[Any, float, float]]:
    """Per clustered class: (its rate, P(it fires in the record), P(fatal | it fires)).
    Cached per (model parameters, protection, size, hours, draws)."""
    lay = layout_for(protection, data_bytes)
    classes = [(i, c) for i, c in enumerate(model.event_classes(lay.record, hours))
               if c.rate.kind != "bit" and c.log_p0 != 0.0]
    key = (json.dumps(model.params(), sort_keys=True, default=str), protection, data_bytes,
           float(hours), draws)
    fatal = _CACHE.get(key)
    if fatal is None:
        fatal = []
        for i, cls in classes:
            rng = np.random.default_rng([i, draws, data_bytes])
            hits = sum(is_fatal(lay, cls.draw_nonzero(rng)) for _ in range(draws))
            fatal.append(hits / draws)
        if len(_CACHE) >= 256:
            _CACHE.clear()
        _CACHE[key] = fatal
    return [(c.rate, -math.expm1(c.log_p0), f) for (_, c), f in zip(classes, fatal, strict=True)]
