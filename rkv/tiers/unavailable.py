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

from rkv.errors import CorruptStoreError, IntegrityError, MissingRecordError
from rkv.tiers.base import Tier, TierSpec


class _NoReader:
    def __init__(self, error: IntegrityError) -> None:
        self._error = error

    def get(self, key: bytes) -> memoryview | None:
        raise self._error


class UnavailableTier(Tier):
    """A tier that failed to open: every access raises :class:`CorruptStoreError`, or
    :class:`MissingRecordError` when the tier is simply not there (``missing``: a read-only
    open of a store whose memory tier was wiped)."""

    def __init__(self, spec: TierSpec, path: Path, reason: str, *,
                 missing: bool = False) -> None:
        self.spec = spec
        self.path = Path(path)
        self.state = "missing" if missing else "damaged"
        self.damage = f"tier {spec.name} ({path}) cannot be opened: {reason}"

    @property
    def store_id(self) -> str:
        return ""

    @contextmanager
    def reader(self) -> Iterator[_NoReader]:
        yield _NoReader(self._fail())

    def _fail(self) -> IntegrityError:
        if self.state == "missing":
            return MissingRecordError(self.damage or "")
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
