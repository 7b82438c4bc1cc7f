"""The rkv error hierarchy.

Every error rkv raises derives from :class:`RkvError`. Where a builtin fits, the error also
derives from it (``ConfigError`` is a ``ValueError``), so generic handlers keep working.

:class:`IntegrityError` and its subclasses mean "the stored bytes cannot be trusted": a caller
that uses rkv as a cache may treat any of them as a miss and recompute.
"""

from __future__ import annotations


class RkvError(Exception):
    """Root of all rkv errors."""


class ConfigError(RkvError, ValueError):
    """A configuration value is invalid or inconsistent."""


class PolicyContractError(ConfigError):
    """A configured policy failed while the store used it: it broke the victim contract of
    ``policies.base`` (a victim it does not hold, a protected one, too few bytes) or raised
    ``PolicyError`` itself. The mutation that asked it fails whole: nothing of it is written,
    and the policies are rebuilt from the index at the next one."""


class MissingDependencyError(RkvError, ImportError):
    """An optional dependency is not installed; the message names the extra that brings it
    (``pip install 'rkv[torch]'``): :func:`rkv.extras.require`."""


class InputError(RkvError, ValueError):
    """An argument from the caller is invalid (nothing was written)."""


class ShapeError(InputError):
    """A tensor has the wrong shape or dtype for the model it is stored under."""


class StoreClosedError(RkvError):
    """The engine or tier was closed, or is used in a process it was not opened in."""


class TierFullError(RkvError):
    """A tier cannot take more data: its capacity, its map or its disk is full."""


class StoreError(RkvError, OSError):
    """The store cannot be used as asked: it is missing, read-only, or an I/O call failed."""


class ReadOnlyStoreError(StoreError, PermissionError):
    """A mutation was attempted on a store opened read-only (or on read-only files)."""


class IntegrityError(RkvError):
    """Stored data failed verification. Callers may treat it as a cache miss."""


class ChecksumError(IntegrityError):
    """The end-to-end checksum of a block's data does not match."""


class UncorrectableError(IntegrityError):
    """An error-correcting code found more errors than it can correct."""


class CorruptRecordError(IntegrityError):
    """A stored record is malformed: bad magic, unreadable header, inconsistent lengths."""


class TruncatedRecordError(CorruptRecordError):
    """A stored record is shorter (or longer) than its header says."""


class UnknownFormatError(CorruptRecordError):
    """A record carries a format version or codec this build of rkv does not know."""


class RecordMismatchError(IntegrityError):
    """A record was written under another key, layer or model fingerprint than requested."""


class StaleRecordError(RecordMismatchError):
    """A record of the right block but an older write: its header's write time is before the
    one the index recorded for the block (an older record handed back by the medium, a
    replayed value on a shared tier, a record left from before a delete and re-put)."""


class MissingRecordError(IntegrityError):
    """The index refers to a record that its tier does not hold."""


class TierUnavailableError(MissingRecordError):
    """A tier's storage cannot be reached now (a remote server down, refusing or timing out).
    Its records read as missing (a cache miss) until it answers again; a write to it fails
    with this error."""


class AuthenticationError(CorruptRecordError):
    """A record from an authenticated tier has no valid MAC: forged, sealed with an unknown
    or another key, stored under another block key, truncated or corrupted. It is rejected,
    never returned."""


class MediumError(IntegrityError):
    """The medium failed a read and said where: a file read returned EIO for some sectors, a
    memory read hit poisoned lines (a machine-check report), or the file ends before the
    record does. ``ranges`` are ``(start, length)`` byte ranges of the record the medium
    could not return; ``data`` is the record with those ranges zero-filled (``None`` when
    nothing could be read). The engine passes the ranges to its decoders as erasures."""

    def __init__(self, message: str, ranges: tuple[tuple[int, int], ...] = (),
                 data: memoryview | None = None) -> None:
        super().__init__(message)
        self.ranges = tuple((int(s), int(n)) for s, n in ranges)
        self.data = data

    @property
    def erased_bytes(self) -> int:
        return sum(n for _, n in self.ranges)


class CorruptStoreError(IntegrityError):
    """A database page of the index or of a tier is damaged (LMDB reported corruption), or an
    index entry failed its checksum. Reads of the affected blocks fail; nothing else is lost."""


__all__ = [
    "AuthenticationError",
    "ChecksumError",
    "ConfigError",
    "CorruptRecordError",
    "CorruptStoreError",
    "InputError",
    "IntegrityError",
    "MediumError",
    "MissingRecordError",
    "PolicyContractError",
    "ReadOnlyStoreError",
    "RecordMismatchError",
    "RkvError",
    "ShapeError",
    "StaleRecordError",
    "StoreClosedError",
    "StoreError",
    "TierFullError",
    "TierUnavailableError",
    "TruncatedRecordError",
    "UncorrectableError",
    "UnknownFormatError",
]
