"""`nand`: NAND flash behind an SSD controller (preset ``nvme-tlc``).

Sources (docs/faultmodels/nvme.md has the discussion; (secondary) = not checked against the
primary source):

* Raw bit error rate (``rber_form = "power"``, the default): ``RBER(PE, t) = r0 * (1 +
  PE/P0)^alpha * (t / 1 h)^beta``, fitted to published points (`faultmodels.nand_field`,
  docs/faultmodels/nvme.md): r0 = 4.2e-8, P0 = 100, alpha = 1.92, beta = 0.273; fresh
  devices about 1e-7 after a day, 7.4e-5 at 3,000 P/E cycles (Mielke et al., IRPS 2008;
  Cai et al., DATE 2012; Luo et al., SIGMETRICS 2018; secondary). alpha rests on the one
  assumed fresh point; field data grow about linearly with wear (alpha = 1; Schroeder et
  al., FAST 2016): a documented sweep range of 1.0 .. 2.6. ``rber_form = "luo"``
  keeps the older ``exp((a*PE + b)*ln(t_s) + c*PE + d)`` form (a = 7.92e-6, b = 0.25,
  c = 3.28e-5, d = -12.72; simulator configurations, secondary), which barely responds to
  wear.
* Temperature: Arrhenius acceleration of retention time with Ea = 1.1 eV (JEDEC JESD218
  practice), reference 30 C.
* Overdispersion of errors per codeword: beta-binomial (Taranalli et al.), optional.
* Device ECC: BCH from 4 bits / 512 B up to 40-72 bits / 1 KiB, LDPC beyond; a code that
  corrects 40 bits per 1 KiB meets UBER 1e-16 up to RBER about 1.5e-3 (secondary).
  A codeword with more than t wrong bits fails: the decoder either reports it (the sector is
  lost: a detected read error, erasure kind ``"sector"``) or, with probability
  ``ecc_miscorrection``, decodes to a wrong codeword (silent: 2t+1 wrong data bits in that
  codeword, the nearest other codeword being 2t+1 bits away). Default (``"auto"``): for BCH
  the sphere ratio V(n, t) / 2^(n-k) (about 1/t! for a full-length code; McEliece & Swanson,
  IEEE Trans. IT 1986 for the Reed-Solomon analogue), for LDPC 1e-4 of the failures
  (assumption: MacKay, IEEE Trans. IT 1999, saw no undetected errors at all among his
  Gallager codes' decoding failures; 1e-4 bounds what such runs could miss).
* Latent sector errors in the field: 2-6 of 1,000 drive-days see an uncorrectable error
  (Schroeder, Lagisetty & Merchant, FAST 2016), yet only 20-63 % of drives see one in 4 years:
  a gamma multiplier per drive (shape ``drive_shape``, mean 1) fitted to both; ``drive``
  chooses the drive (``"mean"``, the default, or a quantile); spatial clustering: the chance
  of another latent sector error within 10 MB is 0.5 (Bairavasundaram et al., SIGMETRICS 2007:
  hard disks, applied to flash as an assumption; documented sweep ranges ``cluster_p`` 0 ..
  0.75, ``cluster_bytes`` 1 .. 100 MB).
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

import faultmodels.nand_cluster as nand_cluster
import faultmodels.nand_field as nand_field
import faultmodels.nand_raw as nand_raw
import faultmodels.wordecc as wordecc

from ._dist import (
    FloatArray,
    IntArray,
    bb_tail,
    beta_params,
    binom_tail,
    distinct,
    runs,
)
from .base import (
    ErrorPattern,
    EventClass,
    EventRate,
    FaultModel,
    binomial_class,
    poisson_class,
)
from .checks import as_float, as_int, as_str, one_of, split_params
from .errors import FaultModelError

__all__ = ["BOLTZMANN_EV", "NandModel"]

BOLTZMANN_EV = 8.617333262e-5  # eV / K
ECC_CHOICES = ("none", "bch", "ldpc")
RBER_FORMS = ("power", "luo")
#: Undetected fraction of LDPC decoding failures (assumption, see the module docstring).
LDPC_UNDETECTED = 1e-4


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
    rber_form: str = "power"
    rber_fresh: float = 4.2e-8
    rber_pe_scale: float = 100.0
    rber_pe_exp: float = 1.92
    rber_time_exp: float = 0.273
    rber_a: float = 7.92e-6
    rber_b: float = 0.25
    rber_c: float = 3.28e-5
    rber_d: float = -12.72
    overdispersion: float = 0.0
    device_ecc: str = "bch"
    ecc_bits_per_kib: int = 40
    ecc_codeword_bytes: int = 1024
    ecc_miscorrection: float | str = "auto"
    sector_bytes: int = 4096
    drive_bytes: int = 10 ** 12
    lse_rate: float = 1.7e-4
    drive: float | str = "mean"
    drive_shape: float = 0.134
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
        # Negative exponents would make wear or time heal the flash (documented sweep ranges:
        # docs/faultmodels/nvme.md, "Inputs that rest on little").
        for k in ("rber_pe_exp", "rber_time_exp"):
            set_(self, k, f(getattr(self, k), f"nand.{k}", lo=0.0))
        set_(self, "rber_form", one_of(self.rber_form, RBER_FORMS, "nand.rber_form"))
        set_(self, "rber_fresh", f(self.rber_fresh, "nand.rber_fresh", lo=0.0, hi=0.5))
        set_(self, "rber_pe_scale", f(self.rber_pe_scale, "nand.rber_pe_scale", lo=0.0,
                                      lo_open=True))
        if self.ecc_miscorrection != "auto":
            set_(self, "ecc_miscorrection",
                 f(self.ecc_miscorrection, "nand.ecc_miscorrection (\"auto\" or a number)",
                   lo=0.0, hi=1.0))
        if self.drive != "mean":
            set_(self, "drive", f(self.drive, "nand.drive (\"mean\" or a quantile)", lo=0.0,
                                  hi=1.0, lo_open=True, hi_open=True))
        set_(self, "drive_shape", f(self.drive_shape, "nand.drive_shape", lo=0.0, lo_open=True,
                                    finite=False))
        set_(self, "overdispersion",
             f(self.overdispersion, "nand.overdispersion", lo=0.0, hi=1.0, hi_open=True))
        set_(self, "device_ecc", one_of(self.device_ecc, ECC_CHOICES, "nand.device_ecc"))
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
        if self.rber_form == "power":
            if self.rber_fresh <= 0.0:
                return 0.0
            x = (math.log(self.rber_fresh) + self.rber_pe_exp * math.log1p(pe / self.rber_pe_scale)
                 + self.rber_time_exp * math.log(ts / 3600.0))
        else:
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

    @property
    def miscorrection_prob(self) -> float:
        """P(a failing codeword is decoded to a wrong codeword: silent), as used."""
        if self.device_ecc == "none":
            return 0.0
        if self.ecc_miscorrection != "auto":
            return float(self.ecc_miscorrection)
        if self.device_ecc == "ldpc":
            return LDPC_UNDETECTED
        nb = self.ecc_codeword_bits
        return wordecc.bch_miscorrection(nb, self.ecc_correctable_bits,
                                         nb - 8 * self.ecc_codeword_bytes)

    @property
    def miscorrected_bits(self) -> int:
        """Wrong data bits a miscorrected codeword returns (2t+1, at most the codeword)."""
        return min(2 * self.ecc_correctable_bits + 1, 8 * self.ecc_codeword_bytes)

    def p_codeword_miscorrect(self, hours: float) -> float:
        """P(a codeword fails and is decoded to a wrong codeword: silent)."""
        return self.p_codeword_fail(hours) * self.miscorrection_prob

    def p_sector_fail(self, hours: float) -> float:
        """P(a sector is lost because one of its codewords failed detectably)."""
        pc = self.p_codeword_fail(hours) * (1.0 - self.miscorrection_prob)
        if pc <= 0.0:
            return 0.0
        if pc >= 1.0:
            return 1.0
        cps = self.sector_bytes // self.ecc_codeword_bytes
        return -math.expm1(cps * math.log1p(-pc))

    @property
    def drive_multiplier(self) -> float:
        """This drive's multiplier on `lse_rate`: 1 for ``drive = "mean"``, else the
        `drive` quantile of Gamma(drive_shape, 1/drive_shape)."""
        if self.drive == "mean" or math.isinf(self.drive_shape):
            return 1.0
        got: float | None = self.__dict__.get("_drive_mult")
        if got is None:
            got = nand_field.gamma_quantile(float(self.drive), self.drive_shape)
            object.__setattr__(self, "_drive_mult", got)
        return got

    def ue_drive_day_fraction(self) -> float:
        """Mean over drives of P(a drive-day has a latent sector error): the field's
        "drive-days with an uncorrectable error" (Schroeder et al., FAST 2016)."""
        return nand_field.drive_day_fraction(24.0 * self.lse_rate, self.drive_shape)

    def drives_with_ue(self, years: float) -> float:
        """Fraction of drives with at least one latent sector error in `years` years."""
        return nand_field.drives_with_ue(24.0 * self.lse_rate, self.drive_shape,
                                         365.25 * years)

    def _per_sector_rates(self) -> tuple[float, float]:
        sectors = self.drive_bytes / self.sector_bytes
        return self.lse_rate * self.drive_multiplier / sectors, self.silent_rate / sectors

    # -- classes -------------------------------------------------------------------------------
    def _miscorrection_classes(self, n: int, h: float) -> list[EventClass]:
        """Codewords decoded to a wrong codeword: silent, `miscorrected_bits` wrong data bits
        inside the codeword's part of the buffer. Counted over the codewords the buffer
        touches, Binomial with p = P(miscorrect) / (1 - P(detected failure)), independent of
        the detected sectors (a codeword drawn by both lies inside a lost sector), so that
        P(no ECC event) = (1 - P(fail))^codewords exactly for whole sectors."""
        pm = self.p_codeword_miscorrect(h)
        if pm <= 0.0:
            return []
        pd = self.p_codeword_fail(h) - pm
        p = min(1.0, pm / (1.0 - pd)) if pd < 1.0 else 1.0
        cw = self.ecc_codeword_bytes
        n_cw = -(-n // cw)
        tail = n - (n_cw - 1) * cw
        m = self.miscorrected_bits
        bpe = ((n_cw - 1) * m + min(m, 8 * tail)) / n_cw
        rate = EventRate("silent", n_cw * p, cw, bpe, detected=False,
                         label=f"{self.device_ecc} miscorrection (wrong codeword, silent)")

        def realize(k: int, rng: np.random.Generator) -> ErrorPattern:
            parts = []
            for c in distinct(n_cw, k, rng).tolist():
                width = 8 * (cw if c < n_cw - 1 else tail)
                parts.append(distinct(width, min(m, width), rng) + 8 * cw * c)
            return ErrorPattern(n, np.concatenate(parts))

        return [binomial_class(rate, n_cw, p, realize)]

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
                out.append(nand_raw.raw_bb_class(n, p, rate, self.overdispersion,
                                                  self.ecc_codeword_bytes))
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
            out.extend(self._miscorrection_classes(n, h))

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

        lse = poisson_class(rate_a, realize_lse)
        if q > 0.0:
            def strata() -> list[nand_cluster.Stratum]:
                return nand_cluster.lse_strata(
                    n_s, w, q, lambda secs: ErrorPattern(n, erasures=_sector_erasures(
                        secs, sb, n)))

            lse.strata = strata
        out.append(lse)
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
        pm = self.p_codeword_miscorrect(h)
        pd = self.p_codeword_fail(h) - pm
        p_mis = (min(1.0, pm / (1.0 - pd)) if pd < 1.0 else 1.0) * (
            self.miscorrected_bits / (8.0 * self.ecc_codeword_bytes))
        pf = 1.0 - (1.0 - p_raw) * (1.0 - 0.5 * p_sil) * (1.0 - p_mis)
        return pu, pf

    def params(self) -> dict[str, Any]:
        d: dict[str, Any] = {"model": self.name}
        for fl in fields(self):
            d[fl.name] = getattr(self, fl.name)
        return d

    @classmethod
    def from_params(cls, d: Mapping[str, Any]) -> NandModel:
        return cls(**split_params(d, cls.name, [fl.name for fl in fields(cls)]))
