"""Sweep results: one JSON object per line, keyed by the cell's hash, appended as cells finish.

Appends are crash-safe: each row is one ``write`` of a complete line, flushed and fsynced. A
run killed mid-write leaves at most a torn *last* line (no newline, or not JSON); the next
open detects it, truncates it away and runs that cell again. A line that is not a valid row
anywhere else means the file was damaged or edited: :class:`ResultsError`, naming the line.
A key seen twice keeps its last row. This is the one reader of results files: ``rkv report``
(:func:`rkv.eval.sweep.report_rows.load_rows`) checks each row's fields on top of it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rkv.errors import InputError
from rkv.specs import strict_json

REQUIRED = ("key", "sweep", "config", "version", "timings", "reliability", "quality", "cost")
#: Longest row accepted (a real row is a few KiB): a hostile file cannot make us parse 1 GB.
MAX_LINE = 1 << 20


class ResultsError(InputError):
    """A results file has a damaged line before its last one (not a torn append)."""


def _row(line: bytes, path: Path, lineno: int) -> dict[str, Any]:
    """One line as a row (strict JSON: no NaN, no repeated keys, bounded size and depth)."""
    try:
        if len(line) > MAX_LINE:
            raise ValueError(f"row longer than {MAX_LINE} bytes")
        row = strict_json(line.decode("utf-8"))
    except (ValueError, RecursionError) as exc:       # UnicodeDecodeError is a ValueError
        why = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise ResultsError(f"{path}:{lineno}: not a JSON row ({why})") from exc
    if not isinstance(row, dict):
        raise ResultsError(f"{path}:{lineno}: row: expected an object, got "
                           f"{type(row).__name__}")
    missing = [k for k in REQUIRED if k not in row]
    if missing:
        raise ResultsError(f"{path}:{lineno}: not a sweep row (missing {', '.join(missing)})")
    return row


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two rows of one key agree (timings and code version aside)."""
    skip = ("timings", "version")
    return {k: v for k, v in a.items() if k not in skip} == {
        k: v for k, v in b.items() if k not in skip}


class ResultsFile:
    """The rows of one results file; :meth:`append` adds one durably. ``repair`` truncates a
    torn last line away on open (the runner does; readers only skip it). ``lines``: each
    key's line number; ``torn_line``: the torn line's number; ``conflicts``: line numbers of
    rows that replaced an earlier, different row of their key."""

    def __init__(self, path: str | Path, *, repair: bool = True) -> None:
        self.path = Path(path)
        self.rows: dict[str, dict[str, Any]] = {}
        self.lines: dict[str, int] = {}
        self.conflicts: list[int] = []
        self.torn_line: int | None = None
        if self.path.exists():     # a regular file of at most 1 GiB, else an InputError
            from rkv.inputs import MAX_RESULTS_BYTES, read_bytes

            good_end = self._load(read_bytes(self.path, "results file",
                                             limit=MAX_RESULTS_BYTES, error=InputError))
            if self.torn_line is not None and repair:
                self._truncate(good_end)

    def _load(self, data: bytes) -> int:
        """Read the rows; returns the length of the file without a torn last line."""
        lines = data.split(b"\n")       # the last item is what follows the last newline
        offset = 0
        for i, line in enumerate(lines):
            last_line = i == len(lines) - 1 or (i == len(lines) - 2 and not lines[-1])
            if line.strip():
                try:
                    row = _row(line, self.path, i + 1)
                except ResultsError:
                    if last_line:
                        self.torn_line = i + 1
                        return offset
                    raise
                if i == len(lines) - 1:     # complete JSON without its newline: torn too
                    self.torn_line = i + 1
                    return offset
                old = self.rows.get(row["key"])
                if old is not None and not _same(old, row):
                    self.conflicts.append(i + 1)
                self.rows[row["key"]] = row
                self.lines[row["key"]] = i + 1
            offset += len(line) + 1
        return len(data)

    def _truncate(self, size: int) -> None:
        with open(self.path, "r+b") as fh:
            fh.truncate(size)
            fh.flush()
            os.fsync(fh.fileno())

    def _write(self, data: bytes) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "ab") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())

    def append(self, row: dict[str, Any]) -> None:
        """Add ``row`` (one line, fsynced) and remember it."""
        for k in REQUIRED:
            if k not in row:
                raise ValueError(f"row has no {k!r}")
        line = json.dumps(row, sort_keys=True, allow_nan=False).encode() + b"\n"
        self._write(line)
        self.rows[row["key"]] = row

    @property
    def torn(self) -> bool:
        """Whether the file ended in a torn line."""
        return self.torn_line is not None

    def __contains__(self, key: object) -> bool:
        return key in self.rows

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.rows.values())

    def __len__(self) -> int:
        return len(self.rows)


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Every row of a results file (a torn last line is skipped, the file left as it is)."""
    return list(ResultsFile(path, repair=False))
