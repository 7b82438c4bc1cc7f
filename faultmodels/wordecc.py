"""What a memory controller's word ECC and an SSD's BCH decoder do with errors beyond their
correction capability: detection or miscorrection (silent data corruption).

SEC-DED (Hsiao code). A Hsiao code (M. Y. Hsiao, "A class of optimal minimum odd-weight-column
SEC-DED codes", IBM J. Res. Dev. 14(4), 1970) has a parity-check matrix H whose columns are
distinct and of odd weight, with as few ones as possible and equal row weights. The decoder
computes the syndrome s = H e of the error e: s = 0 -> accept; s equal to column j -> flip bit
j ("correct"); any other s -> detected uncorrectable (the controller poisons the line). So:

* 1 wrong bit: corrected. 2 wrong bits: s is a sum of two odd columns, even and non-zero:
  always detected.
* odd weight >= 3: s is odd; if it equals a column the decoder flips one more bit and returns
  wrong data silently (miscorrection), otherwise the error is detected.
* even weight >= 4: s is even, never a column: undetected (silent) if s = 0, else detected.

Construction used here (documented, deterministic): with r check bits, the data columns are
whole rotation orbits of r-bit words of odd weight w >= 3, taken weight by weight and, within a
weight, orbit by orbit in increasing order of the orbit's smallest member; each orbit lists its
member rotated left by 0, 1, ..., r-1 places. A whole orbit adds w ones to every row, so the
row weights are equal: (72,64) = the 7 weight-3 orbits (56 columns) + the weight-5 orbit of
0b00011111 (8 columns), 27 ones per row with the check-bit identity columns; (40,32) = the
first 4 weight-3 orbits, 13 ones per row. Data bit ``8*b + i`` is bit ``i`` of byte ``b`` of
the bus word; the check bits have the unit columns.

Fault footprints put their wrong bits inside one device lane (one byte for x8, one nibble for
x4), the same bits in every word a fault touches. So the outcome of a fault is one draw from
the lane patterns of its weight: `lane_outcomes` enumerates them exactly (at most 8 lanes x
C(8, 4) = 560 patterns) and gives, per lane, the silent patterns and what the reader then sees.

Chipkill (single-symbol-correct, double-symbol-detect over device symbols; T. J. Dell, "A
white paper on the benefits of chipkill-correct ECC for PC server main memory", IBM 1997):
every error confined to one device is corrected and every error in two devices is detected by
construction (distance 4 in symbols), so neither a single fault nor a coincidence of two faults
can be miscorrected. Three-device coincidences (third order in the fault rates) are not
modelled; for them a bounded-distance decoder would miscorrect about as often as a random
syndrome lands in a correctable coset, `chipkill_random_miscorrection`.

BCH. A t-error-correcting binary BCH code with a bounded-distance decoder, given more than t
errors, returns a wrong codeword when the received word falls into another codeword's radius-t
sphere. For a random received word that happens with probability V(n, t) / 2^(n-k) (sphere
volume over the number of cosets); with n - k = m t and V(n, t) ~ n^t / t! ~ 2^(m t) / t! this
is about 1/t! (the standard sphere-packing argument; the analogue for Reed-Solomon codes is
R. J. McEliece & L. Swanson, "On the decoder error probability for Reed-Solomon codes", IEEE
Trans. Inf. Theory 32(5), 1986: about 1/t!). `bch_miscorrection` computes the sphere ratio
exactly in logarithms.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import numpy.typing as npt

__all__ = [
    "LaneOutcomes",
    "bch_miscorrection",
    "chipkill_random_miscorrection",
    "hsiao_columns",
    "lane_outcomes",
    "secded_outcome",
]

IntArray = npt.NDArray[np.int64]

#: Check bits per bus width: (72,64) for a 64-bit DDR4 channel, (40,32) for a 32-bit DDR5
#: sub-channel (8 ECC bits per sub-channel on an ECC RDIMM).
CHECK_BITS = {64: 8, 32: 8}


def _rotl(x: int, s: int, r: int) -> int:
    mask = (1 << r) - 1
    return ((x << s) | (x >> (r - s))) & mask if s else x


@lru_cache(maxsize=8)
def hsiao_columns(k: int, r: int) -> tuple[int, ...]:
    """The k data columns (r-bit syndromes as ints) of the Hsiao code built as described in
    the module docstring."""
    cols: list[int] = []
    for w in range(3, r + 1, 2):
        reps = sorted({min(_rotl(x, s, r) for s in range(r))
                       for x in range(1 << r) if x.bit_count() == w})
        for rep in reps:
            orbit = [_rotl(rep, s, r) for s in range(r)]
            if len(set(orbit)) < r:
                continue  # a shorter orbit would unbalance the rows
            cols.extend(orbit)
            if len(cols) >= k:
                if len(cols) > k:
                    raise ValueError(f"no whole-orbit Hsiao code with k={k}, r={r}")
                return tuple(cols)
    raise ValueError(f"not enough odd-weight columns for k={k}, r={r}")


def secded_outcome(data_bits: IntArray, k: int, r: int) -> tuple[str, int]:
    """What the decoder does with wrong data bits `data_bits` (indices < k): ("corrected" |
    "detected" | "silent", extra), where ``extra`` is the data bit the decoder flips on a
    miscorrection (-1: none, or a check bit)."""
    cols = hsiao_columns(k, r)
    s = 0
    for b in data_bits.tolist():
        s ^= cols[b]
    if s == 0:
        return ("silent", -1) if data_bits.size else ("corrected", -1)
    if s.bit_count() % 2 == 0:
        return "detected", -1
    if s.bit_count() == 1:  # a check bit's column: the data are left as they are
        return ("corrected" if data_bits.size <= 1 else "silent"), -1
    try:
        j = cols.index(s)
    except ValueError:
        return "detected", -1
    if data_bits.size == 1:
        return "corrected", -1
    return "silent", j


@dataclass(frozen=True)
class LaneOutcomes:
    """Outcomes of the patterns of `weight` wrong bits inside one device lane, per byte lane
    of the bus word (all patterns of a lane equally likely).

    ``total[L]``: patterns of byte lane L; ``silent[L]``: those that pass silently;
    ``masks[L]``: (s, 2) array of the silent patterns' byte-lane bit masks and the extra data
    bit the decoder flips (-1: none); ``wrong_bits[L]``: mean wrong data bits per word over the
    silent patterns (the pattern, plus or minus the decoder's flip)."""

    weight: int
    total: tuple[int, ...]
    silent: tuple[int, ...]
    masks: tuple[IntArray, ...]
    wrong_bits: tuple[float, ...]

    def silent_fraction(self) -> npt.NDArray[np.float64]:
        return np.array(self.silent, dtype=np.float64) / np.array(self.total, dtype=np.float64)


@lru_cache(maxsize=64)
def lane_outcomes(bus_bits: int, device_width: int, weight: int) -> LaneOutcomes:
    """Exact enumeration over every byte lane and every `weight`-bit pattern inside one
    device lane (x8: the byte; x4: either nibble) of the SEC-DED code for `bus_bits`."""
    r = CHECK_BITS[bus_bits]
    cols = np.array(hsiao_columns(bus_bits, r), dtype=np.int64)
    col_index = {int(c): j for j, c in enumerate(cols.tolist())}
    groups = [list(range(8))] if device_width == 8 else [list(range(4)), list(range(4, 8))]
    subsets = [c for g in groups for c in itertools.combinations(g, weight)]
    sub = np.zeros((len(subsets), 8), dtype=bool)
    for i, c in enumerate(subsets):
        sub[i, list(c)] = True
    totals, silents, masks, wrong = [], [], [], []
    for lane in range(bus_bits // 8):
        lane_cols = cols[8 * lane: 8 * lane + 8]
        syn = np.bitwise_xor.reduce(np.where(sub, lane_cols[None, :], 0), axis=1)
        bitmask = (sub * (1 << np.arange(8))).sum(axis=1)
        keep_m, keep_x, wb = [], [], []
        for s, m in zip(syn.tolist(), bitmask.tolist(), strict=True):
            pc = s.bit_count()
            if s != 0 and (pc % 2 == 0 or (pc > 1 and s not in col_index)):
                continue  # detected
            extra = col_index[s] if (s != 0 and pc > 1) else -1
            keep_m.append(m)
            keep_x.append(extra)
            inside = extra >= 0 and extra // 8 == lane and (m >> (extra % 8)) & 1
            wb.append(weight - 1 if inside else weight + (1 if extra >= 0 else 0))
        totals.append(len(subsets))
        silents.append(len(keep_m))
        masks.append(np.array([keep_m, keep_x], dtype=np.int64).T.reshape(-1, 2))
        wrong.append(float(np.mean(wb)) if wb else 0.0)
    return LaneOutcomes(weight, tuple(totals), tuple(silents), tuple(masks), tuple(wrong))


def chipkill_random_miscorrection(symbols: int = 36, symbol_bits: int = 4,
                                  check_symbols: int = 4) -> float:
    """P(a random non-zero syndrome of an SSC code is a correctable one): the approximate
    miscorrection probability of an error beyond the double-symbol detection guarantee.
    Default: x4 chipkill as 36 four-bit symbols with 4 check symbols (144-bit word)."""
    q = 1 << symbol_bits
    return float(symbols * (q - 1)) / float(q ** check_symbols - 1)


def bch_miscorrection(n_bits: int, t: int, parity_bits: int) -> float:
    """P(a bounded-distance t-error decoder, fed a random word beyond its radius, decodes to a
    wrong codeword) = V(n, t) / 2^parity (sphere volume over the number of cosets), capped at
    1; close to 1/t! for a primitive BCH code with parity = m t."""
    if t <= 0:
        return 0.0
    logs = [math.lgamma(n_bits + 1) - math.lgamma(i + 1) - math.lgamma(n_bits - i + 1)
            for i in range(t + 1)]
    m = max(logs)
    log_v = m + math.log(math.fsum(math.exp(x - m) for x in logs))
    return min(1.0, math.exp(log_v - parity_bits * math.log(2.0)))
