"""``rkv scrub PATH``: patrol-scrub a store (see :mod:`rkv.scrub`)."""

from __future__ import annotations

import argparse
import json
import math
import sys
import threading
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser(
        "scrub", help="patrol-scrub a store: correct, refresh, repair or drop blocks",
        description="Read every stored block within a bandwidth budget, riskiest first "
                    "(age against its tier's refresh age, corrections seen); rewrite corrected "
                    "and aged blocks, rebuild uncorrectable ones from a copy in another tier "
                    "or drop their chunk. Readers and writers keep going meanwhile.")
    p.add_argument("path", help="store directory")
    p.add_argument("--tier", action="append", default=None,
                   help="scrub only this tier (repeatable; default: all)")
    p.add_argument("--budget", type=float, default=None, metavar="MB/s",
                   help="read bandwidth limit (default: unlimited)")
    p.add_argument("--once", action="store_true",
                   help="one pass, then exit (default: a pass every --interval hours)")
    p.add_argument("--interval", type=float, default=None, metavar="HOURS",
                   help="time between pass starts (default: the shortest scrub interval of "
                        "the tiers' schedules, see `rkv info`)")
    p.add_argument("--refresh-hours", type=float, default=None, metavar="HOURS",
                   help="rewrite blocks older than this (default: per tier, from its fault "
                        "model and the store's scrub_target_p_due)")
    p.add_argument("--margin", type=int, default=1,
                   help="rewrite a block when its read corrected at least this many symbols")
    p.add_argument("--json", action="store_true", help="print each pass's report as JSON")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(fn=cmd_scrub)


def cmd_scrub(args: argparse.Namespace) -> int:
    from rkv.engine import Engine
    from rkv.scrub import Scrubber, ScrubConfig

    stop = threading.Event()
    with Engine.open(args.path, create=False) as engine:
        tiers = tuple(args.tier) if args.tier else None
        refresh = ({t: args.refresh_hours for t in (tiers or tuple(engine.tiers))}
                   if args.refresh_hours is not None else {})
        cfg = ScrubConfig(budget_mbps=args.budget, tiers=tiers, refresh_hours=refresh,
                          margin=args.margin, interval_hours=args.interval)
        scrubber = Scrubber(engine, cfg, stop=stop)
        interval = args.interval or (None if args.once else scrubber.interval_hours())
        if not args.once and interval is not None and math.isfinite(interval):
            scrubber.lead_hours = interval     # refresh what would age past it before then
        worst = 0
        try:
            while True:
                report = _one_pass(scrubber, args.quiet)
                print(json.dumps(report.to_dict(), indent=2) if args.json else report.render(),
                      flush=True)
                worst = max(worst, 1 if report.total("lost") else 0)
                if args.once or report.interrupted:
                    break
                if interval is None or not math.isfinite(interval):
                    print("no scrub interval (no tier's fault model needs one): stopping; "
                          "give --interval to keep scrubbing", file=sys.stderr)
                    break
                print(f"next pass in {interval:g} h (Ctrl-C stops)", file=sys.stderr)
                if stop.wait(interval * 3600.0):
                    break
        except KeyboardInterrupt:
            stop.set()
            print("scrub stopped", file=sys.stderr)
    return worst


def _one_pass(scrubber: Any, quiet: bool) -> Any:
    from tqdm import tqdm  # type: ignore[import-untyped]

    bar = tqdm(total=0, unit="block", desc="scrub", disable=quiet or None, file=sys.stderr)

    def progress(done: int, total: int) -> None:
        if bar.total != total:
            bar.total = total
        bar.update(done - bar.n)

    scrubber.progress = progress
    try:
        return scrubber.run()
    finally:
        bar.close()
