"""Run a sweep: skip the cells whose key the results file has, run the others on an
executor, append each row as it arrives (so a killed sweep resumes where it stopped)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rkv.eval.sweep.cells import run_cell
from rkv.eval.sweep.executors import CellError, Executor, make_executor
from rkv.eval.sweep.results import ResultsFile
from rkv.eval.sweep.spec import Sweep, cell_key, describe
from rkv.ui.progress import Progress

log = logging.getLogger(__name__)


def safe_cell(config: Mapping[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """:func:`run_cell`, with an error turned into a message (so one bad cell does not stop
    the others, and the worker's traceback need not pickle)."""
    try:
        return run_cell(config), ""
    except Exception as exc:
        return None, f"{type(exc).__name__}: {exc}"


@dataclass
class SweepRun:
    """What a run did: cells run now, cells found done, failures, and the sweep's rows
    (every cell of the grid that has one, in grid order)."""

    results: Path
    ran: list[str] = field(default_factory=list)
    skipped: int = 0
    failed: dict[str, str] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)
    wall_s: float = 0.0
    cell_s: float = 0.0          # the cells' own time (sum of timings.total_s of new rows)
    executor: str = "serial"
    workers: int = 1
    torn: bool = False


def run_sweep(sweep: Sweep, *, executor: str | Executor = "process",
              workers: int | None = None, ray_address: str | None = None,
              results: str | Path | None = None, progress: bool = True,
              on_row: Callable[[dict[str, Any]], None] | None = None) -> SweepRun:
    """Run the cells of ``sweep`` that ``results`` (default: the sweep's) lacks.

    ``on_row`` is called after each row is appended (a hook: tests raise from it to kill
    the sweep at a known point)."""
    rf = ResultsFile(results or sweep.results)
    keys = sweep.cell_keys()
    pending = [(k, c) for k, c in zip(keys, sweep.cells, strict=True) if k not in rf]
    out = SweepRun(rf.path, skipped=len(keys) - len(pending), torn=rf.torn)
    log.info("sweep %s: %d cells, %d done before, %d to run", sweep.name, len(keys),
             out.skipped, len(pending))
    t0 = time.perf_counter()
    if pending:
        ex = executor if isinstance(executor, Executor) else make_executor(
            executor if len(pending) > 1 else "serial", workers, ray_address)
        out.executor, out.workers = ex.name, ex.workers
        bar = Progress(f"sweep {sweep.name}", len(pending), unit="cell", quiet=not progress)
        try:
            with bar:
                for i, (row, err) in ex.map(safe_cell, [c for _, c in pending]):
                    key, cell = pending[i]
                    bar.update(1)
                    if row is None:
                        out.failed[key] = f"cell {{{describe(cell)}}}: {err}"
                        log.info("sweep %s: %s", sweep.name, out.failed[key])
                        bar.write(f"failed: {out.failed[key]}")
                        continue
                    full = {"key": key, "sweep": sweep.name, **row}
                    rf.append(full)
                    out.ran.append(key)
                    out.cell_s += float(row["timings"]["total_s"])
                    log.info("sweep %s: cell %s done in %.1f s: {%s}", sweep.name, key,
                             float(row["timings"]["total_s"]), describe(cell))
                    if on_row is not None:
                        on_row(full)
        finally:
            if not isinstance(executor, Executor):
                ex.close()
    out.wall_s = time.perf_counter() - t0
    out.rows = [rf.rows[k] for k in keys if k in rf.rows]
    return out


def check_failures(run: SweepRun) -> None:
    if run.failed:
        first = next(iter(run.failed.values()))
        raise CellError(f"{len(run.failed)} cell(s) failed (rerun to retry them); first: "
                        f"{first}")


__all__ = ["SweepRun", "cell_key", "check_failures", "run_sweep", "safe_cell"]
