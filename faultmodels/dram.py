"""`dram`: per-device DRAM fault modes as Poisson processes (presets ``dram-ddr4``, ``dram-ddr5``).

Sources (see docs/faultmodels/dram.md for the full discussion):

* Fault modes and their rates, FIT per device, transient / permanent: Sridharan & Liberty,
  "A Study of DRAM Failures in the Field", SC12 (field data from the Jaguar system), the
  per-mode table that AMD's FaultSim (Nair et al.) hard-codes: single-bit 14.2 / 18.6,
  single-word 1.4 / 0.3, single-column 1.4 / 5.6, single-row 0.2 / 8.2, single-bank
  0.8 / 10.0, multi-bank 0.3 / 1.4, multi-rank 0.9 / 2.8 (total 66.1 FIT).
* Scrubbing every 3 h: FaultSim's default configuration (scrub interval 10,800 s).
* ECC organisations: (72,64) SEC-DED; chipkill (single-device correction); DDR5 on-die
  (136,128) SEC. Secondary: device sizes, widths, row sizes and on-die behaviour of the
  presets are typical datasheet values, not measurements.

The model (all approximations are listed in the docs):

* Address space: a buffer occupies ``nbytes`` contiguous bytes of the system address space,
  which is mapped contiguously onto ranks, banks and rows (no channel/bank interleaving).
  A bus word is ``bus_bits / 8`` bytes; a x``W`` device supplies a ``W``-bit lane of every
  word (x8: one byte, x4: one nibble).
* A fault of mode ``m`` has an origin byte, uniform over all memory, and arrives at rate
  ``FIT_m * fit_multiplier * 1e-9 / device_bytes`` per byte of memory per hour (the system
  holds ``device_bytes`` per device). It affects ``count = (span - word)/stride + 1`` lane
  positions ``origin + k*stride``, and in each it corrupts ``bits_per_word`` bits of the
  device lane (the same bits, e.g. a stuck DQ). The number of mode-``m`` faults that touch
  a buffer is Poisson with mean ``FIT_m*1e-9*hours*(n + (count-1)*min(stride, n))/device_bytes``;
  for contiguous modes this is ``FIT*1e-9*hours*(n + span - word)/device_bytes``.
* Faulty cells always read wrong (the FaultSim convention: the whole range is faulty).
* System ECC decides what the host sees, per fault: ``none``: all flips; ``secded``: a (72,64)
  Hsiao SEC-DED per 64-bit word ((40,32) per 32-bit DDR5 sub-channel; Hsiao, IBM J. Res.
  Dev. 1970): modes with one wrong bit per word are corrected; a fault with more wrong bits
  per word is, by the exact lane-pattern fractions of the code (`faultmodels.wordecc`,
  `faultmodels.dram_secded`), either detected uncorrectable (DUE: poison over the 64-byte
  lines it touches) or silent (an undetected even-weight error, or an odd-weight error the
  decoder miscorrects with one more flip: silent data corruption); ``chipkill``
  (single-symbol correct, double-symbol detect; Dell, IBM white paper 1997): every
  single-device fault is corrected. On-die ECC (DDR5) corrects modes with at most one wrong
  bit per 128-bit on-die codeword (single-bit and single-column faults) inside the chip; its
  own miscorrections are not modelled.
* Faults that the system ECC corrects alone become uncorrectable when two of them hit the
  same ECC word while the first is still present (permanent: until the end of the
  residency; transient: until the next scrub, at a uniformly random phase of a
  ``scrub_hours`` period). These coincidences are one Poisson class (second order in the
  rates) that poisons the 64-byte lines holding the shared words: two single-bit errors in a
  word are always detected by SEC-DED, and two devices' errors always by chipkill's double-
  symbol detection, so no coincidence is miscorrected. Two faults in the same device are
  counted too (chipkill would correct them: a small over-estimate).
* Latent faults (``latent_hours``, default 0 = off): a permanent fault stays in the memory
  until a patrol scrub (or a read) finds it and the memory is retired, on average
  ``latent_hours`` after it arose; so the memory a buffer is written to already holds, on
  average, ``rate x latent_hours`` undetected permanent faults of each mode (Little's law),
  and a permanent class's exposure is ``hours + latent_hours`` (transient faults before the
  write are overwritten by it). Coincidences count pre-existing permanent faults the same way.
  Realistic: ``scrub_hours / 2`` = 1.5 h for FaultSim's 3 h patrol scrub if the first scrub
  that sees a fault retires its memory; longer if correctable faults are left in place.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

import faultmodels.dram_secded as dram_secded

from ._dist import IntArray
from ._dram_geom import (
    _Cls,
    _hit_origin,
    _hits,
    _in_range,
    _line_erasures,
    _pairs,
    _persist_integral,
)
from .base import (
    ErrorPattern,
    EventClass,
    EventRate,
    FaultModel,
    poisson_class,
)
from .checks import (
    as_bool,
    as_float,
    as_int,
    as_str,
    as_table,
    one_of,
    split_params,
)
from .dram_modes import (
    MODE_KIND,
    MODE_NAMES,
    SC12_FIT,
    DramMode,
    default_modes,
    mode_from_dict,
    normalize_modes,
)
from .errors import FaultModelError

__all__ = ["ECC_CHOICES", "MODE_NAMES", "SC12_FIT", "DramMode", "DramModel"]

ECC_CHOICES = ("none", "secded", "chipkill")
ON_DIE_DATA_BITS = 128  # DDR5 on-die ECC: (136,128) SEC per 128 data bits of one device


@dataclass(frozen=True)
class DramModel(FaultModel):
    """Per-device DRAM fault modes (Sridharan & Liberty SC12) behind a memory controller."""

    name: ClassVar[str] = "dram"

    device_bytes: int = 1 << 30  # 8 Gb device (DDR4 typical; secondary)
    device_width: int = 8  # x8
    bus_bits: int = 64  # data bits per bus word (DDR4 channel 64; DDR5 sub-channel 32)
    banks: int = 16
    ranks: int = 2
    row_bytes: int = 8192  # one row across the rank: 1 KiB page x 8 x8 devices
    system_ecc: str = "secded"
    on_die_ecc: bool = False
    scrub_hours: float = 3.0
    fit_multiplier: float = 1.0
    poison_bytes: int = 64
    modes: tuple[tuple[str, DramMode], ...] = field(default_factory=default_modes)
    source: str = ""
    latent_hours: float = 0.0  # mean hours a permanent fault stays undetected (0: off)

    def __post_init__(self) -> None:
        w = one_of(as_int(self.device_width, "dram.device_width"), (4, 8), "dram.device_width")
        bus = one_of(as_int(self.bus_bits, "dram.bus_bits"), (32, 64), "dram.bus_bits")
        set_ = object.__setattr__
        set_(self, "device_width", w)
        set_(self, "bus_bits", bus)
        wb = bus // 8
        set_(self, "device_bytes", as_int(self.device_bytes, "dram.device_bytes", lo=1 << 20))
        set_(self, "banks", as_int(self.banks, "dram.banks", lo=1))
        set_(self, "ranks", as_int(self.ranks, "dram.ranks", lo=1))
        set_(self, "row_bytes", as_int(self.row_bytes, "dram.row_bytes", lo=wb))
        set_(self, "poison_bytes", as_int(self.poison_bytes, "dram.poison_bytes", lo=wb))
        set_(self, "system_ecc", one_of(self.system_ecc, ECC_CHOICES, "dram.system_ecc"))
        set_(self, "on_die_ecc", as_bool(self.on_die_ecc, "dram.on_die_ecc"))
        set_(self, "scrub_hours", as_float(self.scrub_hours, "dram.scrub_hours", lo=0.0))
        set_(self, "fit_multiplier",
             as_float(self.fit_multiplier, "dram.fit_multiplier", lo=0.0))
        set_(self, "source", as_str(self.source, "dram.source"))
        set_(self, "latent_hours", as_float(self.latent_hours, "dram.latent_hours", lo=0.0))
        for k in ("row_bytes", "poison_bytes"):
            if getattr(self, k) % wb:
                raise FaultModelError(f"dram.{k} must be a multiple of the {wb}-byte bus word")
        if self.bank_bytes < self.row_bytes:
            raise FaultModelError(
                f"dram: a bank ({self.bank_bytes} bytes) is smaller than a row "
                f"({self.row_bytes} bytes); check device_bytes, banks, row_bytes")
        set_(self, "modes", normalize_modes(self.modes))
        self.resolved_modes()  # validates footprints

    # -- geometry ------------------------------------------------------------------------------
    @property
    def word_bytes(self) -> int:
        return self.bus_bits // 8

    @property
    def rank_bytes(self) -> int:
        """System bytes of one rank: data devices per bus word x device size."""
        return (self.bus_bits // self.device_width) * self.device_bytes

    @property
    def bank_bytes(self) -> int:
        return self.rank_bytes // self.banks

    def mode(self, name: str) -> DramMode:
        for nm, m in self.modes:
            if nm == name:
                return m
        raise FaultModelError(f"dram: unknown fault mode {name!r}")

    def _default_footprint(self, name: str) -> tuple[int, int, int]:
        wb, w = self.word_bytes, self.device_width
        half = max(1, w // 2)
        return {
            "single-bit": (wb, wb, 1),
            "single-word": (wb, wb, max(2, half)),
            "single-column": (self.bank_bytes, self.row_bytes, 1),
            "single-row": (self.row_bytes, wb, half),
            "single-bank": (self.bank_bytes, wb, half),
            "multi-bank": (self.rank_bytes, wb, half),
            "multi-rank": (self.ranks * self.rank_bytes, wb, half),
        }[name]

    def resolved_modes(self) -> dict[str, dict[str, int | float]]:
        """Every mode's FITs and footprint as used: span_bytes, stride_bytes, bits_per_word,
        count (lane positions per fault)."""
        out: dict[str, dict[str, int | float]] = {}
        wb = self.word_bytes
        for name, m in self.modes:
            span, stride, bits = self._default_footprint(name)
            span = m.span_bytes if m.span_bytes is not None else span
            stride = m.stride_bytes if m.stride_bytes is not None else stride
            bits = m.bits_per_word if m.bits_per_word is not None else bits
            if span % wb or stride % wb:
                raise FaultModelError(
                    f"dram mode {name}: span_bytes and stride_bytes must be multiples of the "
                    f"{wb}-byte bus word (got {span}, {stride})")
            if not 1 <= bits <= self.device_width:
                raise FaultModelError(
                    f"dram mode {name}: bits_per_word must be in 1..{self.device_width} "
                    f"(one device lane), got {bits}")
            out[name] = {
                "fit_transient": m.fit_transient,
                "fit_permanent": m.fit_permanent,
                "span_bytes": span,
                "stride_bytes": stride,
                "bits_per_word": bits,
                "count": (span - wb) // stride + 1,
            }
        return out

    def _fate(self, count: int, stride: int, bits: int) -> str:
        ondie_span = (ON_DIE_DATA_BITS // self.device_width) * self.word_bytes
        if self.on_die_ecc and bits == 1 and (count == 1 or stride >= ondie_span):
            return "ondie"
        if self.system_ecc == "none":
            return "escape"
        if self.system_ecc == "secded":
            return "correct" if bits == 1 else "secded"
        return "correct"

    def _class_list(self) -> list[_Cls]:
        cached: list[_Cls] | None = self.__dict__.get("_dram_cls")
        if cached is not None:
            return cached
        out = []
        scale = self.fit_multiplier * 1e-9 / self.device_bytes
        for name, g in self.resolved_modes().items():
            count, stride, bits = int(g["count"]), int(g["stride_bytes"]), int(g["bits_per_word"])
            fate = self._fate(count, stride, bits)
            for transient, fit in ((True, g["fit_transient"]), (False, g["fit_permanent"])):
                if fit > 0.0 and scale > 0.0:
                    out.append(_Cls(name, MODE_KIND[name], transient, fit * scale,
                                    int(g["span_bytes"]), stride, count, bits, fate))
        object.__setattr__(self, "_dram_cls", out)
        return out

    def with_latent_hours(self, hours: float) -> DramModel:
        return dataclasses.replace(self, latent_hours=hours)

    def _exposure(self, c: _Cls, hours: float) -> float:
        """Hours of arrivals that a class's faults in the buffer come from: the residency,
        plus the latent window for permanent faults that arose before the write."""
        return hours if c.transient else hours + self.latent_hours

    # -- coincidences of correctable faults ----------------------------------------------------
    def _pair_geometry(self, n_words: int) -> tuple[list[_Cls], np.ndarray]:
        """Correctable classes and their origin-pair counts for an n-word region."""
        key = ("_dram_pairs", n_words)
        cache: dict[Any, Any] = self.__dict__.setdefault("_dram_pair_cache", {})
        got = cache.get(key)
        if got is None:
            wb = self.word_bytes
            corr = [c for c in self._class_list() if c.fate == "correct"]
            npairs = np.zeros((len(corr), len(corr)))
            for i, a in enumerate(corr):
                for j, b in enumerate(corr):
                    npairs[i, j] = _pairs(n_words, a.count, a.stride // wb,
                                          b.count, b.stride // wb)
            if len(cache) > 64:
                cache.clear()
            got = (corr, npairs)
            cache[key] = got
        return got

    def _pair_means(self, n_words: int, hours: float) -> tuple[list[_Cls], np.ndarray]:
        corr, npairs = self._pair_geometry(n_words)
        if not corr:
            return corr, npairs
        wb = self.word_bytes
        lam = np.array([c.rate * wb for c in corr])
        g = np.array([
            _persist_integral(hours, self.scrub_hours
                              if (c.transient and self.scrub_hours > 0) else math.inf)
            for c in corr
        ])
        gm = np.repeat(g[:, None], len(corr), axis=1)
        lat = self.latent_hours
        if lat > 0.0:
            # A permanent first fault may also have arisen up to `lat` before the write
            # (born in [-lat, tb)): + lat*h against a transient second fault (born in [0, h]),
            # + lat*h + lat^2/2 against a permanent one (born in [-lat, h] too).
            perm = np.array([not c.transient for c in corr])
            gm = gm + perm[:, None] * (lat * hours + perm[None, :] * (lat * lat / 2.0))
        return corr, lam[:, None] * gm * lam[None, :] * npairs

    # -- realization -------------------------------------------------------------------------
    def _lane_bits(self, k: int, bits: int, rng: np.random.Generator) -> IntArray:
        """(k, bits) bit offsets within a byte: `bits` distinct bits of the device lane."""
        w = self.device_width
        perm = rng.permuted(np.tile(np.arange(w, dtype=np.int64), (k, 1)), axis=1)[:, :bits]
        perm.sort(axis=1)
        if w == 4:
            perm = perm + 4 * rng.integers(0, 2, size=(k, 1), dtype=np.int64)
        return perm

    def _realize_escape(self, c: _Cls, n: int, k: int, rng: np.random.Generator,
                        detected: bool) -> ErrorPattern:
        pb = self.poison_bytes
        if c.count == 1 or c.stride >= n:  # each hit touches exactly one byte of the buffer
            byts = rng.integers(0, n, size=k, dtype=np.int64)
            if detected:
                return ErrorPattern(n, erasures=tuple(_line_erasures(byts, pb, n)))
            lanes = self._lane_bits(k, c.bits, rng)
            return ErrorPattern(n, (byts[:, None] * 8 + lanes).ravel())
        flips_parts: list[IntArray] = []
        erasures: list[tuple[int, int, str]] = []
        for _ in range(k):
            o = _hit_origin(c.count, c.stride, n, rng)
            klo, khi = _in_range(o, c.count, c.stride, n)
            if detected and c.stride <= pb:  # the touched lines form one run
                a = ((o + klo * c.stride) // pb) * pb
                b = min(((o + khi * c.stride) // pb + 1) * pb, n)
                erasures.append((a, b - a, "poison"))
                continue
            byts = o + c.stride * np.arange(klo, khi + 1, dtype=np.int64)
            if detected:
                erasures.extend(_line_erasures(byts, pb, n))
            else:
                lane = self._lane_bits(1, c.bits, rng)[0]
                flips_parts.append((byts[:, None] * 8 + lane[None, :]).ravel())
        flips = np.concatenate(flips_parts) if flips_parts else np.empty(0, np.int64)
        return ErrorPattern(n, flips, tuple(erasures))

    def _realize_pair(self, a: _Cls, b: _Cls, n_words: int,
                      rng: np.random.Generator) -> IntArray:
        """Shared words (sorted) of two overlapping correctable faults in an n-word buffer."""
        wb = self.word_bytes
        ai, si = a.count, (1 if a.count == 1 else a.stride // wb)
        aj, sj = b.count, (1 if b.count == 1 else b.stride // wb)
        nw = n_words
        if si == sj:
            hi = _hits(nw, ai, si)
            tot = ai * nw + hi * (aj - 1)
            if rng.random() * tot < ai * nw:
                oi = int(rng.integers(nw)) - int(rng.integers(ai)) * si
            else:
                oi = _hit_origin(ai, si, nw, rng)
            klo, khi = _in_range(oi, ai, si, nw)
            oj = oi + int(rng.integers(klo - (aj - 1), khi + 1)) * si
        else:  # approximate: pairs weighted by their number of shared words
            w = int(rng.integers(nw))
            oi = w - int(rng.integers(ai)) * si
            oj = w - int(rng.integers(aj)) * sj
        ki = _in_range(oi, ai, si, nw)
        kj = _in_range(oj, aj, sj, nw)
        pi = oi + si * np.arange(ki[0], ki[1] + 1, dtype=np.int64)
        pj = oj + sj * np.arange(kj[0], kj[1] + 1, dtype=np.int64)
        return np.intersect1d(pi, pj, assume_unique=True)

    # -- the FaultModel interface ---------------------------------------------------------------
    def _build_classes(self, nbytes: int, hours: float) -> list[EventClass]:
        n, h = nbytes, hours
        pb = self.poison_bytes
        out: list[EventClass] = []
        detected = self.system_ecc != "none"
        for c in self._class_list():
            if c.fate == "secded":
                out.extend(dram_secded.secded_classes(self, c, n, self._exposure(c, h)))
                continue
            if c.fate != "escape":
                continue
            hits = _hits(n, c.count, c.stride)
            mean = c.rate * self._exposure(c, h) * hits
            if detected:
                full, rest = divmod(n, pb)
                covered = full * pb * _hits(pb, c.count, c.stride)
                covered += rest * _hits(rest, c.count, c.stride) if rest else 0
                bpe = 4.0 * covered / hits
            else:
                bpe = c.bits * c.count * n / hits
            rate = EventRate(
                c.kind, mean, c.span, bpe, transient=False, detected=detected,
                label=f"{c.mode}, {'transient' if c.transient else 'permanent'}"
                      + (" (uncorrectable, poisoned)" if detected else ""),
            )

            def realize(k: int, rng: np.random.Generator, c: _Cls = c) -> ErrorPattern:
                return self._realize_escape(c, n, k, rng, detected)

            out.append(poisson_class(rate, realize))
        # coincidences of individually correctable faults
        wb = self.word_bytes
        n_words = -(-n // wb)
        corr, m = self._pair_means(n_words, h)
        total = float(m.sum()) if corr else 0.0
        if total > 0.0:
            _, m_line = self._pair_means(pb // wb, h)
            bpe = min(4.0 * n * float(m_line.sum()) / total, 4.0 * n)
            probs = (m / total).ravel()
            rate = EventRate(
                "poison", total, pb, bpe, transient=False, detected=True,
                label=f"coincident correctable faults ({self.system_ecc} overwhelmed)",
            )

            def realize_pairs(k: int, rng: np.random.Generator) -> ErrorPattern:
                picks = rng.choice(probs.size, size=k, p=probs)
                ers: list[tuple[int, int, str]] = []
                for idx in picks.tolist():
                    i, j = divmod(idx, len(corr))
                    shared = self._realize_pair(corr[i], corr[j], n_words, rng)
                    ers.extend(_line_erasures(shared * wb, pb, n))
                return ErrorPattern(n, erasures=tuple(ers))

            out.append(poisson_class(rate, realize_pairs))
        return out

    def _bit_probs(self, hours: float) -> tuple[float, float]:
        pb = self.poison_bytes
        lam_flip = 0.0
        lam_line = 0.0
        wb = self.word_bytes
        for c in self._class_list():
            h = self._exposure(c, hours)
            if c.fate == "secded":
                lo, _, _, sw = dram_secded.lanes(self, c, pb)
                f = lo.silent_fraction()
                lam_line += c.rate * h * _hits(pb // wb, c.count, sw) * float(np.sum(1.0 - f))
                lam_flip += (c.rate * h * c.count * float(np.sum(f * np.array(lo.wrong_bits)))
                             / (8.0 * wb))
                continue
            if c.fate != "escape":
                continue
            if self.system_ecc == "none":
                lam_flip += c.rate * h * c.count * c.bits / 8.0
            else:
                lam_line += c.rate * h * _hits(pb, c.count, c.stride)
        corr, m_line = self._pair_means(pb // self.word_bytes, hours)
        if corr:
            lam_line += float(m_line.sum())
        return -math.expm1(-lam_line), -math.expm1(-lam_flip)

    def params(self) -> dict[str, Any]:
        return {
            "model": self.name,
            "source": self.source,
            "device_bytes": self.device_bytes,
            "device_width": self.device_width,
            "bus_bits": self.bus_bits,
            "banks": self.banks,
            "ranks": self.ranks,
            "row_bytes": self.row_bytes,
            "system_ecc": self.system_ecc,
            "on_die_ecc": self.on_die_ecc,
            "scrub_hours": self.scrub_hours,
            "fit_multiplier": self.fit_multiplier,
            "poison_bytes": self.poison_bytes,
            "modes": {name: m.params() for name, m in self.modes},
            # only when set, so that the presets' parameters (and every cache keyed by
            # them) stay what they were before latent faults existed
            **({"latent_hours": self.latent_hours} if self.latent_hours else {}),
        }

    @classmethod
    def from_params(cls, d: Mapping[str, Any]) -> DramModel:
        names = ("device_bytes", "device_width", "bus_bits", "banks", "ranks", "row_bytes",
                 "system_ecc", "on_die_ecc", "scrub_hours", "fit_multiplier", "poison_bytes",
                 "modes", "source", "latent_hours")
        kw = split_params(d, cls.name, names)
        if "modes" in kw:
            given = as_table(kw["modes"], "dram.modes",
                             what="a table of mode name -> parameters")
            merged = dict(default_modes())
            for name, md in given.items():
                if name not in MODE_NAMES:
                    raise FaultModelError(
                        f"dram: unknown fault mode {name!r}; modes: {', '.join(MODE_NAMES)}")
                if isinstance(md, DramMode):
                    merged[name] = md
                    continue
                md = as_table(md, f"dram.modes.{name}")
                merged[name] = mode_from_dict(name, {**merged[name].params(), **md})
            kw["modes"] = tuple((n, merged[n]) for n in MODE_NAMES)
        return cls(**kw)
