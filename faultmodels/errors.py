"""The one exception type of `faultmodels`."""

from __future__ import annotations


class FaultModelError(ValueError):
    """Bad fault-model parameters, an unknown preset, or an impossible request."""
