"""Sweep results: one JSON object per line, keyed by the cell's hash, appended as cells finish.

Appends are crash-safe: each row is one ``write`` of a complete line, flushed and fsynced. A
run killed mid-write leaves at most a torn *last* line (no newline, or not JSON); the next
open detects it, truncates it away and runs that cell again. A line that is not a valid row
anywhere else means the file was damaged or edited: :class:`ResultsError`, naming the line.
A key seen twice keeps its last row.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rkv.errors import InputError

REQUIRED = ("key", "sweep", "config", "version", "timings", "reliability", "quality", "cost")


class ResultsError(InputError):
    """A results file has a damaged line before its last one (not a torn append)."""


def _row(line: bytes, path: Path, lineno: int) -> dict[str, Any]:
    try:
        row = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ResultsError(f"{path}:{lineno}: not a JSON row ({exc})") from exc
    if not isinstance(row, dict) or any(k not in row for k in REQUIRED):
        missing = [k for k in REQUIRED if not isinstance(row, dict) or k not in row]
        raise ResultsError(f"{path}:{lineno}: not a sweep row (missing {', '.join(missing)})")
    return row


class ResultsFile:
    """The rows of one results file; :meth:`append` adds one durably. ``repair`` truncates a
    torn last line away on open (the runner does; readers only skip it)."""

    def __init__(self, path: str | Path, *, repair: bool = True) -> None:
        self.path = Path(path)
        self.rows: dict[str, dict[str, Any]] = {}
        self.torn = False            # whether the file ended in a torn line
        if self.path.exists():
            good_end = self._load(self.path.read_bytes())
            if self.torn and repair:
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
                        self.torn = True
                        return offset
                    raise
                if i == len(lines) - 1:     # complete JSON without its newline: torn too
                    self.torn = True
                    return offset
                self.rows[row["key"]] = row
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

    def __contains__(self, key: object) -> bool:
        return key in self.rows

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.rows.values())

    def __len__(self) -> int:
        return len(self.rows)


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Every row of a results file (a torn last line is skipped, the file left as it is)."""
    return list(ResultsFile(path, repair=False))
