"""A stand-in for a tier whose storage cannot be opened at all.

The engine keeps running on the other tiers: reads of this tier's blocks fail as integrity
errors (a miss to a cache user), placement skips it, and nothing in it is touched, so a
repaired or restored file brings its records back.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rkv.config import TierConfig
from rkv.errors import CorruptStoreError
from rkv.tiers.base import Tier


class _NoReader:
    def __init__(self, error: str) -> None:
        self._error = error

    def get(self, key: bytes) -> memoryview | None:
        raise CorruptStoreError(self._error)


class UnavailableTier(Tier):
    """A tier that failed to open; every access raises :class:`CorruptStoreError`."""

    def __init__(self, config: TierConfig, path: Path, reason: str) -> None:
        self.config = config
        self.path = Path(path)
        self.state = "damaged"
        self.damage = f"tier {config.name} ({path}) cannot be opened: {reason}"

    @property
    def store_id(self) -> str:
        return ""

    @contextmanager
    def reader(self) -> Iterator[_NoReader]:
        yield _NoReader(self.damage or "")

    def _fail(self) -> CorruptStoreError:
        return CorruptStoreError(self.damage or "")

    def put_many(self, items: Sequence[tuple[bytes, Any]], *, reserve: int = 0) -> None:
        raise self._fail()

    def delete_many(self, keys: Iterable[bytes]) -> int:
        raise self._fail()

    def iter_keys(self) -> Iterator[bytes]:
        raise self._fail()

    def records(self) -> int:
        raise self._fail()

    def clear(self) -> None:
        raise self._fail()

    def stats(self) -> dict[str, Any]:
        return {"records": None, "map_bytes": 0, "file_bytes": 0, "path": str(self.path),
                "state": self.state, "error": self.damage}

    def close(self) -> None:
        pass
