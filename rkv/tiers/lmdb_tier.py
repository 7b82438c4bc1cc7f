"""A tier backed by one LMDB environment (named databases ``blocks`` and ``meta``)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rkv.config import TierConfig
from rkv.errors import StoreClosedError
from rkv.lmdbenv import SharedEnv, acquire, release
from rkv.tiers.base import Tier

_BLOCKS = b"blocks"
_META = b"meta"


class _Reader:
    def __init__(self, txn: Any, db: Any) -> None:
        self._txn = txn
        self._db = db

    def get(self, key: bytes) -> memoryview | None:
        return self._txn.get(key, db=self._db)  # type: ignore[no-any-return]  # buffers=True


class LmdbTier(Tier):
    """Records in an LMDB environment at ``path``; the map grows on demand."""

    def __init__(self, config: TierConfig, path: Path) -> None:
        self.config = config
        self.path = Path(path)
        self._env: SharedEnv | None = acquire(
            self.path, map_size=config.initial_map_bytes, dbs=(_BLOCKS, _META), sync=config.sync
        )
        self._blocks = self._env.db(_BLOCKS)
        meta = self._env.db(_META)

        def ensure_id(txn: Any) -> str:
            v = txn.get(b"store_id", db=meta)
            if v is None:
                new = uuid.uuid4().hex
                txn.put(b"store_id", new.encode(), db=meta)
                return new
            return bytes(v).decode()

        self._store_id = self._env.write(ensure_id)

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
        with self.env.read() as txn:
            yield _Reader(txn, self._blocks)

    def put_many(self, items: Sequence[tuple[bytes, Any]], *, reserve: int = 0) -> None:
        db = self._blocks

        def fn(txn: Any) -> None:
            for k, v in items:
                txn.put(k, v() if callable(v) else v, db=db)

        if not reserve:
            reserve = sum(memoryview(v).nbytes for _, v in items if not callable(v))
        # Growing the map first spares a large batch one failed try per map doubling.
        self.env.write(fn, reserve=reserve + 64 * len(items))

    def delete_many(self, keys: Iterable[bytes]) -> int:
        keys = list(keys)
        db = self._blocks

        def fn(txn: Any) -> int:
            return sum(1 for k in keys if txn.delete(k, db=db))

        return self.env.write(fn)

    def iter_keys(self) -> Iterator[bytes]:
        with self.env.read() as txn:
            found = [bytes(k) for k in txn.cursor(db=self._blocks).iternext(values=False)]
        yield from found

    def clear(self) -> None:
        db = self._blocks
        self.env.write(lambda txn: txn.drop(db, delete=False))

    def stats(self) -> dict[str, Any]:
        with self.env.read() as txn:
            entries = txn.stat(self._blocks)["entries"]
        return {
            "records": int(entries),
            "map_bytes": self.env.map_size(),
            "file_bytes": self.env.file_bytes(),
            "path": str(self.path),
        }

    def close(self) -> None:
        if self._env is not None:
            release(self._env)
            self._env = None
