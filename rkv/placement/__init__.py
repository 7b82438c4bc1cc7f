"""Placement: each block's tier, bit-width and error-correcting code for a put, from the tiers'
fault models, a measured quality profile (:mod:`rkv.profiles`) and a cost model (see
``docs/placement.md``).

```python
from rkv.placement import BlockInput, PlacementConfig, Planner, TierInput
from rkv.profiles import QualityProfile

planner = Planner(PlacementConfig.load("placement.toml"), profile=QualityProfile.load("kl.json"))
plan = planner.plan(blocks, tiers)          # InfeasiblePlanError names a target it cannot meet
print(plan.table())
```
"""

from __future__ import annotations

from rkv.placement.config import DEFAULT_CODES, BlockInput, PlacementConfig, TierInput
from rkv.placement.errors import InfeasiblePlanError
from rkv.placement.options import DEFAULT_CACHE, ReliabilityCache
from rkv.placement.plan import Plan, PlannedBlock
from rkv.placement.planner import Planner, plan, plan_exact
from rkv.placement.solver import Problem, Solution, solve_exact, solve_fast

__all__ = [
    "DEFAULT_CACHE",
    "DEFAULT_CODES",
    "BlockInput",
    "InfeasiblePlanError",
    "PlacementConfig",
    "Plan",
    "PlannedBlock",
    "Planner",
    "Problem",
    "ReliabilityCache",
    "Solution",
    "TierInput",
    "plan",
    "plan_exact",
    "solve_exact",
    "solve_fast",
]
