"""A small fault-injection campaign from Python: KV blocks written through rkv's real engine,
corrupted at the tier boundary by a fault model, read back verified, every outcome counted.

Run: ``.venv/bin/python examples/campaign.py [--workers 2] [--trials 20]``.

The campaign runs its trials on a process pool when ``workers > 1``: the worker processes
import this file again, so everything that starts work sits under the ``__main__`` guard
(without it Python refuses to start the pool).
"""

from __future__ import annotations

import argparse

from rkv.eval.faults.campaign import CampaignConfig, run_with_raw
from rkv.eval.faults.campaign_report import format_report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--trials", type=int, default=20)
    args = ap.parse_args()

    # Independent bit flips at a raw BER of 1e-4 (far above any real tier: every block is hit)
    # against a Reed-Solomon code that corrects 8 bytes per 255; then the same faults against
    # the end-to-end checksum alone, which detects but cannot correct. Each campaign runs a
    # second time on raw storage (the values alone, as peers store them) for the verdict.
    faults = {"model": "raw-ber", "ber": 1e-4}
    for protection in ("rs(255,239)", "none"):
        cfg = CampaignConfig(tier="dram", fault_model=faults, protection=protection,
                             trials=args.trials, blocks=4, workers=args.workers, seed=1)
        summary, raw = run_with_raw(cfg)
        print(format_report(summary, raw))        # what `rkv campaign` prints, verdict first
        print()


if __name__ == "__main__":
    main()
