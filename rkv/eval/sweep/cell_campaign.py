"""A sweep cell's fault campaign for one (bits, code), as its row's ``reliability``; and what
every metric's row uses: finite numbers and sub-seeds.

Below both :mod:`rkv.eval.sweep.cells` (an unplanned cell's reliability is this campaign)
and :mod:`rkv.eval.sweep.planned` (a planned cell runs it once per (bits, code) its plan
stored, and weighs the rows).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from rkv.eval.sweep.spec import campaign_kwargs


def finite(x: float) -> float | None:
    """JSON rows hold finite numbers only: inf and nan (a blown-up model output, or no
    interval from one window) are null."""
    return float(x) if math.isfinite(x) else None


def sub_seed(seed: int, *path: int) -> int:
    """A seed for one part of a cell (``path`` names the part), derived from the cell's."""
    return int(np.random.SeedSequence([seed, *path]).generate_state(1, np.uint64)[0] >> 1)


def reliability(cell: Mapping[str, Any]) -> dict[str, Any]:
    """The cell's fault campaign (one worker: the sweep parallelises over cells)."""
    from rkv.eval.faults.campaign import CampaignConfig, run_campaign

    s = run_campaign(CampaignConfig(**campaign_kwargs(cell)))
    p = s.prediction
    return {
        "blocks": s.blocks, "trials": s.trials, "sampling": s.sampling,
        "p_any_error": s.p_any_error,
        # lo <= rate <= hi exactly: Wilson's bound at k = n can round to just below it.
        "rates": {o: {"n": int(s.counts[o]), "rate": r, "lo": min(lo, r), "hi": max(hi, r)}
                  for o, (r, lo, hi) in s.rates.items()},
        "analytic": {"p_due": finite(p.p_due), "p_sdc": finite(p.p_sdc),
                     "p_corrected": finite(p.p_corrected),
                     "p_degraded": finite(p.p_degraded)},
    }
