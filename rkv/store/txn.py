"""The mutation protocol: tier writes -> index commit -> record deletions, under one lock.

Every change to a store runs through :class:`Mutator.run`:

1. take the store's writer lock (threads and processes, :meth:`SharedEnv.exclusive`);
2. open the index write transaction; the caller's function plans tier writes and deletions
   in a :class:`Pending` and changes the index;
3. write the planned records to the tiers, then commit the index;
4. delete the records the commit stopped referring to, still under the lock.

Writes come before the commit, so a crash leaves unreferenced records (reported by verify,
reclaimed by ``verify --repair``), never an index entry without its record. Deletions come
after the commit but inside the lock, so no other writer can store the same key in between
and see its acknowledged records deleted.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from typing import Any, TypeVar

from rkv.errors import MissingRecordError, RkvError
from rkv.tiers import Tier

log = logging.getLogger("rkv")
T = TypeVar("T")

#: Test hooks, by name: "locking" (about to take the writer lock), "locked" (lock taken,
#: before the index transaction) and "committed" (index committed, before record
#: deletions). Tests use them to hold race windows open deterministically; production code
#: never sets them.
Hooks = dict[str, Callable[[], None]]
#: Bytes of records per tier write transaction. LMDB copies a written value twice (into a
#: dirty page it allocates, then into the file at commit); a transaction whose pages outgrow
#: the CPU cache makes both copies miss it and fault fresh heap pages. Measured here: 240
#: records of 192 KiB take 2.4x longer in one transaction than in transactions of 2 MiB,
#: 480 of 12 KiB 2.2x longer than in transactions of 360 KiB to 1.4 MiB.
WRITE_SLICE = 2 << 20


class Pending:
    """Tier writes and deletions planned inside one index transaction."""

    def __init__(self, tiers: dict[str, Tier]):
        self.tiers = tiers
        self.writes: dict[str, dict[bytes, tuple[Any, int]]] = defaultdict(dict)
        self.deletes: dict[str, set[bytes]] = defaultdict(set)
        self.failed_deletes = 0

    def write(self, tier: str, key: bytes, value: Any, size: int) -> None:
        """Plan a write of ``value`` (bytes-like, or a callable producing ``size`` bytes)."""
        self.writes[tier][key] = (value, size)
        self.deletes[tier].discard(key)

    def move(self, key: bytes, src: str, dst: str,
             transform: Callable[[Any, tuple[tuple[int, int], ...]], Any] | None = None) -> int:
        """Plan moving a record between tiers, through ``transform`` (re-encoding) when
        given (called with the record and the byte ranges the medium reported unreadable).
        Returns the record's size in ``dst``. Raises an IntegrityError (typed) when
        the source cannot be read."""
        planned = self.writes[src].pop(key, None)
        erased: tuple[tuple[int, int], ...] = ()
        if planned is None:
            value, erased = self.tiers[src].fetch(key)
            if value is None:
                raise MissingRecordError(f"record {key.hex()} is missing from tier {src}")
            planned = (value, len(value))
        if transform is not None:
            value = planned[0]() if callable(planned[0]) else planned[0]
            value = transform(bytes(value), erased)
            planned = (value, memoryview(value).nbytes)
        self.write(dst, key, *planned)
        self.deletes[src].add(key)
        return planned[1]

    def drop(self, tier: str, key: bytes) -> None:
        self.writes[tier].pop(key, None)
        self.deletes[tier].add(key)

    def flush_writes(self) -> None:
        """Write the planned records, in tier transactions of about :data:`WRITE_SLICE`
        bytes each. All of them commit before the index does, so a failure part way leaves
        at most unreferenced records, as a crash there would (and as writes to several tiers
        always could)."""
        for tier, items in self.writes.items():
            batch: list[tuple[bytes, Any]] = []
            size = 0
            for k, (v, n) in items.items():
                batch.append((k, v))
                size += n
                if size >= WRITE_SLICE:
                    self.tiers[tier].put_many(batch, reserve=size)
                    batch, size = [], 0
            if batch:
                self.tiers[tier].put_many(batch, reserve=size)

    def flush_deletes(self) -> None:
        """Delete after the commit. A tier that cannot delete (damaged) keeps the records
        as unreferenced ones: the commit stands, verify reports them."""
        for tier, keys in self.deletes.items():
            if not keys or tier not in self.tiers:
                continue
            try:
                self.tiers[tier].delete_many(keys)
            except RkvError as exc:
                self.failed_deletes += len(keys)
                log.warning("tier %s: %d records could not be deleted (%s); verify --repair "
                            "reclaims them", tier, len(keys), exc)


class Mutator:
    """Runs mutations of one store under its writer lock (see the module docstring)."""

    def __init__(self, env: Any, tiers: dict[str, Tier], hooks: Hooks) -> None:
        self.env = env
        self.tiers = tiers
        self.hooks = hooks

    def _hook(self, name: str) -> None:
        fn = self.hooks.get(name)
        if fn is not None:
            fn()

    def run(self, fn: Callable[[Any, Pending], T],
            before: Callable[[Any], None] | None = None, freeing: bool = False) -> T:
        """Run ``fn(txn, pending)``; ``before(txn)`` runs first in the same transaction.
        ``freeing``: the mutation deletes (it may use the index's space reserve on a full
        disk, :mod:`rkv.tiers.reserve`)."""
        self._hook("locking")
        with self.env.exclusive():
            self._hook("locked")
            box: list[Pending] = []

            def body(txn: Any) -> T:
                pending = Pending(self.tiers)
                box[:] = [pending]
                if before is not None:
                    before(txn)
                result = fn(txn, pending)
                pending.flush_writes()
                return result

            result: T = self.env.write(body, freeing=freeing)
            self._hook("committed")
            box[0].flush_deletes()
            return result
