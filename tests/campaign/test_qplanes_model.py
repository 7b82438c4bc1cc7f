"""The reliability model of quantized planes (a planes spec on a KIVI 4-bit block: metadata
strict, packed codes tolerant) against Monte-Carlo campaigns through the real read path.

``predict`` judges the block's bound ``qplanes`` layout part by part (the metadata and the
codes as two records' worth of codewords in one record). Two-sided: the observed DUE and
degraded counts must lie within |z| < 3.5 of the analytic rates; a degraded block must hold
every value within its KIVI group's range (else the harness calls it an SDC)."""

from __future__ import annotations

import pytest

from rkv.eval.faults.campaign import CampaignConfig, run_campaign
from rkv.eval.faults.validate import z_score

BLOCK = {"chunk_tokens": 64, "kv_heads": 2, "head_dim": 32}     # 7264 bytes at 4 bits


@pytest.mark.parametrize("protection,ber", [
    ("planes(high=rs(255,251),low=rs(255,251),tolerant=1)", 2e-4),
    ("planes(high=rs(255,251),low=rs(255,251),tolerant=0)", 2e-4),
    ("planes(high=rs(255,239),low=none,tolerant=1)", 1e-3),
])
def test_independent_bits_due_and_degraded_rates(protection: str, ber: float) -> None:
    cfg = CampaignConfig(tier="nvme", fault_model={"model": "raw-ber", "ber": ber},
                         protection=protection, hours=1.0, trials=40, blocks=10, seed=5,
                         sampling="direct", bits=4, **BLOCK)
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
