"""`cxl`: DRAM media behind a CXL device controller, plus the controller and the link.

Sources (docs/faultmodels/cxl.md):

* Media: a `DramModel` (default: the DDR5 geometry with on-die ECC and a SEC-DED device
  ECC), its FIT rates scaled by ``media_multiplier``. No field study of CXL memory errors
  exists yet; recycled-DIMM CXL devices (CXL-PPR, IEEE CAL 2025) motivate the multiplier.
* Uncorrectable media errors are returned as poison at 64-byte granularity (Linux CXL
  documentation); here they are erasures of kind ``"poison"`` (detected).
* A device controller failure loses the whole region (``lost``). Its rate,
  ``controller_fit``, is an assumption (no published field data).
* The link: PCIe 5 / CXL 1.1-2.0 target BER 1e-12 (secondary), 528-bit flits (64-byte
  payload) protected by CRC-16 with link-level retry; about 2^-16 of multi-bit-corrupted
  flits escape the CRC. An escaped flit delivers a burst of wrong bits to one read only
  (``transient``). The number of escaped flits per read of the buffer is
  Binomial(ceil(n / 64), p) with p = P(flit has a bit error) x multibit fraction x 2^-16.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from ._dist import distinct
from .base import (
    ErrorPattern,
    EventClass,
    EventRate,
    FaultModel,
    binomial_class,
    poisson_class,
)
from .catalog import deep_merge, registered, spec_params
from .checks import as_float, as_int, as_str, split_params
from .dram import DramModel
from .errors import FaultModelError

__all__ = ["CxlModel", "default_cxl_media"]


def default_cxl_media() -> DramModel:
    """DDR5-like media (16 Gb x8 devices, 32-bit sub-channels, on-die ECC, SEC-DED)."""
    return DramModel(device_bytes=2 << 30, device_width=8, bus_bits=32, banks=32, ranks=2,
                     row_bytes=4096, system_ecc="secded", on_die_ecc=True)


def _dram_media(d: dict[str, Any]) -> DramModel | None:
    """The media model the parameters ``d`` describe, or None when they name no DRAM model
    class (the caller refuses that). A class registered under the name counts, as for
    `get_model`; the shipped "dram" is `DramModel` (the registry may not have added it yet)."""
    name = d.get("model")
    cls = registered(name) or (DramModel if name == DramModel.name else None)
    if cls is None or not issubclass(cls, DramModel):
        return None
    return cls.from_params(d)


@dataclass(frozen=True)
class CxlModel(FaultModel):
    """CXL-attached memory: media faults (poisoned), controller loss, link escapes."""

    name: ClassVar[str] = "cxl"

    media: DramModel = field(default_factory=default_cxl_media)
    media_multiplier: float = 1.0
    controller_fit: float = 100.0
    region_bytes: int = 256 << 30
    link_ber: float = 1e-12
    flit_bits: int = 528
    flit_payload_bytes: int = 64
    link_multibit_fraction: float = 1.0
    crc_escape: float = 2.0 ** -16
    link_burst_bits: int = 32
    source: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.media, DramModel):
            raise FaultModelError("cxl.media must be a dram model")
        set_ = object.__setattr__
        set_(self, "media_multiplier",
             as_float(self.media_multiplier, "cxl.media_multiplier", lo=0.0))
        set_(self, "controller_fit", as_float(self.controller_fit, "cxl.controller_fit", lo=0.0))
        set_(self, "region_bytes", as_int(self.region_bytes, "cxl.region_bytes", lo=1))
        set_(self, "link_ber", as_float(self.link_ber, "cxl.link_ber", lo=0.0, hi=0.5))
        set_(self, "flit_bits", as_int(self.flit_bits, "cxl.flit_bits", lo=8))
        set_(self, "flit_payload_bytes",
             as_int(self.flit_payload_bytes, "cxl.flit_payload_bytes", lo=1))
        if 8 * self.flit_payload_bytes > self.flit_bits:
            raise FaultModelError("cxl.flit_payload_bytes does not fit in cxl.flit_bits")
        set_(self, "link_multibit_fraction",
             as_float(self.link_multibit_fraction, "cxl.link_multibit_fraction", lo=0.0, hi=1.0))
        set_(self, "crc_escape", as_float(self.crc_escape, "cxl.crc_escape", lo=0.0, hi=1.0))
        set_(self, "link_burst_bits", as_int(self.link_burst_bits, "cxl.link_burst_bits", lo=1))
        if self.link_burst_bits > 8 * self.flit_payload_bytes:
            raise FaultModelError("cxl.link_burst_bits is longer than the flit payload")
        set_(self, "source", as_str(self.source, "cxl.source"))

    @property
    def scaled_media(self) -> DramModel:
        """The media model with its FIT rates multiplied by `media_multiplier`."""
        got: DramModel | None = self.__dict__.get("_scaled_media")
        if got is None:
            got = dataclasses.replace(
                self.media, fit_multiplier=self.media.fit_multiplier * self.media_multiplier)
            object.__setattr__(self, "_scaled_media", got)
        return got

    @property
    def latent_hours(self) -> float:
        """The media's latent window (`DramModel.latent_hours`); the controller and the link
        have no latent faults (a dead controller fails the write, a link error one read)."""
        return self.media.latent_hours

    def with_latent_hours(self, hours: float) -> CxlModel:
        return dataclasses.replace(
            self, media=dataclasses.replace(self.media, latent_hours=hours))

    def p_flit_escape(self) -> float:
        """Probability that one flit delivers corrupted data past the CRC."""
        p_err = -math.expm1(self.flit_bits * math.log1p(-self.link_ber))
        return p_err * self.link_multibit_fraction * self.crc_escape

    def _link_bits_per_event(self) -> float:
        b = self.link_burst_bits
        return 1.0 if b == 1 else b / 2.0 + 1.0

    def _build_classes(self, nbytes: int, hours: float) -> list[EventClass]:
        n, h = nbytes, hours
        out = list(self.scaled_media._classes(n, h))
        # controller failure: the whole region (and so this buffer) is lost
        region = EventRate("region", self.controller_fit * 1e-9 * h, self.region_bytes,
                           4.0 * n, detected=True, label="device controller failure")

        def realize_region(k: int, rng: np.random.Generator) -> ErrorPattern:
            return ErrorPattern(n, lost=True)

        out.append(poisson_class(region, realize_region))
        # link: escaped flits on one read of the buffer
        pay = self.flit_payload_bytes
        n_flits = -(-n // pay)
        p = self.p_flit_escape()
        link = EventRate("link", n_flits * p, pay, self._link_bits_per_event(),
                         transient=True, detected=False, label="flit escaping CRC (one read)")
        burst = self.link_burst_bits

        def realize_link(k: int, rng: np.random.Generator) -> ErrorPattern:
            flits = distinct(n_flits, k, rng)
            valid = np.minimum(8 * pay, 8 * n - flits * 8 * pay)
            length = np.minimum(burst, valid)
            start = (rng.random(k) * (valid - length + 1)).astype(np.int64)
            base = flits * 8 * pay + start
            pos = [base, base + length - 1]
            if burst > 2:
                inner = np.arange(1, burst - 1, dtype=np.int64)
                hit = (rng.random((k, burst - 2)) < 0.5) & (inner[None, :] < (length - 1)[:, None])
                pos.append((base[:, None] + inner[None, :])[hit])
            return ErrorPattern(n, np.unique(np.concatenate(pos)), transient=True)

        out.append(binomial_class(link, n_flits, p, realize_link))
        return out

    def _bit_probs(self, hours: float) -> tuple[float, float]:
        pu, pf = self.scaled_media._bit_probs(hours)
        p_lost = -math.expm1(-self.controller_fit * 1e-9 * hours)
        p_link = self.p_flit_escape() * self._link_bits_per_event() / (8 * self.flit_payload_bytes)
        pu = 1.0 - (1.0 - pu) * (1.0 - p_lost)
        pf = 1.0 - (1.0 - pf) * (1.0 - p_link)
        return pu, pf

    def params(self) -> dict[str, Any]:
        return {
            "model": self.name,
            "source": self.source,
            "media_multiplier": self.media_multiplier,
            "controller_fit": self.controller_fit,
            "region_bytes": self.region_bytes,
            "link_ber": self.link_ber,
            "flit_bits": self.flit_bits,
            "flit_payload_bytes": self.flit_payload_bytes,
            "link_multibit_fraction": self.link_multibit_fraction,
            "crc_escape": self.crc_escape,
            "link_burst_bits": self.link_burst_bits,
            "media": self.media.params(),
        }

    @classmethod
    def from_params(cls, d: Mapping[str, Any]) -> CxlModel:
        kw = split_params(d, cls.name, [f.name for f in dataclasses.fields(cls)])
        if "media" in kw:
            media = kw["media"]
            if isinstance(media, (str, Mapping)):
                spec: Any = media
                if isinstance(media, Mapping) and "preset" not in media:
                    # a partial table overrides the default CXL media
                    spec = deep_merge(default_cxl_media().params(), media)
                media = _dram_media(spec_params(spec))
            if not isinstance(media, DramModel):
                raise FaultModelError("cxl.media must describe a dram model")
            kw["media"] = media
        return cls(**kw)
