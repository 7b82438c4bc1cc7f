"""``rkv report RESULTS.jsonl``: the Pareto plots, markdown report and terminal summary of a
sweep's results (docs/sweeps.md). Errors are one line and exit status 2 (via :mod:`rkv.cli`)."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

import click

from rkv.cli.common import call, command, split_list
from rkv.errors import InputError

log = logging.getLogger(__name__)


@command("report")
@click.argument("results")
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="directory for report.md and the figures  [default: RESULTS without its "
                   "suffix, plus '-report']")
@click.option("--format", "format", default="png,svg", callback=split_list,
              help="figure formats: png, svg, pdf")
@click.option("--rate", type=click.Choice(["hi", "point"]), default="hi",
              help="P(SDC) and P(DUE) for the Pareto front: the 95 % upper bound or the "
                   "point estimate")
@click.option("--max-kl", type=float, default=0.01,
              help="KL (nats/token) below which the summary calls a setting accurate")
def report_cmd(**kw: Any) -> int:
    """Pareto plots, markdown report and terminal summary of a sweep's results (the JSON
    Lines file `rkv sweep` wrote; docs/sweeps.md)."""
    return call(cmd_report, **kw)


def default_out(results: Path) -> Path:
    return results.with_name(results.stem + "-report")


def cmd_report(args: Any) -> int:
    from rkv.eval.sweep.report import load_rows, write_report

    results = Path(args.results)
    formats = [f.strip().lower() for f in str(args.format).split(",") if f.strip()]
    if not args.max_kl > 0:
        raise InputError("--max-kl must be positive")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rows = load_rows(results)
    for w in caught:
        log.warning("%s", w.message)
    log.info("%s: %d rows", results, len(rows))
    if not rows:
        raise InputError(f"{results}: no result rows")
    out = Path(args.out) if args.out else default_out(results)
    rep = write_report(rows, out, formats=formats, rate=args.rate, max_kl=args.max_kl)
    print(rep.summary)
    print(f"report: {rep.markdown}")
    for f in rep.figures:
        print(f"figure: {f}")
    if rep.note:
        log.warning("%s", rep.note)
    return 0
