"""The tier interface: a byte store for records, keyed by block key.

A tier knows nothing about records; the engine verifies what it reads. Wrappers (a
fault-injecting tier, a logging tier) implement this same interface around another tier
(:class:`rkv.tiers.wrapper.TierWrapper`). tests/tiers/test_tier_contract.py checks what every
tier promises here.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from rkv.errors import MediumError


@dataclass(frozen=True)
class TierSpec:
    """What a byte store needs to know about itself: a tier is a store of opaque records
    (codecs, quantizers and policies live above it)."""

    name: str
    capacity_bytes: int
    map_bytes: int = 0            # the LMDB map (0: sized from the capacity)
    sync: bool = False            # fsync every commit
    reads: str = "mmap"           # "pread": copy records out of the file (SIGBUS-safe)
    #: A remote tier's settings (rkv.tiers.remote_config.RemoteSettings); None: LMDB.
    remote: Any = None


class TierReader(Protocol):
    """Reads inside one consistent snapshot; returned buffers live until the snapshot ends.

    ``get`` raises :class:`~rkv.errors.MediumError` when the medium reports bytes it cannot
    return (the error carries the record, zero-filled there, and the ranges)."""

    def get(self, key: bytes) -> memoryview | None: ...


Erased = tuple[tuple[int, int], ...]


def fetch(reader: TierReader, key: bytes) -> tuple[Any, Erased]:
    """A record as the medium returns it (None: absent) and the byte ranges it reported
    unreadable, which the decoders use as erasures."""
    try:
        return reader.get(key), ()
    except MediumError as exc:
        if exc.data is None:
            raise
        return exc.data, exc.ranges


class Tier(ABC):
    """A named store of records with a capacity."""

    spec: TierSpec
    #: What opening found: "new" (created empty now), "ok", or "damaged" (unusable as a whole).
    state: str = "ok"
    #: Why the tier is damaged, when it is.
    damage: str | None = None
    #: Other stores read and write this tier's records too (a shared remote tier): its
    #: records are never deleted as this store's orphans.
    shared: bool = False

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    @abstractmethod
    def store_id(self) -> str:
        """A random id made when the tier's storage was created (detects a wiped tier)."""

    @abstractmethod
    def reader(self) -> AbstractContextManager[TierReader]:
        """A snapshot for zero-copy reads."""

    def get(self, key: bytes) -> bytes | None:
        """A copy of a record (None: absent); raises MediumError as the reader does."""
        with self.reader() as r:
            v = r.get(key)
            return None if v is None else bytes(v)

    def fetch(self, key: bytes) -> tuple[bytes | None, Erased]:
        """A copy of a record and the byte ranges the medium reported unreadable."""
        with self.reader() as r:
            v, erased = fetch(r, key)
            return (None if v is None else bytes(v)), erased

    @abstractmethod
    def put_many(self, items: Sequence[tuple[bytes, Any]], *, reserve: int = 0) -> None:
        """Write records atomically (all or none); ``reserve`` hints the total size.

        A value is bytes-like, or a zero-argument callable that returns one at write time
        (so records can be encoded into one reused buffer: each is copied before the next
        callable runs). Callables may be called again if the write is retried.
        """

    def put(self, key: bytes, value: Any) -> None:
        self.put_many([(key, value)], reserve=memoryview(value).nbytes)

    @abstractmethod
    def delete_many(self, keys: Iterable[bytes]) -> int:
        """Delete records atomically; returns how many existed."""

    def delete(self, key: bytes) -> bool:
        return self.delete_many([key]) == 1

    @abstractmethod
    def iter_keys(self) -> Iterator[bytes]:
        """All keys (a snapshot)."""

    def ensure_checked(self) -> None:  # noqa: B027 - optional for tiers that need no check
        """Verify the storage's structure before the first write, if the tier needs it."""

    def records(self) -> int:
        """How many records the tier holds."""
        return sum(1 for _ in self.iter_keys())

    @abstractmethod
    def clear(self) -> None:
        """Remove every record."""

    @abstractmethod
    def stats(self) -> dict[str, Any]:
        """Storage figures: records, bytes on the medium, map size."""

    @abstractmethod
    def close(self) -> None:
        """Release the storage; closing again does nothing. Later calls raise
        :class:`~rkv.errors.StoreClosedError` (a tier that could not be opened keeps raising
        its own error)."""
