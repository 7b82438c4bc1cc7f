"""``rkv campaign --days N [--scrub HOURS]``: a campaign over time
(:mod:`rkv.eval.faults.overtime`), with and without scrubbing, side by side."""

from __future__ import annotations

import json
import logging
import math
import sys
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

import click

log = logging.getLogger(__name__)
F = TypeVar("F", bound=Callable[..., Any])


def _scrub_hours(ctx: click.Context, param: click.Parameter, value: str) -> str | float:
    """``--scrub``: 'auto' or positive hours, checked before any work."""
    if value == "auto":
        return value
    try:
        hours = float(value)
    except ValueError:
        raise click.BadParameter(f"--scrub expects hours or 'auto', got {value!r}") from None
    if not (0 < hours < math.inf):
        raise click.BadParameter(f"--scrub expects hours > 0 or 'auto', got {value!r}")
    return hours


_TIME_OPTIONS = [
    click.option("--days", type=click.FloatRange(min=0, min_open=True), default=None,
                 help="simulate a store over this many days instead of one residency: blocks "
                      "written, aging, read at the end of their residency, with and without "
                      "scrubbing (--trials: stores, default 4; --blocks: blocks kept in it, "
                      "default 32)"),
    click.option("--scrub", default="auto", metavar="HOURS|auto", callback=_scrub_hours,
                 help="with --days: scrub interval (auto: the tier's schedule at --target)"),
    click.option("--refresh-hours", type=click.FloatRange(min=0, min_open=True), default=None,
                 help="with --days: the scrubber's refresh age  [default: the tier's "
                      "schedule]"),
    click.option("--residency-hours", type=click.FloatRange(min=0, min_open=True),
                 default=None, help="with --days: mean residency of a block (exponential)  "
                 "[default per tier: dram 1 h, cxl 8 h, nvme 7 days]"),
    click.option("--target", type=click.FloatRange(min=0, max=1, min_open=True,
                                                   max_open=True),
                 default=1e-9, help="with --days: P(DUE) per block the schedule meets"),
]


def time_options(f: F) -> F:
    """The ``--days`` options of ``rkv campaign``."""
    for option in reversed(_TIME_OPTIONS):
        f = option(f)
    return f


def run_time_campaign(args: Any, campaign: Any) -> int:
    """Run ``campaign`` over ``args.days`` without and with scrubbing; print or --json."""
    from rkv.errors import ConfigError
    from rkv.eval.faults.overtime import OverTimeConfig, run_over_time
    from rkv.reliability.schedule import schedule

    camp = {k: v for k, v in campaign.to_dict().items()
            if k not in ("trials", "blocks", "workers", "rows", "sampling", "tilt", "hours")}
    base = OverTimeConfig(campaign=camp, days=args.days, blocks=args.blocks or 32,
                          trials=args.trials or 4, residency_hours=args.residency_hours,
                          refresh_hours=args.refresh_hours, target_p_due=args.target,
                          seed=campaign.seed)
    b = base.base()
    sched = None
    if args.scrub == "auto" or args.refresh_hours is None:
        if not args.quiet:
            print("computing the tier's scrub schedule from its fault model...",
                  file=sys.stderr, flush=True)
        sched = schedule(b.model(), b.effective_protection(), b.data_bytes, args.target)
    if args.scrub == "auto":
        assert sched is not None
        interval = float(sched.scrub_hours)
        if not (0 < interval < math.inf):
            raise ConfigError(f"the schedule gives no finite scrub interval "
                              f"({sched.scrub_hours}); give --scrub HOURS")
    else:
        interval = float(args.scrub)
    refresh = args.refresh_hours
    if refresh is None and sched is not None:
        refresh = float(sched.refresh_hours) if sched.refresh_hours > 0 else math.inf
    runs = {"no scrub": replace(base, scrub_hours=None),
            f"scrub every {interval:g} h": replace(base, scrub_hours=interval,
                                                   refresh_hours=refresh)}
    fm = b.fault_model
    label = (" ".join([str(fm.get("preset") or fm.get("model", "?"))]
                      + [f"{k}={v}" for k, v in fm.items() if k not in ("preset", "model")])
             if isinstance(fm, dict) else str(fm or f"{b.tier} default"))
    out: dict[str, Any] = {"tier": b.tier, "model": label,
                           "protection": b.effective_protection(),
                           "ber_multiplier": b.ber_multiplier, "days": args.days,
                           "residency_hours": base.residency, "target_p_due": args.target,
                           "target_per_block_day": args.target * 24.0 / interval,
                           "runs": {}}
    for name, cfg in runs.items():
        if not args.quiet and not args.json:
            print(f"running: {name} ({cfg.trials} x {cfg.blocks} blocks, {cfg.days:g} days)",
                  file=sys.stderr)
        log.info("over time: %s, %d stores x %d blocks, %g days", name, cfg.trials,
                 cfg.blocks, cfg.days)
        out["runs"][name] = run_over_time(cfg).to_dict()
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"{b.tier}: {out['model']} x{b.ber_multiplier:g}, {out['protection']}, "
          f"{args.days:g} days, mean residency {base.residency:g} h (exponential)")
    print(f"target P(DUE) {args.target:g} per block per scrub interval = "
          f"{out['target_per_block_day']:.3g} per block-day")
    from rkv.ui import Column, echo_table

    rows = [{"run": name, "block_days": r["block_days"],
             "due": f"{r['due']['per_block_day']:.3g} [{r['due']['lo']:.2g}, "
                    f"{r['due']['hi']:.2g}] ({r['due']['n']})",
             "sdc": r["sdc"]["n"], "corrected": r["scrub"].get("corrected", 0),
             "refreshed": r["scrub"].get("refreshed", 0), "scrub_mbps": r["scrub_mb_per_s"]}
            for name, r in out["runs"].items()]
    sys.stdout.flush()
    echo_table(rows, [Column("run", ""), Column("block_days", "block-days", "right", ".1f"),
                      Column("due", "DUE/block-day [95% CI]", "right"),
                      Column("sdc", "SDC", "right"), Column("corrected", align="right"),
                      Column("refreshed", align="right"),
                      Column("scrub_mbps", "scrub MB/s", "right", ".3g")])
    return 0
