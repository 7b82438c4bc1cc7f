"""The rkv vLLM connector's counters, and the JSON file it keeps them in (``stats_file``).

Each connector role counts what it did (lookups and hits on the scheduler side; loads,
verified and failed blocks, saves on the worker side). With ``stats_file`` set the counters
are written to that file (the scheduler's to ``<stats_file>.scheduler``) whenever they
changed, at most every ``every_s`` seconds and always when asked to flush, atomically (a
reader never sees half a file), so a test or a dashboard in another process can read them.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any


class Counters:
    """Thread-safe named counters plus a few named facts (``info``)."""

    def __init__(self, path: str | None = None, every_s: float = 0.2) -> None:
        self._lock = threading.Lock()
        self._c: Counter[str] = Counter()
        self.info: dict[str, Any] = {}
        self.path = Path(path) if path else None
        self.every_s = every_s
        self._dirty = False
        self._written = 0.0

    def add(self, **counts: int | float) -> None:
        with self._lock:
            for k, v in counts.items():
                self._c[k] += v  # type: ignore[assignment]
            self._dirty = True

    def set(self, **facts: Any) -> None:
        with self._lock:
            self.info.update(facts)
            self._dirty = True

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {"pid": os.getpid(), **self.info, **dict(self._c)}

    def get(self, name: str) -> float:
        with self._lock:
            return self._c.get(name, 0)

    def write(self, force: bool = False) -> None:
        """Write the file if something changed (and ``every_s`` passed, unless ``force``)."""
        if self.path is None:
            return
        now = time.monotonic()
        with self._lock:
            if not self._dirty or (not force and now - self._written < self.every_s):
                return
            self._dirty = False
            self._written = now
            data = {"pid": os.getpid(), **self.info, **dict(self._c)}
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(data, sort_keys=True, default=str))
            os.replace(tmp, self.path)
