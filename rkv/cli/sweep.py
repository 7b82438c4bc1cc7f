"""``rkv sweep FILE``: run a quality-versus-reliability sweep (resumable), then write its
report and print a short summary. See docs/sweeps.md."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import click

from rkv.cli.common import OUT_FILE, call, command, quiet_flag
from rkv.eval.sweep.executors import EXECUTORS

log = logging.getLogger(__name__)


@command("sweep")
@click.argument("file", default="default")
@click.option("--results", type=OUT_FILE, default=None,
              help="results file (JSON Lines)  [default: the sweep's [sweep] results, else "
                   "sweep-results/NAME/results.jsonl]")
@click.option("--executor", type=click.Choice(EXECUTORS), default="process",
              help="where cells run (process: a pool of worker processes)")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="worker processes  [default: the CPUs this process may use]")
@click.option("--ray-address", default=None,
              help="join this Ray cluster ('auto' or ray://host:10001) instead of starting a "
                   "local Ray")
@click.option("--report-dir", type=click.Path(file_okay=False), default=None,
              help="where the report goes  [default: next to the results, report/]")
@click.option("--no-report", is_flag=True, help="run the cells only")
@click.option("--list", "list", is_flag=True,
              help="list the cells (done or to run) and exit")
@quiet_flag("no progress bar")
def sweep_cmd(**kw: Any) -> int:
    """Run a quality-versus-reliability sweep over tiers, fault rates, bits and codes, then
    write its report and print a short summary. FILE is a sweep file (TOML) or 'default'
    for the shipped default sweep. Resumable: cells already in the results file are kept
    (docs/sweeps.md)."""
    return call(cmd_sweep, **kw)


def cmd_sweep(args: Any) -> int:
    from rkv.eval.sweep.results import ResultsFile
    from rkv.eval.sweep.run import check_failures, run_sweep
    from rkv.eval.sweep.spec import describe, load_sweep

    sweep = load_sweep(args.file)
    log.info("sweep %s: %d cells", sweep.name, len(sweep.cells))
    results = Path(args.results) if args.results else sweep.results
    if args.list:
        done = ResultsFile(results, repair=False)
        for key, cell in zip(sweep.cell_keys(), sweep.cells, strict=True):
            print(f"{key}  {'done' if key in done else 'todo'}  {describe(cell)}")
        return 0
    done_before = ResultsFile(results, repair=False)
    todo = sum(1 for k in sweep.cell_keys() if k not in done_before)
    print(f"sweep {sweep.name}: {len(sweep.cells)} cells, {len(sweep.cells) - todo} already "
          f"in {results}, {todo} to run ({args.executor})", file=sys.stderr)
    run = run_sweep(sweep, executor=args.executor, workers=args.workers,
                    ray_address=args.ray_address, results=results, progress=not args.quiet)
    if run.torn:
        print(f"{results}: dropped a torn last line (a killed run); its cell ran again",
              file=sys.stderr)
    if run.ran:
        print(f"ran {len(run.ran)} cells in {run.wall_s:.1f} s on {run.executor} "
              f"({run.workers} worker(s)); results: {results}", file=sys.stderr)
    if not args.no_report and run.rows:
        from rkv.eval.sweep.report import summary, write_report

        out_dir = Path(args.report_dir) if args.report_dir else results.parent / "report"
        rep = write_report(run.rows, out_dir)
        print(summary(run.rows))
        print(f"\nreport: {rep.markdown}")
        for fig in rep.figures:
            print(f"figure: {fig}")
        if rep.note:
            log.warning("%s; then rkv report %s --out %s draws them", rep.note, results,
                        out_dir)
    check_failures(run)
    return 0
