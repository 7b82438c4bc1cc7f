"""The placement planner's own error type (a :class:`rkv.errors.ConfigError`)."""

from __future__ import annotations

from rkv.errors import ConfigError


class InfeasiblePlanError(ConfigError):
    """No placement meets the targets. The message names the binding constraint (a block's
    ``max_p_due`` / ``max_p_sdc``, ``quality_budget_kl`` or a tier's free capacity) and the
    best value the options reach, so the caller can relax it; the planner never downgrades a
    target silently. ``constraint`` is the constraint's name (``"max_p_due"``,
    ``"max_p_sdc"``, ``"quality_budget_kl"``, ``"capacity"``, ``"combined"``)."""

    def __init__(self, message: str, constraint: str) -> None:
        super().__init__(message)
        self.constraint = constraint
