"""``rkv scrub PATH``: patrol-scrub a store (see :mod:`rkv.store.scrub`)."""

from __future__ import annotations

import logging
import math
import sys
import threading
from typing import Any

import click

from rkv.cli.common import STORE_PATH, call, command, output_options, quiet_flag

log = logging.getLogger(__name__)


@command("scrub")
@click.argument("path", type=STORE_PATH)
@click.option("--tier", multiple=True, help="scrub only this tier (repeatable)  [default: all]")
@click.option("--budget", type=click.FloatRange(min=0, min_open=True), default=None,
              metavar="MB/s", help="read bandwidth limit  [default: unlimited]")
@click.option("--once", is_flag=True,
              help="one pass, then exit  [default: a pass every --interval hours]")
@click.option("--interval", type=click.FloatRange(min=0, min_open=True), default=None,
              metavar="HOURS", help="time between pass starts  [default: the shortest scrub "
              "interval of the tiers' schedules, see `rkv info --schedule`]")
@click.option("--refresh-hours", type=click.FloatRange(min=0, min_open=True), default=None,
              metavar="HOURS", help="rewrite blocks older than this  [default: per tier, from "
              "its fault model and the store's scrub_target_p_due]")
@click.option("--margin", type=click.IntRange(min=1), default=1,
              help="rewrite a block when its read corrected at least this many symbols")
@output_options()
@quiet_flag("no progress bar")
def scrub_cmd(**kw: Any) -> int:
    """Patrol-scrub a store: read every stored block within a bandwidth budget, riskiest
    first (age against its tier's refresh age, corrections seen); rewrite corrected and aged
    blocks, rebuild uncorrectable ones from a copy in another tier or drop their chunk.
    Readers and writers keep going meanwhile. Exit 1 if a pass lost data."""
    kw["tier"] = list(kw["tier"]) or None
    return call(cmd_scrub, **kw)


def cmd_scrub(args: Any) -> int:
    from rkv.store.engine import Engine
    from rkv.store.scrub import Scrubber, ScrubConfig

    stop = threading.Event()
    with Engine.open(args.path, create=False) as engine:
        tiers = tuple(args.tier) if args.tier else None
        refresh = ({t: args.refresh_hours for t in (tiers or tuple(engine.tiers))}
                   if args.refresh_hours is not None else {})
        cfg = ScrubConfig(budget_mbps=args.budget, tiers=tiers, refresh_hours=refresh,
                          margin=args.margin, interval_hours=args.interval)
        scrubber = Scrubber(engine.core, cfg, stop=stop)
        interval = args.interval or (None if args.once else scrubber.interval_hours())
        if not args.once and interval is not None and math.isfinite(interval):
            scrubber.lead_hours = interval     # refresh what would age past it before then
        worst = 0
        try:
            while True:
                report = _one_pass(scrubber, args.quiet)
                print(report.render(args.fmt), flush=True)
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
    from rkv.ui import Progress

    log.info("scrub pass starting")
    with Progress("scrub", None, unit="block", quiet=quiet) as bar:
        scrubber.progress = bar.advance_to
        return scrubber.run()
