"""The reliability model of byte planes against campaigns through the real read path.

Byte planes are predicted part by part (each plane as a record of its own under its own
code): an approximation that charges each part a header and counts a clustered event that
spans both planes in both. These tests sit where that could be wrong: both planes failing
often under independent bits, and 4 KiB sector losses that span the planes of a 16 KiB block.
Two-sided: the observed count must lie within |z| < 3.5 of the analytic rate, conditioned
(for clustered presets) on the block having been hit, as ``rkv validate`` does.
"""

from __future__ import annotations

import pytest

from rkv.eval.faults.campaign import CampaignConfig, run_campaign
from rkv.eval.faults.validate import z_score

BLOCK = {"chunk_tokens": 64, "kv_heads": 2, "head_dim": 32}     # 16 KiB of float16


@pytest.mark.parametrize("protection,ber", [
    ("planes(high=rs(255,251),low=rs(255,251),tolerant=1)", 2e-4),
    ("planes(high=rs(255,239),low=none,tolerant=1)", 5e-6),
    ("planes(high=rs(255,251),low=rs(255,251),tolerant=0)", 2e-4),
])
def test_independent_bits_due_and_degraded_rates(protection: str, ber: float) -> None:
    cfg = CampaignConfig(tier="nvme", fault_model={"model": "raw-ber", "ber": ber},
                         protection=protection, hours=1.0, trials=40, blocks=10, seed=11,
                         sampling="direct", **BLOCK)
    s = run_campaign(cfg)
    p = s.prediction
    n = s.blocks
    for outcome, rate in (("due", p.p_due), ("degraded", p.p_degraded)):
        z = z_score(s.counts[outcome], n, rate)
        assert abs(z) < 3.5, (outcome, s.counts[outcome], n * rate)
    assert s.counts["sdc"] == 0
    if "tolerant=0" in protection:
        assert s.counts["degraded"] == 0 and p.p_degraded == 0
    else:
        assert p.p_degraded > 0.05 and s.counts["degraded"] > 0


def test_sector_losses_that_span_both_planes() -> None:
    """NAND latent sector errors (4 KiB, reported by the drive): with a 16 KiB block a lost
    sector falls in the high plane, the low plane or across both; conditioned on a hit."""
    cfg = CampaignConfig(tier="nvme", fault_model={"preset": "nvme-tlc", "pe_cycles": 3000},
                         protection="planes(high=rs(255,223,interleave=8),low=rs(255,247))",
                         hours=2000.0, trials=30, blocks=10, seed=3, sampling="conditional",
                         **BLOCK)
    s = run_campaign(cfg)
    p = s.prediction
    hit = s.blocks - s.counts["clean"]
    for outcome, rate in (("due", p.p_due), ("degraded", p.p_degraded)):
        z = z_score(s.counts[outcome], hit, rate / p.p_error)
        assert abs(z) < 3.5, (outcome, s.counts[outcome], hit * rate / p.p_error)
    assert s.counts["sdc"] == 0
