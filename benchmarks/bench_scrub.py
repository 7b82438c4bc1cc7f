"""Scrubbing over time: P(DUE) per block-day with and without the patrol scrubber.

    .venv/bin/python benchmarks/bench_scrub.py [--trials 40] [--target 1e-2]

Campaigns over time (:mod:`rkv.eval.faults.overtime`: a real engine on a simulated clock, faults
arriving in time from the tier's model, the real :class:`rkv.store.scrub.Scrubber`):

1. **The check.** NVMe at heavy wear: ``nvme-tlc`` at 10,000 P/E cycles (30 C), the tier's
   ``shardrs(k=16,m=2)``, 192 KiB blocks held 120 days on average (exponential), one year,
   32 blocks x ``--trials`` stores. The schedule (:mod:`rkv.reliability.schedule`) gives the
   scrub interval and refresh age for ``--target`` P(DUE) per block; the scrubbed store runs
   at exactly those, the baseline (same run, same seeds) without scrubbing. The target per
   block-day is ``target x 24 / interval``; rates carry exact 95 % Poisson intervals. The
   target is far above a production one (1e-9) so that a year of simulated blocks can show
   it: the mechanism (retention errors growing with age) is the same at any target.
2. **The curve.** DUE per block-day against the scrub interval, per default tier: dram-ddr5
   and cxl accelerated 10,000x (``ber_multiplier``) with their default residencies (1 h, 8 h),
   and the worn NVMe of part 1; the scrubber corrects and drops but never refreshes by age
   here (refresh age inf), so the curve shows what reading alone buys.

Results: benchmarks/results/scrub.json; figure: docs/img/scrub_due_vs_interval.png.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

from rkv.eval.faults.overtime import OverTimeConfig, run_over_time
from rkv.reliability.schedule import schedule

WORN_NVME = {"tier": "nvme", "fault_model": {"preset": "nvme-tlc", "pe_cycles": 10000}}
NVME_RUN = {"days": 365.0, "blocks": 32, "residency_hours": 24 * 120.0}
CURVES: dict[str, dict[str, Any]] = {
    "dram": {"campaign": {"tier": "dram", "ber_multiplier": 1e4}, "days": 3.0,
             "intervals": [None, 0.25, 1.0, 4.0]},
    "cxl": {"campaign": {"tier": "cxl", "ber_multiplier": 1e4}, "days": 6.0,
            "intervals": [None, 1.0, 4.0, 16.0]},
    "nvme": {"campaign": WORN_NVME, "days": 365.0, "residency_hours": 24 * 120.0,
             "intervals": [None, 24 * 7.0, 24 * 21.0, 24 * 48.0, 24 * 96.0]},
}


def _run(cfg: OverTimeConfig) -> dict[str, Any]:
    t0 = time.perf_counter()
    d = run_over_time(cfg).to_dict()
    d["seconds"] = time.perf_counter() - t0
    return d


def check(trials: int, target: float) -> dict[str, Any]:
    base = OverTimeConfig(campaign=WORN_NVME, trials=trials, **NVME_RUN)  # type: ignore[arg-type]
    b = base.base()
    t0 = time.perf_counter()
    s = schedule(b.model(), b.effective_protection(), b.data_bytes, target)
    sched_s = time.perf_counter() - t0
    interval = float(s.scrub_hours)
    refresh = float(s.refresh_hours) if s.refresh_hours > 0 else math.inf
    per_day = target * 24.0 / interval
    runs = {"no scrub": _run(base),
            "scrub at the schedule": _run(OverTimeConfig(
                campaign=WORN_NVME, trials=trials, scrub_hours=interval,
                refresh_hours=refresh, **NVME_RUN))}   # type: ignore[arg-type]
    off, on = runs["no scrub"]["due"], runs["scrub at the schedule"]["due"]
    return {"model": "nvme-tlc, 10,000 P/E, 30 C", "code": b.effective_protection(),
            "data_bytes": b.data_bytes, "target_p_due": target,
            "scrub_hours": interval, "refresh_hours": refresh, "schedule_s": sched_s,
            "target_per_block_day": per_day, "runs": runs,
            "unscrubbed_above_target": off["lo"] > per_day,
            "scrubbed_below_target": on["hi"] < per_day,
            "ratio_unscrubbed_to_scrubbed_upper": off["per_block_day"] / on["hi"]}


def curves(trials: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for tier, c in CURVES.items():
        rows = []
        for interval in c["intervals"]:
            cfg = OverTimeConfig(campaign=c["campaign"], days=c["days"], blocks=32,
                                 trials=trials, residency_hours=c.get("residency_hours"),
                                 scrub_hours=interval, refresh_hours=math.inf)
            r = _run(cfg)
            rows.append({"scrub_hours": interval, **r})
            print(f"  {tier} scrub {interval}: DUE {r['due']} ({r['seconds']:.0f} s)",
                  flush=True)
        out[tier] = {"campaign": c["campaign"], "days": c["days"], "rows": rows,
                     "residency_hours": c.get("residency_hours")}
    return out


def plot(data: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(data), figsize=(4.2 * len(data), 3.6))
    for ax, (tier, d) in zip(axes, data.items(), strict=True):
        from matplotlib.ticker import NullFormatter

        rows = [r for r in d["rows"] if r["scrub_hours"] is not None]
        none = next(r for r in d["rows"] if r["scrub_hours"] is None)["due"]
        seen = [r for r in rows if r["due"]["n"] > 0]
        ys = [r["due"]["per_block_day"] for r in seen]
        ax.errorbar([r["scrub_hours"] for r in seen], ys,
                    yerr=[[y - r["due"]["lo"] for y, r in zip(ys, seen, strict=True)],
                          [r["due"]["hi"] - y for y, r in zip(ys, seen, strict=True)]],
                    fmt="o-", capsize=3, label="scrubbed (95 % CI)")
        zero = [r for r in rows if r["due"]["n"] == 0]
        if zero:
            ax.plot([r["scrub_hours"] for r in zero], [r["due"]["hi"] for r in zero], "v",
                    color="tab:blue", ms=8, label="scrubbed, none seen: upper bound")
        ax.axhspan(none["lo"], none["hi"], color="tab:red", alpha=0.15)
        ax.axhline(none["per_block_day"], color="tab:red", ls="--",
                   label="no scrub (95 % CI)")
        if "target_per_block_day" in d:
            ax.axhline(d["target_per_block_day"], color="black", ls=":",
                       label="target per block-day")
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_yscale("log")
        ax.set_xlabel("scrub interval (hours)")
        ax.set_title(f"{tier}: {_label(d)}", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("DUE per block-day")
    axes[-1].legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def _label(d: dict[str, Any]) -> str:
    c = d["campaign"]
    fm = c.get("fault_model")
    name = (f"{fm['preset']} {fm.get('pe_cycles', '')} P/E" if isinstance(fm, dict)
            else f"default x{c.get('ber_multiplier', 1):g}")
    return f"{name}, {d['days']:g} days"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=40)
    ap.add_argument("--curve-trials", type=int, default=4)
    ap.add_argument("--target", type=float, default=1e-2)
    ap.add_argument("--out", default="benchmarks/results/scrub.json")
    ap.add_argument("--figure", default="docs/img/scrub_due_vs_interval.png")
    ap.add_argument("--replot", action="store_true",
                    help="redraw the figure from --out without running anything")
    args = ap.parse_args()
    if args.replot:
        plot(json.loads(Path(args.out).read_text())["curves"], Path(args.figure))
        return
    t0 = time.perf_counter()
    res = {"benchmark": "bench_scrub", "check": check(args.trials, args.target)}
    c = res["check"]
    print(f"check: interval {c['scrub_hours']:.0f} h, refresh {c['refresh_hours']:.0f} h, "
          f"target {c['target_per_block_day']:.3g}/block-day")
    for name, r in c["runs"].items():
        print(f"  {name}: DUE {r['due']}, block-days {r['block_days']:.0f}")
    res["curves"] = curves(args.curve_trials)
    res["curves"]["nvme"]["target_per_block_day"] = c["target_per_block_day"]
    res["seconds"] = time.perf_counter() - t0
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=2) + "\n")
    plot(res["curves"], Path(args.figure))
    print(f"results: {args.out}; figure: {args.figure}")


if __name__ == "__main__":
    main()
