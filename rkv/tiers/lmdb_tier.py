"""A tier backed by one LMDB environment (named databases ``blocks`` and ``meta``)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

import lmdb

from rkv.errors import CorruptStoreError, RkvError, StoreClosedError, StoreError
from rkv.lmdbenv import SharedEnv, acquire, map_bytes_for, release, translate, typed
from rkv.tiers.base import Tier, TierSpec
from rkv.tiers.safe_read import MapFile

_BLOCKS = b"blocks"
_META = b"meta"


class _Reader:
    def __init__(self, txn: Any, db: Any, where: str, file: MapFile | None = None) -> None:
        self._txn = txn
        self._db = db
        self._where = where
        self._file = file

    def get(self, key: bytes) -> memoryview | None:
        if self._db is None:
            return None
        try:
            view = self._txn.get(key, db=self._db)
        except lmdb.Error as exc:
            raise translate(exc, self._where) from exc
        if view is None or self._file is None:
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
        if spec.reads == "pread":
            try:
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
        list with a cursor, which aborts on a damaged page like a scan does). Point reads
        never need it, so opening stays cheap."""
        if not self._checked:
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
        with self.env.read() as txn:
            yield _Reader(txn, self._blocks, where, self._file)

    def put_many(self, items: Sequence[tuple[bytes, Any]], *, reserve: int = 0) -> None:
        self.ensure_checked()
        self._refuse_if_damaged()
        db = self._blocks

        def fn(txn: Any) -> None:
            for k, v in items:
                txn.put(k, v() if callable(v) else v, db=db)

        self.env.write(fn)

    def delete_many(self, keys: Iterable[bytes]) -> int:
        self.ensure_checked()
        self._refuse_if_damaged()
        keys = list(keys)
        db = self._blocks

        def fn(txn: Any) -> int:
            return sum(1 for k in keys if txn.delete(k, db=db))

        return self.env.write(fn)

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
        self.env.write(lambda txn: txn.drop(db, delete=False))

    def stats(self) -> dict[str, Any]:
        try:
            records: int | None = self.records()
        except RkvError:
            records = None
        return {
            "records": records,
            "map_bytes": self.env.map_size(),
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
