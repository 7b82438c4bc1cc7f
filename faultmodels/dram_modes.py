"""The DRAM fault-mode table: mode names, their SC12 rates and `DramMode` (one mode's rates
and optional footprint overrides).

Rates: FIT per device (transient, permanent) from Sridharan & Liberty, "A Study of DRAM
Failures in the Field", SC12 (Jaguar field data), the per-mode table that AMD's FaultSim
(Nair et al.) hard-codes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .checks import as_float, as_int, check_keys
from .errors import FaultModelError

__all__ = ["MODE_KIND", "MODE_NAMES", "SC12_FIT", "DramMode", "default_modes", "mode_from_dict",
           "normalize_modes"]

MODE_NAMES = (
    "single-bit",
    "single-word",
    "single-column",
    "single-row",
    "single-bank",
    "multi-bank",
    "multi-rank",
)
MODE_KIND = {
    "single-bit": "bit",
    "single-word": "word",
    "single-column": "column",
    "single-row": "row",
    "single-bank": "bank",
    "multi-bank": "bank",
    "multi-rank": "bank",
}
#: FIT per device (transient, permanent): Sridharan & Liberty, SC12 (as in AMD FaultSim).
SC12_FIT: dict[str, tuple[float, float]] = {
    "single-bit": (14.2, 18.6),
    "single-word": (1.4, 0.3),
    "single-column": (1.4, 5.6),
    "single-row": (0.2, 8.2),
    "single-bank": (0.8, 10.0),
    "multi-bank": (0.3, 1.4),
    "multi-rank": (0.9, 2.8),
}
@dataclass(frozen=True)
class DramMode:
    """Rates and footprint of one fault mode. `None` footprint fields are derived from the
    model's geometry (see `DramModel.resolved_modes`). Modes left out of a model keep their
    SC12 rates; set both FITs to 0 to switch a mode off."""

    fit_transient: float
    fit_permanent: float
    span_bytes: int | None = None
    stride_bytes: int | None = None
    bits_per_word: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "fit_transient",
                           as_float(self.fit_transient, "fit_transient", lo=0.0))
        object.__setattr__(self, "fit_permanent",
                           as_float(self.fit_permanent, "fit_permanent", lo=0.0))
        for k in ("span_bytes", "stride_bytes", "bits_per_word"):
            v = getattr(self, k)
            if v is not None:
                object.__setattr__(self, k, as_int(v, k, lo=1))

    def params(self) -> dict[str, Any]:
        d: dict[str, Any] = {"fit_transient": self.fit_transient,
                             "fit_permanent": self.fit_permanent}
        for k in ("span_bytes", "stride_bytes", "bits_per_word"):
            v = getattr(self, k)
            if v is not None:
                d[k] = v
        return d


def default_modes() -> tuple[tuple[str, DramMode], ...]:
    return tuple((m, DramMode(*SC12_FIT[m])) for m in MODE_NAMES)


def mode_from_dict(name: str, d: Mapping[str, Any]) -> DramMode:
    allowed = ("fit_transient", "fit_permanent", "span_bytes", "stride_bytes", "bits_per_word")
    check_keys(d, allowed, f"dram mode {name}")
    base = SC12_FIT[name]
    try:
        return DramMode(
            d.get("fit_transient", base[0]),
            d.get("fit_permanent", base[1]),
            d.get("span_bytes"),
            d.get("stride_bytes"),
            d.get("bits_per_word"),
        )
    except FaultModelError as e:
        raise FaultModelError(f"dram mode {name}: {e}") from None


def normalize_modes(modes: Any) -> tuple[tuple[str, DramMode], ...]:
    """``dram.modes`` as given (a mapping or pairs; dicts or DramModes) as every mode in
    :data:`MODE_NAMES` order, the ones not given at their SC'12 FITs."""
    items = modes.items() if isinstance(modes, Mapping) else modes
    got: dict[str, DramMode] = {}
    try:
        for name, m in items:
            if name not in MODE_NAMES:
                raise FaultModelError(
                    f"dram: unknown fault mode {name!r}; modes: {', '.join(MODE_NAMES)}")
            if isinstance(m, Mapping):
                m = mode_from_dict(name, m)
            if not isinstance(m, DramMode):
                raise FaultModelError(f"dram: mode {name!r} must be a DramMode or a dict")
            got[name] = m
    except (TypeError, ValueError) as e:
        if isinstance(e, FaultModelError):
            raise
        raise FaultModelError(f"dram.modes must map mode names to modes: {e}") from None
    for name in MODE_NAMES:
        got.setdefault(name, DramMode(*SC12_FIT[name]))
    return tuple((name, got[name]) for name in MODE_NAMES)
