"""Progress for long runs: a rich bar with count, rate and ETA on a terminal; off a terminal
(a log file, CI, a pipe) plain lines on stderr at every 10 % (at most one per ``min_gap_s``)
and at least every ``every_s`` seconds, and a last line with the total time.

A :class:`Progress` is a context manager. ``update(n)`` may be called from any thread (a
worker pool's ``add_done_callback`` runs in the pool's thread), though the usual way is the
main thread consuming ``as_completed``. ``total`` may be unknown (``None``) or set later.
``RKV_PROGRESS=off`` silences every progress display; ``RKV_PROGRESS=plain`` asks for the
plain lines on a terminal too.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from types import TracebackType
from typing import Any, TextIO

__all__ = ["Progress", "format_seconds"]

log = logging.getLogger(__name__)


def _num(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def format_seconds(s: float) -> str:
    """``42 s``, ``3 min 5 s``, ``2 h 4 min``."""
    s = max(0.0, s)
    if s < 60:
        return f"{s:.0f} s" if s >= 10 else f"{s:.1f} s"
    if s < 3600:
        return f"{int(s // 60)} min {int(s % 60)} s"
    return f"{int(s // 3600)} h {int(s % 3600 // 60)} min"


class Progress:
    """Count work done: ``with Progress("campaign", 100, unit="trial") as p: ... p.update()``.

    ``quiet`` shows nothing; ``file`` (default stderr) is where it goes; ``tty`` overrides
    the terminal test (``True``: the bar, ``False``: plain lines). ``initial`` units are
    already done (a resumed run): counted, but not in the rate."""

    def __init__(self, desc: str, total: int | None = None, *, unit: str = "it",
                 quiet: bool = False, file: TextIO | None = None, tty: bool | None = None,
                 every_s: float = 10.0, min_gap_s: float = 1.0, initial: int = 0) -> None:
        if total is not None and total < 0:
            raise ValueError(f"progress total must be >= 0, got {total}")
        self.desc, self.total, self.unit = desc, total, unit
        self.file = sys.stderr if file is None else file
        env = os.environ.get("RKV_PROGRESS", "").strip().lower()
        self.quiet = quiet or env in ("off", "0", "no", "false")
        if tty is None:
            tty = env != "plain" and _is_tty(self.file)
        self.tty = tty
        self.every_s, self.min_gap_s = every_s, min_gap_s
        self.n = self.initial = initial
        self._lock = threading.Lock()
        self._t0 = self._last = time.monotonic()
        self._last_decile = min(10, initial * 10 // total) if total else 0
        self._rich: Any = None
        self._task: Any = None
        self._closed = False
        self._note = ""

    # -- context manager ----------------------------------------------------------------
    def __enter__(self) -> Progress:
        self._t0 = self._last = time.monotonic()
        if not self.quiet and self.tty:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TaskProgressColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.progress import Progress as RichProgress

            self._rich = RichProgress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                TaskProgressColumn(), TextColumn("{task.fields[rate]}"),
                TextColumn("ETA"), TimeRemainingColumn(), TextColumn("elapsed"),
                TimeElapsedColumn(), TextColumn("{task.fields[note]}", markup=False),
                console=Console(file=self.file, force_terminal=True), transient=False)
            self._rich.start()
            self._task = self._rich.add_task(self.desc, total=self.total, rate="", note="",
                                             completed=self.n)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close(failed=exc_type is not None)

    def close(self, failed: bool = False) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._rich is not None:
                self._rich.stop()
            elif not self.quiet and (self.n > self.initial or self.total):
                self._line(final=not failed)
        log.debug("%s: %d %s(s) in %.1f s", self.desc, self.n, self.unit,
                  time.monotonic() - self._t0)

    # -- counting -------------------------------------------------------------------------
    def update(self, n: int = 1, note: str | None = None) -> None:
        """``n`` more units done; ``note`` (e.g. what runs now) is shown next to the count."""
        with self._lock:
            self.n += n
            if note is not None:
                self._note = note
            self._show()

    def advance_to(self, done: int, total: int | None = None) -> None:
        """``done`` units done in all (a ``(done, total)`` callback's view)."""
        with self._lock:
            if total is not None:
                self._set_total(total)
            self.n = done
            self._show()

    def set_total(self, total: int | None) -> None:
        with self._lock:
            self._set_total(total)

    def write(self, message: str) -> None:
        """A message line that does not break the bar (unless quiet)."""
        if self.quiet:
            return
        with self._lock:
            if self._rich is not None:
                self._rich.console.print(message, markup=False, highlight=False)
            else:
                print(message, file=self.file, flush=True)

    # -- display --------------------------------------------------------------------------
    def _set_total(self, total: int | None) -> None:
        self.total = total
        if self._rich is not None:
            self._rich.update(self._task, total=total)

    def _rate(self, now: float) -> float:
        dt = now - self._t0
        return (self.n - self.initial) / dt if dt > 0 else 0.0

    def _show(self) -> None:
        if self.quiet or self._closed:
            return
        now = time.monotonic()
        if self._rich is not None:
            rate = self._rate(now)
            self._rich.update(self._task, completed=self.n, note=self._note,
                              rate=f"{_num(rate)} {self.unit}s/s" if rate else "")
            return
        due = now - self._last >= self.every_s
        if self.total:
            decile = min(10, self.n * 10 // self.total)
            if decile > self._last_decile and now - self._last >= self.min_gap_s:
                due = True
        if due and not (self.total and self.n >= self.total):   # the last line says "done"
            self._line(final=False)

    def _line(self, final: bool) -> None:
        now = time.monotonic()
        self._last = now
        if self.total:
            self._last_decile = min(10, self.n * 10 // self.total)
        rate = self._rate(now)
        elapsed = now - self._t0
        count = f"{self.n}/{self.total}" if self.total is not None else f"{self.n}"
        unit = self.unit if self.n == 1 and self.total in (None, 1) else self.unit + "s"
        text = f"{self.desc}: {count} {unit}"
        if self.total:
            text += f" ({100 * self.n / self.total:.0f}%)"
        if final:
            text += f", done in {format_seconds(elapsed)}"
            if rate:
                text += f" ({_num(rate)} {self.unit}s/s)"
        else:
            text += f", {_num(rate)} {self.unit}s/s" if rate else ""
            if self.total and rate and self.n < self.total:
                text += f", ETA {format_seconds((self.total - self.n) / rate)}"
            else:
                text += f", {format_seconds(elapsed)} elapsed"
            if self._note:
                text += f"; {self._note}"
        print(text, file=self.file, flush=True)


def _is_tty(file: TextIO) -> bool:
    try:
        return bool(file.isatty())
    except (AttributeError, ValueError):
        return False
