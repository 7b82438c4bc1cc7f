"""``rkv report RESULTS.jsonl``: the Pareto plots, markdown report and terminal summary of a
sweep's results (docs/sweeps.md). Errors are one line and exit status 2 (via ``rkv.cli``)."""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path
from typing import Any

from rkv.errors import InputError


def register(sub: Any) -> None:
    p = sub.add_parser("report", help="Pareto plots, markdown report and summary of a sweep's "
                                      "results (JSONL from rkv sweep): docs/sweeps.md",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("results", help="the results file (JSONL) that rkv sweep wrote")
    p.add_argument("--out", default=None,
                   help="directory for report.md and the figures (default: RESULTS without "
                        "its suffix, plus '-report')")
    p.add_argument("--format", default="png,svg", help="figure formats: png, svg, pdf")
    p.add_argument("--rate", choices=("hi", "point"), default="hi",
                   help="P(SDC) and P(DUE) for the Pareto front: the 95 %% upper bound or the "
                        "point estimate")
    p.add_argument("--max-kl", type=float, default=0.01,
                   help="KL (nats/token) below which the summary calls a setting accurate")
    p.set_defaults(fn=cmd_report)


def default_out(results: Path) -> Path:
    return results.with_name(results.stem + "-report")


def cmd_report(args: argparse.Namespace) -> int:
    from rkv.sweep.report import load_rows, write_report

    results = Path(args.results)
    formats = [f.strip().lower() for f in str(args.format).split(",") if f.strip()]
    if not args.max_kl > 0:
        raise InputError("--max-kl must be positive")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rows = load_rows(results)
    for w in caught:
        print(f"rkv: warning: {w.message}", file=sys.stderr)
    if not rows:
        raise InputError(f"{results}: no result rows")
    out = Path(args.out) if args.out else default_out(results)
    rep = write_report(rows, out, formats=formats, rate=args.rate, max_kl=args.max_kl)
    print(rep.summary)
    print(f"report: {rep.markdown}")
    for f in rep.figures:
        print(f"figure: {f}")
    return 0
