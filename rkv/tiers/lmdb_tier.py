"""A tier backed by one LMDB environment (named databases ``blocks`` and ``meta``)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from functools import partial
from pathlib import Path
from typing import Any

import lmdb

from rkv.errors import (
    CorruptStoreError,
    RkvError,
    StoreClosedError,
    StoreError,
    TierFullError,
)
from rkv.tiers.base import Tier, TierSpec
from rkv.tiers.lmdbenv import SharedEnv, acquire, map_bytes_for, release, typed
from rkv.tiers.safe_read import MapFile

_BLOCKS = b"blocks"
_META = b"meta"


#: Records per delete transaction on a full disk.
FULL_DISK_BATCH = 32
#: Fresh snapshots one reader may open after failed lookups before it gives up on the tier.
MAX_RENEWALS = 8


class _Reader:
    """Point reads of one tier in one snapshot.

    A lookup that LMDB fails (a damaged page: ``MDB_CORRUPTED``, ``MDB_PAGE_NOTFOUND``) leaves
    its transaction unusable (every later call is ``MDB_BAD_TXN``), so that block's error is
    raised as a :class:`CorruptStoreError` and the next lookup opens a fresh snapshot. The
    failed snapshot stays open until the reader ends: buffers it handed out stay valid. A
    value whose extent reaches past the end of the data file (a damaged leaf's length) is
    refused without touching it: reading it through the map would be a SIGBUS.
    """

    def __init__(self, env: SharedEnv, stack: ExitStack, db: Any, where: str,
                 file: MapFile, pread: bool) -> None:
        self._env, self._stack = env, stack
        self._db = db
        self._where = where
        self._file = file
        self._pread = pread
        self._renewals = 0
        self._txn: Any = None
        self._open()

    def _open(self) -> None:
        self._txn = self._stack.enter_context(self._env.read())

    def get(self, key: bytes) -> memoryview | None:
        if self._db is None:
            return None
        if self._txn is None:
            if self._renewals > MAX_RENEWALS:
                raise CorruptStoreError(f"{self._where}: {self._renewals} lookups failed in "
                                        "one read; the tier's database is damaged")
            self._open()
        try:
            view = self._txn.get(key, db=self._db)
        except lmdb.Error as exc:
            self._txn = None
            self._renewals += 1
            raise CorruptStoreError(f"{self._where}: lookup of {key.hex()[:16]} failed, the "
                                    f"database is damaged ({exc})") from exc
        if view is None:
            return None
        end = self._file.end(view)
        if end is not None and end > self._env.guard.limit and end > self._env.guard.size():
            raise CorruptStoreError(f"{self._where}: the value of {key.hex()[:16]} reaches "
                                    f"past the end of the data file (a damaged page)")
        if not self._pread:
            return view  # type: ignore[no-any-return]
        return self._file.read(view, key)


class LmdbTier(Tier):
    """Records in an LMDB environment at ``path`` with a fixed, sparse map.

    ``state`` says what opening found: ``"new"`` (the environment was created now, so it is
    empty), ``"ok"`` (its store id was read) or ``"damaged"`` (its id cannot be read: the tier
    is kept as it is, never given a new id, and reads of its blocks fail as integrity errors).
    With ``spec.reads == "pread"`` records are copied out of the data file with ``pread``
    instead of being read through the map (:mod:`rkv.tiers.safe_read`): a lost page is then
    a MediumError with its range, not a SIGBUS.
    """

    def __init__(self, spec: TierSpec, path: Path, *, readonly: bool = False) -> None:
        self.spec = spec
        self.path = Path(path)
        self.damage: str | None = None
        self._checked = False
        #: The store's writer lock: held while the file is verified before a scan.
        self.scan_lock: Callable[[], AbstractContextManager[Any]] = nullcontext
        self._env: SharedEnv | None = acquire(
            self.path, map_size=spec.map_bytes or map_bytes_for(spec.capacity_bytes),
            dbs=(_BLOCKS, _META),
            sync=spec.sync, readonly=readonly, create=not readonly,
        )
        self._blocks = self._env.db(_BLOCKS)
        self._meta = self._env.db(_META)
        self._file: MapFile | None = None
        try:   # also finds where values lie in the file in "mmap" mode (their extent check)
            self._file = MapFile(self.path / "data.mdb")
        except OSError as exc:
            self.close()
            raise StoreError(f"tier {self.name}: cannot open its data file: {exc}") from exc
        self.state = "new" if self._env.new else "ok"
        self._store_id = ""
        try:
            self._store_id = self._read_id()
            if not self._store_id and self.state == "new" and not readonly:
                self._store_id = self._env.write(self._mint_id)
            elif not self._store_id and self.state != "new":
                # An existing environment without an id: new only if it holds no records.
                if self.records() == 0 and not readonly:
                    self.state = "new"
                    self._store_id = self._env.write(self._mint_id)
                else:
                    raise CorruptStoreError(f"tier {self.name}: store id missing")
        except RkvError as exc:
            if not isinstance(exc, CorruptStoreError):
                self.close()
                raise
            self.state = "damaged"
            self.damage = str(exc)

    def _read_id(self) -> str:
        with self.env.read() as txn:
            v = None if self._meta is None else txn.get(b"store_id", db=self._meta)
            if v is None:
                return ""
            try:
                sid = bytes(v).decode("ascii")
                uuid.UUID(hex=sid)
            except ValueError as exc:
                raise CorruptStoreError(f"tier {self.name}: unreadable store id") from exc
            return sid

    def _mint_id(self, txn: Any) -> str:
        new = uuid.uuid4().hex
        txn.put(b"store_id", new.encode(), db=self._meta)
        return new

    def check(self) -> None:
        """Verify the file's structure (under the store's writer lock); a damaged tier is
        marked so, and is then only read by key, never scanned or written."""
        try:
            with self.scan_lock():
                self.env.check_pages()
        except CorruptStoreError as exc:
            self.mark_damaged(str(exc))

    def ensure_checked(self) -> None:
        """Check the structure once before this process first writes (a write walks the free
        list with a cursor, which aborts on a damaged page like a scan does), and again when
        the file was changed by something other than an LMDB commit; and the data file
        (cheap) every time. Point reads never need the structure check, so opening stays
        cheap."""
        if self.state == "damaged":
            return
        try:
            self._healthy()
        except CorruptStoreError:
            return
        if not self._checked or self.env.guard.tampered:
            self.check()
            self._checked = True

    def mark_damaged(self, why: str) -> None:
        self.state = "damaged"
        self.damage = why

    def _refuse_if_damaged(self) -> None:
        if self.state == "damaged":
            raise CorruptStoreError(f"tier {self.name} is damaged ({self.damage}): it is only "
                                    "read, never written or scanned")

    @property
    def env(self) -> SharedEnv:
        if self._env is None:
            raise StoreClosedError(f"tier {self.name} is closed")
        return self._env

    @property
    def store_id(self) -> str:
        return self._store_id

    @contextmanager
    def reader(self) -> Iterator[_Reader]:
        where = f"tier {self.name} ({self.path})"
        with ExitStack() as stack:
            if self._file is None:
                raise StoreClosedError(f"tier {self.name} is closed")
            yield _Reader(self._healthy(), stack, self._blocks, where, self._file,
                          self.spec.reads == "pread")

    def _healthy(self) -> SharedEnv:
        """The environment, its data file checked (:meth:`SharedEnv.check_file`); a file
        found damaged marks the tier damaged."""
        env = self.env
        try:
            env.check_file()
        except CorruptStoreError as exc:
            self.mark_damaged(str(exc))
            raise
        return env

    def put_many(self, items: Sequence[tuple[bytes, Any]], *, reserve: int = 0) -> None:
        self.ensure_checked()
        self._refuse_if_damaged()
        db = self._blocks

        def fn(txn: Any) -> None:
            for k, v in items:
                txn.put(k, v() if callable(v) else v, db=db)

        self.env.write(fn)

    def delete_many(self, keys: Iterable[bytes]) -> int:
        """Delete records atomically; on a full disk (after giving up the reserve,
        :mod:`rkv.tiers.reserve`) in batches of :data:`FULL_DISK_BATCH`, each atomic, every one
        reusing the pages the one before freed."""
        self.ensure_checked()
        self._refuse_if_damaged()
        keys = list(keys)
        db = self._blocks

        def fn(part: list[bytes], txn: Any) -> int:
            return sum(1 for k in part if txn.delete(k, db=db))

        try:
            return self.env.write(partial(fn, keys), freeing=True)
        except TierFullError:
            if len(keys) <= FULL_DISK_BATCH:
                raise
        return sum(self.env.write(partial(fn, keys[i:i + FULL_DISK_BATCH]), freeing=True)
                   for i in range(0, len(keys), FULL_DISK_BATCH))

    def iter_keys(self) -> Iterator[bytes]:
        self._refuse_if_damaged()
        self.check()
        self._refuse_if_damaged()
        with self.env.read() as txn:
            if self._blocks is None:
                return
            with typed(f"listing tier {self.name}"):
                found = [bytes(k) for k in txn.cursor(db=self._blocks).iternext(values=False)]
        yield from found

    def records(self) -> int:
        with self.env.read() as txn:
            if self._blocks is None:
                return 0
            with typed(f"inspecting tier {self.name}"):
                return int(txn.stat(self._blocks)["entries"])

    def clear(self) -> None:
        self.ensure_checked()
        self._refuse_if_damaged()
        db = self._blocks
        try:
            self.env.write(lambda txn: txn.drop(db, delete=False), freeing=True)
        except TierFullError:     # one drop needs a free-list entry for every page: batches
            self.delete_many(list(self.iter_keys()))

    def stats(self) -> dict[str, Any]:
        try:
            records: int | None = self.records()
        except RkvError:
            records = None
        try:
            map_bytes = self.env.map_size()
        except CorruptStoreError:
            map_bytes = 0
        return {
            "records": records,
            "map_bytes": map_bytes,
            "file_bytes": self.env.file_bytes(),
            "path": str(self.path),
            "state": self.state,
        }

    def close(self) -> None:
        if getattr(self, "_file", None) is not None:
            assert self._file is not None
            self._file.close()
            self._file = None
        if self._env is not None:
            release(self._env)
            self._env = None
