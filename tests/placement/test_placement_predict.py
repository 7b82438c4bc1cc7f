"""A predict()-driven plan on the NVMe preset: no stronger code than max_p_due needs."""

from __future__ import annotations

import itertools
import math

from rkv.placement import BlockInput, PlacementConfig, Planner, ReliabilityCache, TierInput

CODES = ("none", "rs(255,247)", "rs(255,223)", "shardrs(k=16,m=2)")


def test_nvme_picks_the_cheapest_code_meeting_max_p_due() -> None:
    tier = TierInput("nvme", {"preset": "nvme-tlc", "pe_cycles": 3000}, 1 << 36, 6.5, 80.0)
    blocks = [BlockInput(layer, "kv", 0, 256, 24.0, 1.0, 3, 64) for layer in range(3)]
    cache = ReliabilityCache()
    loose = Planner(PlacementConfig(bits=(16,), codes=CODES, max_p_due=1.0), cache=cache)
    loose.warm(blocks, [tier])
    assert len(cache) == len(CODES)
    loose.plan(blocks, [tier])
    t = loose._templates[next(iter(loose._templates))]
    dues = sorted({float(x) for x in t.p_due})
    assert len(dues) >= 2
    for lo, hi in itertools.pairwise(dues):
        limit = math.sqrt(lo * hi)  # between two codes' P(DUE)
        pl = Planner(PlacementConfig(bits=(16,), codes=CODES, max_p_due=limit,
                                     recompute_us_per_token=0.0), cache=cache)
        plan = pl.plan(blocks, [tier])
        meeting = [(int(t.record_bytes[j]), CODES[int(t.code[j])])
                   for j in range(len(CODES)) if t.p_due[j] <= limit]
        smallest = min(meeting)
        for b in plan.blocks:
            assert b.p_due <= limit
            # no DUE cost here: only bytes matter, so the smallest code that meets the limit
            assert (b.record_bytes, b.code) == smallest
            filtered = smallest[1] != "none"  # "none" is the smallest record of all
            assert b.reason == ("cheapest meeting max_p_due" if filtered else "cheapest")
    assert len(cache) == len(CODES)  # every later plan came from the cache
