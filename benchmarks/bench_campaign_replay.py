"""``rkv campaign --replay TRIAL``: one trial again, against the way it used to size the
record (a full ``predict`` of the protection under the fault model, then the trial), both
measured in this run on the default campaign (``rkv campaign``'s defaults: ``nvme-tlc``,
``shardrs(k=16,m=2)``, 192 KiB blocks, 24 h).

    .venv/bin/python benchmarks/bench_campaign_replay.py [--repeats 3] [--json PATH]

A replay is a command of its own, so each is timed in a fresh process (``predict``'s
answers are cached within a process: a second replay in the same one would hide the
cost), wall clock from start to exit, imports and numba's first compile included, the two
ways interleaved. Medians, their ratio and the load average are printed and written as
JSON; the rows of both ways are checked equal (same seed, same outcome).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
NEW = ("import json; from rkv.eval.faults.campaign import CampaignConfig, replay_trial\n"
       "print(json.dumps(replay_trial(CampaignConfig(), {trial})))")
# The earlier replay_trial: a full prediction only to learn the record's size.
OLD = ("import json; from rkv.eval.faults.campaign import CampaignConfig, replay_trial\n"
       "from rkv.reliability.analytic import predict\n"
       "cfg = CampaignConfig()\n"
       "p = predict(cfg.protection_pipeline(), cfg.data_bytes, cfg.model(), cfg.hours)\n"
       "assert p.record_bytes == cfg.record_bytes()\n"
       "print(json.dumps(replay_trial(cfg, {trial})))")


def _run(code: str) -> tuple[float, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, check=True).stdout
    return time.perf_counter() - t, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    load0 = os.getloadavg()
    new_s: list[float] = []
    old_s: list[float] = []
    for trial in range(args.repeats):
        dt, row_new = _run(NEW.format(trial=trial))
        new_s.append(dt)
        dt, row_old = _run(OLD.format(trial=trial))
        old_s.append(dt)
        assert row_new == row_old, (row_new, row_old)
    out = {"replays": len(new_s), "median_new_s": round(statistics.median(new_s), 3),
           "median_old_s": round(statistics.median(old_s), 3),
           "ratio_old_over_new": round(statistics.median(old_s) / statistics.median(new_s), 2),
           "new_s": [round(x, 3) for x in new_s], "old_s": [round(x, 3) for x in old_s],
           "loadavg_before": [round(x, 2) for x in load0],
           "loadavg_after": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count()}
    print(json.dumps(out, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
