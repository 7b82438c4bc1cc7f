"""Record the golden campaigns of the fault-injection harness (tests/test_harness.py).

Recorded before the harness replaced ``campaign._Bench``'s own injection, so that the test
proves the refactor kept every trial's faults and outcomes byte for byte. Rerun only when a
deliberate change to sampling or classification is meant to change campaign results:

    .venv/bin/python tests/golden/make_harness_golden.py
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from rkv.eval.faults.campaign import CampaignConfig, run_campaign

HERE = Path(__file__).parent
GOLDEN = HERE / "campaign_harness.json"
SMALL = {"chunk_tokens": 64, "kv_heads": 1, "head_dim": 64}
PLANES = {"chunk_tokens": 64, "kv_heads": 2, "head_dim": 32}

#: Small campaigns over every path of the harness: engine and raw storage, direct and
#: conditional sampling, quantized blocks, erasures (NAND sectors), transient link errors
#: (CXL), byte planes (degraded reads) and importance sampling.
CASES: dict[str, dict[str, Any]] = {
    "rs_direct": dict(fault_model={"model": "raw-ber", "ber": 3e-5},
                      protection="rs(255,251)", trials=6, blocks=3, seed=11,
                      sampling="direct", **SMALL),
    "nvme_conditional": dict(tier="nvme", trials=5, blocks=3, seed=2, **SMALL),
    "raw_direct": dict(fault_model={"model": "raw-ber", "ber": 2e-5}, protection="raw",
                       trials=5, blocks=3, seed=4, sampling="direct", **SMALL),
    "raw_nvme_conditional": dict(tier="nvme", protection="raw", trials=5, blocks=3, seed=6,
                                 **SMALL),
    "kivi4_rs": dict(fault_model={"model": "raw-ber", "ber": 1e-4}, protection="rs(255,239)",
                     bits=4, trials=5, blocks=3, seed=8, sampling="direct", **SMALL),
    "kivi4_raw": dict(fault_model={"model": "raw-ber", "ber": 1e-4}, protection="raw",
                      bits=4, trials=5, blocks=3, seed=9, sampling="direct", **SMALL),
    "cxl_conditional": dict(tier="cxl", hours=720.0, trials=5, blocks=3, seed=3, **SMALL),
    "cxl_link_direct": dict(fault_model={"preset": "cxl", "link_ber": 1e-4, "crc_escape": 0.05},
                            tier="cxl", trials=5, blocks=3, seed=12, sampling="direct",
                            **SMALL),
    "raw_cxl_link_direct": dict(fault_model={"preset": "cxl", "link_ber": 1e-4,
                                             "crc_escape": 0.05},
                                tier="cxl", protection="raw", trials=5, blocks=3, seed=12,
                                sampling="direct", **SMALL),
    "nvme_default_block": dict(tier="nvme", trials=3, blocks=2, seed=1),
    "planes_direct": dict(fault_model={"model": "raw-ber", "ber": 2e-4},
                          protection="planes(high=rs(255,251),low=rs(255,251),tolerant=1)",
                          trials=5, blocks=4, seed=11, sampling="direct", **PLANES),
    "tilted": dict(fault_model={"model": "raw-ber", "ber": 4e-7}, protection="rs(255,239)",
                   tilt=30.0, trials=5, blocks=3, seed=5, **SMALL),
}

#: Keys of the summary JSON that are measured, not computed.
TIMINGS = ("seconds", "blocks_per_second")


def record(case: dict[str, Any]) -> dict[str, Any]:
    """The summary (without timings and config) and the per-trial rows of one campaign."""
    with tempfile.TemporaryDirectory() as d:
        rows_path = Path(d) / "rows.jsonl"
        s = run_campaign(CampaignConfig(rows=str(rows_path), **case))
        rows = [json.loads(line) for line in rows_path.read_text().splitlines()]
    summary = {k: v for k, v in s.to_json().items() if k not in TIMINGS and k != "config"}
    return {"summary": json.loads(json.dumps(summary)), "rows": rows}


def main() -> None:
    out = {name: {"case": case, **record(case)} for name, case in CASES.items()}
    GOLDEN.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {GOLDEN}")


if __name__ == "__main__":
    main()
