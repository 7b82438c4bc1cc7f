"""`nand`: NAND flash behind an SSD controller (preset ``nvme-tlc``).

Sources (docs/faultmodels/nvme.md has the discussion; (secondary) = not checked against the
primary source):

* Raw bit error rate: ``RBER(PE, t) = exp((a*PE + b)*ln(t) + c*PE + d)``, t in seconds,
  a = 7.92e-6, b = 0.25, c = 3.28e-5, d = -12.72 (a 3D-NAND form after Luo et al.,
  SIGMETRICS 2018; parameters from simulator configurations, secondary). At 3,000 P/E
  cycles: about 3.1e-5 after 1 h, 7.4e-5 after 1 day, 3.7e-4 after 1 year.
* Temperature: Arrhenius acceleration of retention time with Ea = 1.1 eV (JEDEC JESD218
  practice), reference 30 C.
* Overdispersion of errors per codeword: beta-binomial (Taranalli et al.), optional.
* Device ECC: BCH from 4 bits / 512 B up to 40-72 bits / 1 KiB, LDPC beyond; a code that
  corrects 40 bits per 1 KiB meets UBER 1e-16 up to RBER about 1.5e-3 (secondary).
  A codeword with more than t wrong bits fails; a failed codeword loses its sector (a
  detected read error, erasure kind ``"sector"``). Decoder miscorrection is ignored.
* Latent sector errors in the field: 2-6 of 1,000 drive-days see an uncorrectable error
  (Schroeder, Lagisetty & Merchant, FAST 2016); spatial clustering: the chance of another
  latent sector error within 10 MB is 0.5 (Bairavasundaram et al., SIGMETRICS 2007).
* Silent corruption: checksum mismatches on 0.466% (nearline) / 0.042% (enterprise) of
  disks per year, often in runs of adjacent blocks (Bairavasundaram et al., FAST 2008; hard
  disks behind a storage controller, applied to SSDs as an assumption). Not detected.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import numpy as np

from ._checks import as_choice, as_float, as_int, as_str, split_params
from ._dist import (
    FloatArray,
    IntArray,
    bb_log_p0,
    bb_tail,
    bb_zt_cdf,
    beta_params,
    binom_tail,
    distinct,
    first_nonzero_index,
    runs,
    sample_from_cdf,
)
from .base import (
    ErrorPattern,
    EventClass,
    EventRate,
    FaultModel,
    binomial_class,
    poisson_class,
)
from .errors import FaultModelError

__all__ = ["BOLTZMANN_EV", "NandModel"]

BOLTZMANN_EV = 8.617333262e-5  # eV / K
ECC_CHOICES = ("none", "bch", "ldpc")


def _sector_erasures(sectors: IntArray, sb: int, n: int) -> tuple[tuple[int, int, str], ...]:
    starts, ends = runs(np.unique(sectors))
    out = []
    for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
        a, b = s * sb, min(e * sb, n)
        out.append((a, b - a, "sector"))
    return tuple(out)


def _sum_min(k: int, w: int) -> int:
    """sum_{p=0}^{k-1} min(p, w)."""
    if k <= 0:
        return 0
    if k - 1 <= w:
        return k * (k - 1) // 2
    return w * (w + 1) // 2 + w * (k - 1 - w)


@dataclass(frozen=True)
class NandModel(FaultModel):
    """NAND flash RBER (after Luo et al. 2018) + device ECC + field sector errors."""

    name: ClassVar[str] = "nand"

    pe_cycles: float = 3000.0
    temperature_c: float = 30.0
    reference_temperature_c: float = 30.0
    activation_energy_ev: float = 1.1
    rber_a: float = 7.92e-6
    rber_b: float = 0.25
    rber_c: float = 3.28e-5
    rber_d: float = -12.72
    overdispersion: float = 0.0
    device_ecc: str = "bch"
    ecc_bits_per_kib: int = 40
    ecc_codeword_bytes: int = 1024
    sector_bytes: int = 4096
    drive_bytes: int = 10 ** 12
    lse_rate: float = 1.7e-4
    cluster_p: float = 0.5
    cluster_bytes: int = 10_000_000
    silent_rate: float = 4.8e-8
    silent_run_mean: float = 2.0
    source: str = ""

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        f = as_float
        set_(self, "pe_cycles", f(self.pe_cycles, "nand.pe_cycles", lo=0.0))
        set_(self, "temperature_c", f(self.temperature_c, "nand.temperature_c", lo=-273.15,
                                      lo_open=True))
        set_(self, "reference_temperature_c",
             f(self.reference_temperature_c, "nand.reference_temperature_c", lo=-273.15,
               lo_open=True))
        set_(self, "activation_energy_ev",
             f(self.activation_energy_ev, "nand.activation_energy_ev", lo=0.0))
        for k in ("rber_a", "rber_b", "rber_c", "rber_d"):
            set_(self, k, f(getattr(self, k), f"nand.{k}"))
        set_(self, "overdispersion",
             f(self.overdispersion, "nand.overdispersion", lo=0.0, hi=1.0, hi_open=True))
        set_(self, "device_ecc", as_choice(self.device_ecc, "nand.device_ecc", ECC_CHOICES))
        set_(self, "ecc_bits_per_kib", as_int(self.ecc_bits_per_kib, "nand.ecc_bits_per_kib",
                                              lo=0))
        set_(self, "ecc_codeword_bytes",
             as_int(self.ecc_codeword_bytes, "nand.ecc_codeword_bytes", lo=1))
        set_(self, "sector_bytes", as_int(self.sector_bytes, "nand.sector_bytes", lo=1))
        set_(self, "drive_bytes", as_int(self.drive_bytes, "nand.drive_bytes",
                                         lo=self.sector_bytes))
        set_(self, "lse_rate", f(self.lse_rate, "nand.lse_rate", lo=0.0))
        set_(self, "cluster_p", f(self.cluster_p, "nand.cluster_p", lo=0.0, hi=1.0,
                                  hi_open=True))
        set_(self, "cluster_bytes", as_int(self.cluster_bytes, "nand.cluster_bytes", lo=0))
        set_(self, "silent_rate", f(self.silent_rate, "nand.silent_rate", lo=0.0))
        set_(self, "silent_run_mean", f(self.silent_run_mean, "nand.silent_run_mean", lo=1.0))
        set_(self, "source", as_str(self.source, "nand.source"))
        if self.device_ecc != "none":
            if self.ecc_correctable_bits < 1:
                raise FaultModelError(
                    "nand.ecc_bits_per_kib gives no correctable bit per codeword; use "
                    "device_ecc = \"none\" for raw flash")
            if self.sector_bytes % self.ecc_codeword_bytes:
                raise FaultModelError(
                    "nand.sector_bytes must be a multiple of nand.ecc_codeword_bytes")
        if self.cluster_p > 0.0 and self.cluster_sectors < 1:
            raise FaultModelError("nand.cluster_bytes must be at least one sector")

    # -- derived quantities ----------------------------------------------------------------
    @property
    def acceleration(self) -> float:
        """Arrhenius acceleration of retention at `temperature_c` vs the reference."""
        t = self.temperature_c + 273.15
        t0 = self.reference_temperature_c + 273.15
        return math.exp(self.activation_energy_ev / BOLTZMANN_EV * (1.0 / t0 - 1.0 / t))

    @property
    def ecc_correctable_bits(self) -> int:
        """t: bits the device ECC corrects per codeword."""
        return self.ecc_bits_per_kib * self.ecc_codeword_bytes // 1024

    @property
    def ecc_codeword_bits(self) -> int:
        """Stored bits of one codeword: data + BCH-style parity (m*t bits over GF(2^m))."""
        k = 8 * self.ecc_codeword_bytes
        t = self.ecc_correctable_bits
        m = 2
        while (1 << m) - 1 < k + m * t:
            m += 1
        return k + m * t

    @property
    def cluster_sectors(self) -> int:
        return self.cluster_bytes // self.sector_bytes

    def rber(self, hours: float) -> float:
        """Raw bit error rate after `hours` of retention (capped at 0.5)."""
        ts = float(hours) * 3600.0 * self.acceleration
        if ts <= 0.0:
            return 0.0
        pe = self.pe_cycles
        x = (self.rber_a * pe + self.rber_b) * math.log(ts) + self.rber_c * pe + self.rber_d
        return min(0.5, math.exp(min(x, 0.0)))

    def p_codeword_fail(self, hours: float) -> float:
        """P(a device ECC codeword has more than t wrong bits)."""
        if self.device_ecc == "none":
            return 0.0
        p = self.rber(hours)
        nb, t = self.ecc_codeword_bits, self.ecc_correctable_bits
        if self.overdispersion > 0.0 and 0.0 < p < 1.0:
            a, b = beta_params(p, self.overdispersion)
            return bb_tail(nb, a, b, t)
        return binom_tail(nb, p, t)

    def p_sector_fail(self, hours: float) -> float:
        """P(a sector is lost because one of its codewords failed)."""
        pc = self.p_codeword_fail(hours)
        if pc <= 0.0:
            return 0.0
        if pc >= 1.0:
            return 1.0
        cps = self.sector_bytes // self.ecc_codeword_bytes
        return -math.expm1(cps * math.log1p(-pc))

    def _per_sector_rates(self) -> tuple[float, float]:
        sectors = self.drive_bytes / self.sector_bytes
        return self.lse_rate / sectors, self.silent_rate / sectors

    # -- classes -------------------------------------------------------------------------------
    def _raw_bb_class(self, n: int, p: float, rate: EventRate) -> EventClass:
        """Raw bit errors, beta-binomial per codeword-sized group (overdispersion > 0)."""
        alpha, beta = beta_params(p, self.overdispersion)
        cw = self.ecc_codeword_bytes
        full, tail = divmod(n, cw)
        groups = []  # (units, log P(unit empty), bits per unit, first unit index)
        if full:
            groups.append((full, bb_log_p0(8 * cw, alpha, beta), 8 * cw, 0))
        if tail:
            groups.append((1, bb_log_p0(8 * tail, alpha, beta), 8 * tail, full))
        log_p0 = math.fsum(u * lz for u, lz, _, _ in groups)
        cdfs: dict[int, FloatArray] = {}

        def realize_units(idx: IntArray, m: int, first: int,
                          rng: np.random.Generator) -> list[IntArray]:
            cdf = cdfs.get(m)
            if cdf is None:
                cdf = cdfs[m] = bb_zt_cdf(m, alpha, beta)
            counts = sample_from_cdf(cdf, idx.size, rng)
            out = []
            for u, c in zip(idx.tolist(), counts.tolist(), strict=True):
                out.append(distinct(m, c, rng) + (first + u) * 8 * cw)
            return out

        def draw_nonzero(rng: np.random.Generator) -> ErrorPattern:
            parts: list[IntArray] = []
            chosen = False
            for gi, (units, lz, m, first) in enumerate(groups):
                q_unit = -math.expm1(lz)
                if not chosen:
                    rest = math.fsum(u * z for u, z, _, _ in groups[gi:])
                    here = units * lz
                    q = 1.0 if here == rest else (-math.expm1(here)) / (-math.expm1(rest))
                    if q < 1.0 and rng.random() >= q:
                        continue
                    j = first_nonzero_index(units, lz, rng)
                    later = units - j - 1
                    nz = int(rng.binomial(later, q_unit)) if later > 0 else 0
                    idx = np.concatenate(([j], j + 1 + distinct(later, nz, rng))).astype(np.int64)
                    chosen = True
                else:
                    nz = int(rng.binomial(units, q_unit))
                    idx = distinct(units, nz, rng)
                if idx.size:
                    parts.extend(realize_units(idx, m, first, rng))
            return ErrorPattern(n, np.concatenate(parts))

        return EventClass(rate, log_p0, draw_nonzero)

    def _build_classes(self, nbytes: int, hours: float) -> list[EventClass]:
        n, h = nbytes, hours
        sb = self.sector_bytes
        n_s = -(-n // sb)
        out: list[EventClass] = []

        # 1. raw bit errors (raw flash) or sectors lost to device-ECC failure
        if self.device_ecc == "none":
            p = self.rber(h)
            rate = EventRate("bit", 8 * n * p, 1, 1.0, label="raw NAND bit error")
            if self.overdispersion > 0.0 and 0.0 < p < 1.0:
                out.append(self._raw_bb_class(n, p, rate))
            else:
                def realize_bits(k: int, rng: np.random.Generator) -> ErrorPattern:
                    return ErrorPattern(n, distinct(8 * n, k, rng))

                out.append(binomial_class(rate, 8 * n, p, realize_bits))
        else:
            ps = self.p_sector_fail(h)
            rate = EventRate("sector", n_s * ps, sb, 4.0 * n / n_s, detected=True,
                             label=f"{self.device_ecc} codeword failure (sector lost)")

            def realize_ecc(k: int, rng: np.random.Generator) -> ErrorPattern:
                return ErrorPattern(n, erasures=_sector_erasures(distinct(n_s, k, rng), sb, n))

            out.append(binomial_class(rate, n_s, ps, realize_ecc))

        lam_s, lam_sil = self._per_sector_rates()
        # 2. latent sector errors with spatial clusters
        q = self.cluster_p
        eg = q / (1.0 - q)
        w = self.cluster_sectors
        inside = 2 * _sum_min(n_s, w) if q > 0.0 else 0
        mean_a = lam_s * h * n_s
        extra_in = eg * inside / (2.0 * w) / n_s if q > 0.0 else 0.0
        rate_a = EventRate("sector", mean_a, sb, 4.0 * n / n_s * (1.0 + extra_in),
                           detected=True, label="latent sector error (+ clustered neighbours)")

        def realize_lse(k: int, rng: np.random.Generator) -> ErrorPattern:
            prim = rng.integers(0, n_s, size=k, dtype=np.int64)
            secs = [prim]
            if q > 0.0:
                g = rng.geometric(1.0 - q, size=k) - 1
                tot = int(g.sum())
                if tot:
                    owner = np.repeat(prim, g)
                    off = rng.integers(1, w + 1, size=tot, dtype=np.int64)
                    off *= np.where(rng.random(tot) < 0.5, -1, 1)
                    pos = owner + off
                    secs.append(pos[(pos >= 0) & (pos < n_s)])
            return ErrorPattern(n, erasures=_sector_erasures(np.concatenate(secs), sb, n))

        out.append(poisson_class(rate_a, realize_lse))
        if q > 0.0:
            mean_b = lam_s * h * eg * (n_s - inside / (2.0 * w))
            rate_b = EventRate("sector", max(mean_b, 0.0), sb, 4.0 * n / n_s, detected=True,
                               label="latent sector error clustered around a nearby one")
            kk = min(n_s, w)
            total_w = kk * w - kk * (kk - 1) / 2.0  # sum_{s<kk} (w - s)

            def realize_spill(k: int, rng: np.random.Generator) -> ErrorPattern:
                v = rng.random(k) * total_w
                # smallest s with F(s) = (s+1)w - s(s+1)/2 > v
                a = w - 0.5
                s = np.floor(a - np.sqrt(np.maximum(a * a - 2.0 * (v - w), 0.0)))
                s = np.clip(s, 0, kk - 1).astype(np.int64)

                def cdf(x: IntArray) -> FloatArray:
                    return (x + 1.0) * w - x * (x + 1.0) / 2.0

                s = np.where(cdf(s) <= v, s + 1, s)
                s = np.where((s > 0) & (cdf(s - 1) > v), s - 1, s)
                s = np.clip(s, 0, kk - 1)
                right = rng.random(k) < 0.5
                s = np.where(right, n_s - 1 - s, s)
                return ErrorPattern(n, erasures=_sector_erasures(s, sb, n))

            out.append(poisson_class(rate_b, realize_spill))

        # 3. silent corruption: runs of adjacent blocks read back as garbage, undetected
        er = self.silent_run_mean
        qs = 1.0 - 1.0 / er
        mean_s = lam_sil * h * (n_s + er - 1.0)
        bpe = 4.0 * n / n_s * er * n_s / (n_s + er - 1.0)
        rate_s = EventRate("silent", mean_s, round(er * sb), min(bpe, 4.0 * n),
                           detected=False, label="silent corruption (run of blocks)")
        p_plain = n_s / (n_s + er - 1.0)

        def realize_silent(k: int, rng: np.random.Generator) -> ErrorPattern:
            parts: list[IntArray] = []
            for _ in range(k):
                if qs <= 0.0:
                    r = 1
                elif rng.random() < p_plain:
                    r = int(rng.geometric(1.0 - qs))
                else:  # size-biased in (r - 1)
                    r = 2 + int(rng.negative_binomial(2, 1.0 - qs))
                start = int(rng.integers(-(r - 1), n_s))
                a = max(start, 0) * sb
                b = min((start + r) * sb, n)
                garbage = rng.integers(0, 256, size=b - a, dtype=np.uint8)
                bits = np.flatnonzero(np.unpackbits(garbage, bitorder="little"))
                if bits.size == 0:
                    bits = np.zeros(1, dtype=np.int64)
                parts.append(bits.astype(np.int64) + 8 * a)
            return ErrorPattern(n, np.concatenate(parts))

        out.append(poisson_class(rate_s, realize_silent))
        return out

    def _bit_probs(self, hours: float) -> tuple[float, float]:
        h = hours
        lam_s, lam_sil = self._per_sector_rates()
        q = self.cluster_p
        eg = q / (1.0 - q)
        p_sec = self.p_sector_fail(h)
        pu = 1.0 - (1.0 - p_sec) * math.exp(-lam_s * h * (1.0 + eg))
        p_raw = self.rber(h) if self.device_ecc == "none" else 0.0
        p_sil = -math.expm1(-lam_sil * h * self.silent_run_mean)
        pf = 1.0 - (1.0 - p_raw) * (1.0 - 0.5 * p_sil)
        return pu, pf

    def params(self) -> dict[str, Any]:
        d: dict[str, Any] = {"model": self.name}
        for fl in fields(self):
            d[fl.name] = getattr(self, fl.name)
        return d

    @classmethod
    def from_params(cls, d: Mapping[str, Any]) -> NandModel:
        return cls(**split_params(d, cls.name, [fl.name for fl in fields(cls)]))
