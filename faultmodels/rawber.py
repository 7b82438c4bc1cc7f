"""`raw-ber`: independent bit flips at a fixed bit error rate (for sweeps).

Each of the 8*nbytes bits of a buffer is flipped independently with probability ``ber``
(time-independent: the residency does not matter), or, with ``per_hour = true``, with
probability ``1 - exp(-ber * hours)`` (``ber`` is then a rate of upsets per bit-hour; a bit
upset once stays wrong). The number of flips is Binomial(8n, p) at uniform distinct positions.
Nothing is detected: this is the "no protection" reference model.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import numpy as np

from ._dist import distinct
from .base import ErrorPattern, EventClass, EventRate, FaultModel, binomial_class
from .checks import as_bool, as_float, as_str, check_hours, split_params

__all__ = ["RawBerModel"]


@dataclass(frozen=True)
class RawBerModel(FaultModel):
    """Independent bit flips with probability `ber` per bit (per residency, or per hour)."""

    name: ClassVar[str] = "raw-ber"

    ber: float = 1e-6
    per_hour: bool = False
    source: str = ""

    def __post_init__(self) -> None:
        per_hour = as_bool(self.per_hour, "raw-ber.per_hour")
        hi = None if per_hour else 1.0
        object.__setattr__(self, "ber", as_float(self.ber, "raw-ber.ber", lo=0.0, hi=hi))
        object.__setattr__(self, "source", as_str(self.source, "raw-ber.source"))

    def p_bit(self, hours: float) -> float:
        """Probability that a given bit is flipped after `hours`."""
        h = check_hours(hours)
        if self.per_hour:
            return -math.expm1(-self.ber * h)
        return self.ber

    def params(self) -> dict[str, Any]:
        return {"model": self.name, "ber": self.ber, "per_hour": self.per_hour,
                "source": self.source}

    @classmethod
    def from_params(cls, d: Mapping[str, Any]) -> RawBerModel:
        return cls(**split_params(d, cls.name, (f.name for f in fields(cls))))

    def _build_classes(self, nbytes: int, hours: float) -> list[EventClass]:
        p = self.p_bit(hours)
        nbits = 8 * nbytes

        def realize(k: int, rng: np.random.Generator) -> ErrorPattern:
            return ErrorPattern(nbytes, distinct(nbits, k, rng))

        rate = EventRate("bit", nbits * p, 1, 1.0, label="independent bit flip")
        return [binomial_class(rate, nbits, p, realize)]

    def _bit_probs(self, hours: float) -> tuple[float, float]:
        return 0.0, self.p_bit(hours)
