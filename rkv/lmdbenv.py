"""Shared handling of LMDB environments: one handle per path and process, map growth.

LMDB forbids opening one environment twice in a process, and an environment must never be
used across ``fork``. Handles are therefore shared per real path and tagged with the pid that
opened them; a handle used in another process raises :class:`StoreClosedError`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import lmdb

from rkv.errors import StoreClosedError, TierFullError

T = TypeVar("T")
_lock = threading.Lock()
_open: dict[str, tuple[SharedEnv, int]] = {}
#: Hard ceiling for automatic map growth.
MAX_MAP_BYTES = 1 << 44


class SharedEnv:
    """An LMDB environment with named databases, shared by every user in one process."""

    def __init__(self, path: Path, *, map_size: int, dbs: tuple[bytes, ...], sync: bool) -> None:
        path.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.pid = os.getpid()
        self.env = lmdb.open(
            str(path), map_size=map_size, max_dbs=len(dbs) + 1, sync=sync, metasync=sync,
            readahead=False, max_readers=512, subdir=True, lock=True,
        )
        # Another process may have grown the map already: adopt its size.
        self.env.set_mapsize(max(map_size, self.env.info()["map_size"]))
        self.dbs = {name: self.env.open_db(name) for name in dbs}
        self._grow_lock = threading.Lock()

    def check(self) -> None:
        if os.getpid() != self.pid:
            raise StoreClosedError(
                f"LMDB environment {self.path} was opened in process {self.pid}; "
                "open the store again in this process instead of inheriting it across fork"
            )

    def db(self, name: bytes) -> Any:
        return self.dbs[name]

    @contextmanager
    def read(self) -> Iterator[Any]:
        self.check()
        try:
            txn = self.env.begin(buffers=True)
        except lmdb.MapResizedError:
            self.env.set_mapsize(0)  # adopt the size another process grew the map to
            txn = self.env.begin(buffers=True)
        try:
            yield txn
        finally:
            txn.abort()

    def write(self, fn: Callable[[Any], T], *, reserve: int = 0) -> T:
        """Run ``fn(txn)`` in a write transaction, growing the map and retrying when full.

        ``reserve`` (bytes about to be written) grows the map ahead of time, so a large batch
        does not fail and retry once per doubling.
        """
        self.check()
        if reserve:
            self.ensure_room(reserve)
        while True:
            try:
                txn = self.env.begin(write=True)
            except lmdb.MapResizedError:
                self.env.set_mapsize(0)
                continue
            try:
                result = fn(txn)
                txn.commit()
                return result
            except lmdb.MapFullError:
                txn.abort()
                self.grow()
            except BaseException:
                txn.abort()
                raise

    def grow(self, at_least: int = 0) -> None:
        with self._grow_lock:
            size = self.env.info()["map_size"]
            if size >= MAX_MAP_BYTES:
                raise TierFullError(f"LMDB map at {self.path} reached {size} bytes")
            self.env.set_mapsize(min(max(size * 2, at_least), MAX_MAP_BYTES))

    def ensure_room(self, nbytes: int) -> None:
        """Grow the map now if ``nbytes`` more (plus B-tree and free-list slack) may not fit."""
        info = self.env.info()
        used = (info["last_pgno"] + 1) * self.env.stat()["psize"]
        want = used + nbytes + nbytes // 4 + (1 << 20)
        if want > info["map_size"]:
            self.grow(at_least=want + want // 2)

    def map_size(self) -> int:
        return int(self.env.info()["map_size"])

    def file_bytes(self) -> int:
        try:
            return (self.path / "data.mdb").stat().st_size
        except OSError:
            return 0


def acquire(path: Path, *, map_size: int, dbs: tuple[bytes, ...], sync: bool) -> SharedEnv:
    key = str(path.resolve())
    with _lock:
        entry = _open.get(key)
        if entry is not None and entry[0].pid == os.getpid():
            _open[key] = (entry[0], entry[1] + 1)
            return entry[0]
        env = SharedEnv(path, map_size=map_size, dbs=dbs, sync=sync)
        _open[key] = (env, 1)
        return env


def release(env: SharedEnv) -> None:
    key = str(env.path.resolve())
    with _lock:
        entry = _open.get(key)
        if entry is None or entry[0] is not env:
            return
        if entry[1] > 1:
            _open[key] = (env, entry[1] - 1)
            return
        del _open[key]
    if env.pid == os.getpid():
        env.env.close()
