"""A tier wrapper that corrupts records as a fault model says, with the ground truth kept.

Injection acts on whole records at the tier boundary (never inside LMDB's own pages), the way
media and link errors reach a reader:

* **persistent** patterns change what is stored (media errors): :meth:`FaultyTier.inject`
  rewrites the record with the pattern applied;
* **transient** patterns corrupt one read only (link errors): the wrapper's reader returns a
  corrupted copy and leaves the stored record alone.

Erasures are reported the way hardware reports them: a read of a record with a lost sector or
a poisoned line fails with :class:`~rkv.errors.MediumError` carrying the damaged byte ranges
(like EIO from a file read, or a machine-check poison report), with the record's other bytes
and zeros in the damaged ranges. A lost record reads as absent. Rewriting a record clears its
damage (the medium remaps the sector or the line).

Every pattern is drawn from a generator seeded by the caller, and every injection is recorded
(:attr:`FaultyTier.log`), so a campaign knows exactly which bits changed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from rkv.errors import MediumError
from rkv.tiers.base import Tier, TierReader
from rkv.tiers.wrapper import TierWrapper


def _ranges(erasures: Sequence[tuple[int, int, str]]) -> tuple[tuple[int, int], ...]:
    return tuple((int(s), int(n)) for s, n, _ in erasures)


def medium_error(key: bytes, buf: np.ndarray, ranges: tuple[tuple[int, int], ...]
                 ) -> MediumError:
    """The error a medium raises for ``buf`` with ``ranges`` unreadable (zero-filled here)."""
    for s, n in ranges:
        buf[s:s + n] = 0
    nbytes = sum(n for _, n in ranges)
    return MediumError(f"medium reported {nbytes} unreadable byte(s) in {len(ranges)} "
                       f"range(s) of record {key.hex()[:16]}", ranges, buf.data)


@dataclass(frozen=True)
class Injection:
    """What was done to one record."""

    key: bytes
    nbytes: int
    flips: np.ndarray                 # bit offsets into the record
    erasures: tuple[tuple[int, int, str], ...]
    lost: bool
    transient: bool

    @property
    def empty(self) -> bool:
        return not (self.flips.size or self.erasures or self.lost)


class _FaultyReader:
    def __init__(self, inner: TierReader, owner: FaultyTier) -> None:
        self._inner = inner
        self._owner = owner

    def want(self, items: Any) -> None:
        """Pass a read-ahead announcement on (a remote tier batches its reads)."""
        want = getattr(self._inner, "want", None)
        if want is not None:
            want(items)

    def get(self, key: bytes) -> memoryview | None:
        rec = self._inner.get(key)
        if rec is None or key in self._owner.lost:
            return None
        owner = self._owner
        cut = owner.partial.pop(key, None)
        if cut is not None:            # a value cut short on the wire
            owner.log.append(Injection(key, memoryview(rec).nbytes, np.zeros(0, np.int64),
                                       ((cut, memoryview(rec).nbytes - cut, "partial"),),
                                       False, True))
            return memoryview(rec)[:cut]
        transient = owner.next_transient(key, memoryview(rec).nbytes)
        erased = owner.erased.get(key, ())
        if transient is None and not erased:
            return rec
        buf = np.frombuffer(rec, dtype=np.uint8).copy()
        if transient is not None:
            if transient.lost:
                return None
            transient.apply(buf, owner.rng)
            erased = erased + _ranges(transient.erasures)
        if erased and owner.report_erasures:
            raise medium_error(key, buf, erased)
        return buf.data


class FaultyTier(TierWrapper):
    """Wraps a tier; corrupts its records persistently or on read, reproducibly.

    ``transient`` is a callable ``(key, nbytes) -> ErrorPattern | None`` consulted on every
    read (None: the read is clean); persistent patterns are applied with :meth:`inject`.
    ``report_erasures=False`` models a medium that returns garbage where it lost data
    without saying so (reads then see the random bytes the pattern wrote).
    """

    def __init__(self, inner: Tier, *, seed: int = 0,
                 transient: Callable[[bytes, int], Any] | None = None,
                 report_erasures: bool = True) -> None:
        super().__init__(inner)
        self.rng = np.random.default_rng(seed)
        self._transient = transient
        self._one_shot: dict[bytes, Any] = {}
        self.lost: set[bytes] = set()
        #: Byte ranges of each record that the medium reports unreadable.
        self.erased: dict[bytes, tuple[tuple[int, int], ...]] = {}
        self.report_erasures = report_erasures
        self.log: list[Injection] = []
        #: Records whose next read returns only their first bytes (a partial read).
        self.partial: dict[bytes, int] = {}

    # -- injection ----------------------------------------------------------------------------
    def inject(self, key: bytes, pattern: Any) -> Injection:
        """Apply ``pattern`` to the stored record ``key`` (persistently) and record it."""
        rec = self.inner.get(key)
        if rec is None:
            raise KeyError(f"no record {key.hex()} in tier {self.name}")
        inj = Injection(key, len(rec), np.asarray(pattern.flips, dtype=np.int64),
                        tuple(pattern.erasures), bool(pattern.lost), False)
        if pattern.lost:
            self.lost.add(key)
        elif not inj.empty:
            buf = np.frombuffer(rec, dtype=np.uint8).copy()
            pattern.apply(buf, self.rng)
            self.inner.put(key, buf)
            if inj.erasures:
                self.erased[key] = self.erased.get(key, ()) + _ranges(inj.erasures)
        self.log.append(inj)
        return inj

    def inject_transient(self, key: bytes, pattern: Any) -> None:
        """Corrupt the next read of ``key`` only (a link error); the store is unchanged."""
        self._one_shot[key] = pattern

    def inject_partial(self, key: bytes, nbytes: int) -> None:
        """The next read of ``key`` returns only its first ``nbytes`` (a value cut short on
        the wire, as a dropped connection or a short read would); the store is unchanged."""
        self.partial[key] = int(nbytes)

    def next_transient(self, key: bytes, nbytes: int) -> Any:
        pattern = self._one_shot.pop(key, None)
        if pattern is None and self._transient is not None:
            pattern = self._transient(key, nbytes)
        if pattern is None or pattern.is_empty:
            return None
        self.log.append(Injection(key, nbytes, np.asarray(pattern.flips, dtype=np.int64),
                                  tuple(pattern.erasures), bool(pattern.lost), True))
        return pattern

    # -- what faults change in the tier interface (the rest is forwarded) -------------------
    @contextmanager
    def _reader(self) -> Iterator[_FaultyReader]:
        with self.inner.reader() as r:
            yield _FaultyReader(r, self)

    def reader(self) -> AbstractContextManager[TierReader]:
        return self._reader()

    def put_many(self, items: Sequence[tuple[bytes, Any]], *, reserve: int = 0) -> None:
        self.inner.put_many(items, reserve=reserve)
        for k, _ in items:
            self.lost.discard(k)
            self.erased.pop(k, None)

    def delete_many(self, keys: Iterable[bytes]) -> int:
        keys = list(keys)
        self.lost.difference_update(keys)
        for k in keys:
            self.erased.pop(k, None)
        return self.inner.delete_many(keys)

    def clear(self) -> None:
        self.lost.clear()
        self.erased.clear()
        self._one_shot.clear()
        self.inner.clear()

    def stats(self) -> dict[str, Any]:
        return {**self.inner.stats(), "injections": len(self.log)}
