"""Shared LMDB environments: one handle per path and process, a fixed map, typed errors.

LMDB forbids opening one environment twice in a process, and an environment must never be
used across ``fork``. Handles are therefore shared per real path and tagged with the pid that
opened them; a handle used in another process raises :class:`StoreClosedError`.

The map is sized once, large and sparse (address space, not memory or disk: the file grows
only as pages are written), and never resized while this process has a transaction open:
``mdb_env_set_mapsize`` under a live reader remaps memory that reader is still using, which
crashed readers when the map grew under them. The one remaining resize, adopting a larger map
that another process committed, waits until no transaction of this process is open.

Every LMDB failure leaves this module as a typed :class:`~rkv.errors.RkvError`: damaged pages
as :class:`CorruptStoreError`, a full map or disk as :class:`TierFullError`, read-only files as
:class:`ReadOnlyStoreError`, anything else as :class:`StoreError`.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, TypeVar

import lmdb
import lmdb.verify as lmdb_verify

from rkv.errors import (
    CorruptStoreError,
    ReadOnlyStoreError,
    RkvError,
    StoreClosedError,
    StoreError,
    TierFullError,
)
from rkv.tiers.lmdbfile import FileGuard, check_path
from rkv.tiers.reserve import Reserve, is_full_error

T = TypeVar("T")
log = logging.getLogger("rkv")
_lock = threading.Lock()
_open: dict[str, tuple[SharedEnv, int]] = {}

GiB = 1 << 30
#: Smallest map of any environment (address space only: LMDB files are sparse).
MIN_MAP_BYTES = 64 * GiB

_CORRUPT = (lmdb.CorruptedError, lmdb.PageNotFoundError, lmdb.InvalidError,
            lmdb.BadValsizeError, lmdb.PanicError, lmdb.VersionMismatchError,
            lmdb.IncompatibleError, lmdb.BadDbiError)


def map_bytes_for(capacity: int) -> int:
    """The fixed map size for an environment holding about ``capacity`` bytes: room for
    copy-on-write pages kept alive by long readers, rounded to a GiB."""
    want = max(MIN_MAP_BYTES, 4 * capacity + GiB)
    return -(-want // GiB) * GiB


def translate(exc: BaseException, where: str) -> RkvError:
    """The typed rkv error for an LMDB (or OS) failure at ``where``."""
    if isinstance(exc, RkvError):
        return exc
    msg = f"{where}: {exc}"
    if isinstance(exc, lmdb.MapFullError):
        return TierFullError(f"{where}: the LMDB map is full ({exc})")
    if isinstance(exc, lmdb.ReadonlyError) or getattr(exc, "errno", None) in (
            errno.EACCES, errno.EROFS, errno.EPERM):
        return ReadOnlyStoreError(f"{where}: read-only ({exc})")
    if isinstance(exc, _CORRUPT):
        return CorruptStoreError(f"{where}: damaged database ({exc})")
    if getattr(exc, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or "No space" in str(exc):
        return TierFullError(f"{where}: no space left on the device ({exc})")
    if isinstance(exc, lmdb.Error) and "closed" in str(exc):
        return StoreClosedError(msg)
    return StoreError(msg)


@contextmanager
def typed(where: str) -> Iterator[None]:
    """Re-raise LMDB and OS errors inside the block as typed rkv errors."""
    try:
        yield
    except (lmdb.Error, OSError) as exc:
        raise translate(exc, where) from exc


class SharedEnv:
    """An LMDB environment with named databases, shared by every user in one process."""

    def __init__(self, path: Path, *, map_size: int, dbs: tuple[bytes, ...], sync: bool,
                 readonly: bool = False, create: bool = True) -> None:
        self.path = path
        self.pid = os.getpid()
        self.readonly = readonly
        #: True when this open created the environment (it held no data file before).
        self.new = not (path / "data.mdb").exists()
        if self.new and (readonly or not create):
            raise StoreError(f"{path}: no LMDB environment here")
        with typed(f"opening {path}"):
            if not readonly:
                path.mkdir(parents=True, exist_ok=True)
            # Checked before the map exists: a file cut short would SIGBUS inside LMDB.
            check_path(path / "data.mdb", str(path), writable=not readonly)
            self.env = self._open(map_size, len(dbs), sync)
            try:
                self.guard = FileGuard(path / "data.mdb", str(path),
                                       int(self.env.stat()["psize"]), writable=not readonly)
                self.guard.check()
            except BaseException:
                self.env.close()
                raise
            self.dbs: dict[bytes, Any] = {}
            try:
                for name in dbs:
                    try:
                        self.dbs[name] = self.env.open_db(name, create=not readonly)
                    except lmdb.NotFoundError:
                        self.dbs[name] = None  # read-only, never written: reads find nothing
            except BaseException:
                self.guard.close()
                self.env.close()
                raise
        self._cv = threading.Condition()
        self._active = 0
        self._resizing = False
        self._closed = False
        self._local = threading.local()
        self._wlock = threading.RLock()
        self._lockfd: int | None = None
        self._held = 0           # nesting depth of exclusive() in the thread holding _wlock
        self._pages_ok_at: int | None = None
        #: Space kept back for deletes on a full disk (:mod:`rkv.tiers.reserve`).
        self.reserve = Reserve(path)
        if not readonly:
            self.reserve.make()
        #: fsync every commit although the environment was opened without sync (an engine
        #: learns its store's ``index_sync`` only after opening the index)
        self.force_sync = False
        self._opened_sync = sync

    def _open(self, map_size: int, n_dbs: int, sync: bool) -> Any:
        kw: dict[str, Any] = dict(map_size=map_size, max_dbs=n_dbs + 1, sync=sync, metasync=sync,
                  readahead=False, max_readers=512, subdir=True, readonly=self.readonly)
        try:
            return lmdb.open(str(self.path), lock=True, **kw)
        except (lmdb.Error, OSError):
            if not self.readonly:
                raise
            # Read-only media cannot take LMDB's lock file: read without it.
            return lmdb.open(str(self.path), lock=False, **kw)

    def check(self) -> None:
        if os.getpid() != self.pid:
            raise StoreClosedError(
                f"LMDB environment {self.path} was opened in process {self.pid}; "
                "open the store again in this process instead of inheriting it across fork"
            )
        if self._closed:
            raise StoreClosedError(f"LMDB environment {self.path} is closed")

    def db(self, name: bytes) -> Any:
        return self.dbs[name]

    # -- transactions ---------------------------------------------------------------------------
    @contextmanager
    def _slot(self) -> Iterator[None]:
        """Count an open transaction of this process (resizes and close wait for none)."""
        with self._cv:
            while self._resizing:
                self._cv.wait()
            self.check()
            self._active += 1
        self._local.depth = getattr(self._local, "depth", 0) + 1
        try:
            yield
        finally:
            self._local.depth -= 1
            with self._cv:
                self._active -= 1
                self._cv.notify_all()

    def _adopt_map_size(self) -> None:
        """Another process grew the map past ours: adopt its size once no transaction of this
        process is open (remapping under a live reader is what LMDB forbids)."""
        if getattr(self._local, "depth", 0):
            raise StoreError(f"{self.path}: the map was grown by another process while this "
                             "thread holds a transaction; retry the call")
        with self._cv:
            if self._resizing:
                while self._resizing:
                    self._cv.wait()
                return
            self._resizing = True
            try:
                while self._active:
                    self._cv.wait()
                self.check_file()    # never remap at the size a damaged meta page says
                with typed(f"resizing {self.path}"):
                    self.env.set_mapsize(0)
            finally:
                self._resizing = False
                self._cv.notify_all()

    def check_file(self) -> None:
        """Raise :class:`CorruptStoreError` when the data file no longer holds every page
        its committed meta names (cut short, damaged meta, deleted): see
        :mod:`rkv.tiers.lmdbfile`. One ``fstat`` while the file is unchanged."""
        try:
            self.guard.check()
        except OSError as exc:
            raise translate(exc, f"checking {self.path}") from exc

    def _begin(self, *, write: bool) -> Any:
        """A new transaction, or None when another process grew the map (adopt it first).
        The data file is checked first (:meth:`check_file`), and before a write its
        structure too if something wrote into it behind LMDB's back."""
        self.check_file()
        if write and self.guard.tampered:
            self.check_pages()
        try:
            return self.env.begin(write=write, buffers=not write)
        except lmdb.MapResizedError:
            return None
        except lmdb.Error as exc:
            raise translate(exc, f"{'writing' if write else 'reading'} {self.path}") from exc

    @contextmanager
    def read(self) -> Iterator[Any]:
        """A read snapshot; zero-copy buffers from it are valid only inside the block."""
        self.check()
        for _ in range(4):
            with self._slot():
                txn = self._begin(write=False)
                if txn is not None:
                    try:
                        yield txn
                    except lmdb.BadTxnError as exc:
                        # Only an earlier failed lookup in this snapshot (a damaged page)
                        # leaves a read transaction unusable.
                        raise CorruptStoreError(f"reading {self.path}: a lookup failed on a "
                                                f"damaged page ({exc})") from exc
                    except lmdb.Error as exc:
                        raise translate(exc, f"reading {self.path}") from exc
                    finally:
                        txn.abort()
                    return
            self._adopt_map_size()
        raise StoreError(f"{self.path}: the map keeps being resized by another process")

    def write(self, fn: Callable[[Any], T], *, freeing: bool = False) -> T:
        """Run ``fn(txn)`` in a write transaction and commit; any failure aborts it.

        A data file written behind LMDB's back since the last check (:mod:`rkv.tiers.lmdbfile`)
        has its structure verified first: LMDB writing into a damaged B-tree can lose
        what it is given. A full disk is :class:`TierFullError`; a ``freeing`` write (it
        deletes) that meets one gives up the environment's reserve (:mod:`rkv.tiers.reserve`) and
        runs once more."""
        self.check()
        if self.readonly:
            raise ReadOnlyStoreError(f"{self.path} is open read-only")
        try:
            result = self._write(fn)
        except TierFullError:
            if not freeing or not self.reserve.release():
                raise
            log.warning("%s: the disk is full; its space reserve was released so that a "
                        "delete can free space", self.path)
            result = self._write(fn)
        self.reserve.make()     # (when missing: at most every RETRY_S, and only with room)
        return result

    def _write(self, fn: Callable[[Any], T]) -> T:
        for _ in range(4):
            with self._slot():
                txn = self._begin(write=True)
                if txn is not None:
                    try:
                        result = fn(txn)
                        tid = txn.id()
                        trusted = self._pages_ok_at == tid - 1
                        txn.commit()
                        if self.force_sync and not self._opened_sync:
                            self.env.sync(True)
                        self.guard.committed()
                        if trusted:   # our own commit keeps a verified file verified
                            self._pages_ok_at = tid
                        return result
                    except (lmdb.Error, OSError) as exc:
                        txn.abort()
                        # A failed commit may have written pages past the committed ones:
                        # our own change, not tampering (which would re-verify the file).
                        with suppress(OSError, CorruptStoreError):
                            self.guard.committed()
                        if is_full_error(exc, self.path):
                            raise TierFullError(f"writing {self.path}: the disk is full "
                                                f"({exc})") from exc
                        raise translate(exc, f"writing {self.path}") from exc
                    except BaseException:
                        txn.abort()
                        raise
            self._adopt_map_size()
        raise StoreError(f"{self.path}: the map keeps being resized by another process")

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """The store's writer lock: one holder across threads (a lock) and processes (flock).

        Held around a whole mutation, tier writes, index commit and record deletions, so no
        other writer can act between a commit and the deletions it planned. Re-entrant: a
        nested hold (a structure check inside a mutation) keeps the flock until the outermost
        one ends; unlocking at the inner exit would let another process in mid-mutation.
        """
        self.check()
        with self._wlock:
            if self._lockfd is None:
                self._lockfd = self._open_lockfile()
            fd = self._lockfd
            if fd < 0 or self._held:   # read-only media (no lock file), or already ours
                self._held += 1
                try:
                    yield
                finally:
                    self._held -= 1
                return
            with typed(f"locking {self.path}"):
                fcntl.flock(fd, fcntl.LOCK_EX)
            self._held = 1
            try:
                yield
            finally:
                self._held = 0
                fcntl.flock(fd, fcntl.LOCK_UN)

    def _open_lockfile(self) -> int:
        lockfile = self.path / "writer.lock"
        try:
            return os.open(lockfile, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            if not self.readonly:
                raise translate(exc, f"locking {self.path}") from exc
        try:
            return os.open(lockfile, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return -1

    # -- damage --------------------------------------------------------------------------------
    def check_pages(self) -> None:
        """Raise :class:`CorruptStoreError` if the file's B-tree is damaged.

        LMDB checks a page's type on a lookup (a damaged page is ``MDB_CORRUPTED``), but a
        cursor stepping onto a damaged sibling page trips an assertion that aborts the whole
        process. So the structure is verified (py-lmdb's offline verifier: every reachable
        page, overflow extents, the free list) before anything scans the environment, once
        per committed transaction. The caller holds the store's writer lock, so no write is
        in flight and the file is at rest while it is read.
        """
        self.check_file()
        with typed(f"checking {self.path}"):
            txnid = self.env.info()["last_txnid"]
        if txnid == self._pages_ok_at and not self.guard.tampered:
            return
        try:
            problems = lmdb_verify.verify(str(self.path), subdir=True)  # type: ignore[no-untyped-call]
        except (lmdb_verify.VerifyError, OSError, ValueError) as exc:
            problems = [str(exc)]
        if problems:
            more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
            raise CorruptStoreError(f"{self.path}: damaged database: {problems[0]}{more}")
        self._pages_ok_at = txnid
        self.guard.cleared()

    # -- figures --------------------------------------------------------------------------------
    def map_size(self) -> int:
        self.check_file()      # env.info() reads the meta pages through the map
        with typed(f"inspecting {self.path}"):
            return int(self.env.info()["map_size"])

    def file_bytes(self) -> int:
        try:
            return (self.path / "data.mdb").stat().st_size
        except OSError:
            return 0

    def close(self) -> None:
        """Close once no transaction of this process is open on the environment."""
        with self._cv:
            if self._closed:
                return
            self._closed = True
            mine = getattr(self._local, "depth", 0)
            while self._active > mine:
                self._cv.wait()
        if self._lockfd is not None:
            os.close(self._lockfd)
            self._lockfd = None
        self.guard.close()
        if self.pid == os.getpid():
            self.env.close()


def acquire(path: Path, *, map_size: int, dbs: tuple[bytes, ...], sync: bool,
            readonly: bool = False, create: bool = True) -> SharedEnv:
    """The process' handle on the environment at ``path`` (opened on first use)."""
    key = str(path.resolve())
    with _lock:
        entry = _open.get(key)
        if entry is not None and entry[0].pid == os.getpid() and not entry[0]._closed:
            if entry[0].readonly and not readonly:
                raise StoreError(f"{path} is already open read-only in this process")
            _open[key] = (entry[0], entry[1] + 1)
            return entry[0]
        if entry is not None and entry[0].pid != os.getpid():
            # Inherited across fork: this process may not use it, and LMDB refuses a second
            # open of the same files while it exists. Closing the inherited handle is safe
            # for the parent: it unmaps this process' copy, and LMDB clears only reader slots
            # of the calling pid; fcntl locks were never inherited.
            with suppress(lmdb.Error):
                entry[0].env.close()
            del _open[key]
        env = SharedEnv(path, map_size=map_size, dbs=dbs, sync=sync, readonly=readonly,
                        create=create)
        _open[key] = (env, 1)
        return env


def release(env: SharedEnv) -> None:
    key = str(env.path.resolve())
    with _lock:
        entry = _open.get(key)
        if entry is not None and entry[0] is env:
            if entry[1] > 1:
                _open[key] = (env, entry[1] - 1)
                return
            del _open[key]
    if env.pid == os.getpid():
        env.close()
