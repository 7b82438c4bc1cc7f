"""The engine's access log: one JSON line per get or put, for replaying real workloads.

The format is the ``accesslog`` trace format of :mod:`rkv.format.traces` (``rkv replay --format
accesslog``). Lines are appended with ``O_APPEND`` in one ``write`` each, so several processes
can log to one file; a line holds chunk keys, never tokens or KV.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

from rkv.tiers.lmdbenv import translate


class AccessLog:
    """Appends access records to ``path`` (created if missing)."""

    def __init__(self, path: str | os.PathLike[str], chunk_tokens: int) -> None:
        self.path = Path(path)
        self.chunk_tokens = chunk_tokens
        self._lock = threading.Lock()
        try:
            self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT
                                           | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise translate(exc, f"opening the access log {self.path}") from exc

    def record(self, op: str, fingerprint: bytes, keys: list[bytes], tokens: int) -> None:
        line = json.dumps({"t": time.time(), "op": op, "model": fingerprint.hex(),
                           "chunks": [k.hex() for k in keys], "tokens": tokens,
                           "chunk_tokens": self.chunk_tokens}, separators=(",", ":"))
        data = (line + "\n").encode()
        with self._lock:
            if self._fd is None:
                return
            try:
                os.write(self._fd, data)
            except OSError as exc:
                raise translate(exc, f"writing the access log {self.path}") from exc

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
