"""Authenticated records: a MAC (HMAC-SHA256 or keyed blake2b) around a record, for tiers
other nodes write.

An authenticated tier stores each record in an envelope (docs/format.md, "Authenticated
records")::

    offset   size  field
    0        4     magic b"RKVA"
    4        1     envelope version, 2
    5        1     MAC algorithm: 1 = keyed blake2b-256 (person "rkv-mac-v1"),
                   2 = HMAC-SHA256
    6        1     n: length of the key id (1 to 32)
    7        1     reserved, 0
    8        n     key id (ASCII)
    8 + n    32    MAC
    40 + n   ...   the record, as any tier stores it (record.py)

The MAC covers the envelope's head (magic to key id), the tier's namespace and the block key
the value is stored under (each as its length in one byte, then its bytes) and the whole
record. So a record sealed under one block key or in one namespace fails under another, and
without a key a writer cannot make a value that verifies: a forged, re-keyed, moved (to
another key or namespace), truncated or corrupted value is an :class:`AuthenticationError`.
Several keys may verify (rotation: the key id picks one), one seals. A tier uses one
algorithm: HMAC-SHA256 (the default: about twice as fast as keyed blake2b where the CPU has
SHA instructions, which OpenSSL uses; benchmarks/bench_remote.py), or keyed blake2b; a value
sealed with the other is rejected.

Envelope version 1 (rkv before the namespace was bound) had the same layout and a MAC
without the namespace. Its values are rejected, not read: accepting them would let anyone
who can write to the server copy a version-1 value into another namespace. For a cache that
costs one miss per value; the next honest put stores the chunk again (docs/remote.md).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from typing import Any

from rkv.errors import AuthenticationError, ConfigError

MAGIC = b"RKVA"
VERSION = 2
#: The envelope before the MAC bound the namespace: recognised, and rejected.
OLD_VERSION = 1
ALG_BLAKE2B = 1
ALG_HMAC_SHA256 = 2
ALGORITHMS = {"blake2b": ALG_BLAKE2B, "hmac-sha256": ALG_HMAC_SHA256}
MAC_BYTES = 32
PERSON = b"rkv-mac-v1"


class MacKeys:
    """The keys of one authenticated tier: ``keys`` (id -> key bytes) verify, ``write_id``
    seals, in ``namespace`` (bound into every MAC). The keys themselves are never shown
    (repr, errors, stats show ids)."""

    def __init__(self, keys: Mapping[str, bytes], write_id: str,
                 algorithm: str = "hmac-sha256", *, namespace: str) -> None:
        if algorithm not in ALGORITHMS:
            raise ConfigError(f"MAC algorithm must be one of {sorted(ALGORITHMS)}, got "
                              f"{algorithm!r}")
        self.algorithm = algorithm
        self._alg = ALGORITHMS[algorithm]
        if write_id not in keys:
            raise ConfigError(f"MAC key {write_id!r} is not among the configured keys")
        for kid in keys:
            if not 1 <= len(kid.encode("ascii")) <= 32:
                raise ConfigError(f"MAC key id {kid!r} must be 1 to 32 ASCII characters")
        self._keys = {kid.encode("ascii"): bytes(k) for kid, k in keys.items()}
        ns = namespace.encode("ascii", "replace")
        if not 1 <= len(ns) <= 255 or not namespace.isascii():
            raise ConfigError(f"namespace {namespace!r} must be 1 to 255 ASCII characters")
        self.namespace = namespace
        self._ns = bytes([len(ns)]) + ns
        self.write_id = write_id
        wid = write_id.encode("ascii")
        self._head = MAGIC + bytes([VERSION, self._alg, len(wid), 0]) + wid
        self._write_key = self._keys[wid]

    @property
    def ids(self) -> list[str]:
        return sorted(k.decode("ascii") for k in self._keys)

    def __repr__(self) -> str:
        return (f"MacKeys(ids={self.ids}, write_id={self.write_id!r}, "
                f"algorithm={self.algorithm!r}, namespace={self.namespace!r})")

    def _mac(self, key: bytes, head: bytes, block_key: bytes, record: Any) -> bytes:
        h: Any = (hashlib.blake2b(key=key, digest_size=MAC_BYTES, person=PERSON)
                  if self._alg == ALG_BLAKE2B else hmac.new(key, digestmod="sha256"))
        h.update(head)
        h.update(self._ns)
        h.update(bytes([len(block_key)]) + block_key)
        h.update(record)
        return h.digest()  # type: ignore[no-any-return]

    def seal(self, block_key: bytes, record: Any) -> bytes:
        """The envelope of ``record`` (bytes-like) stored under ``block_key``."""
        view = memoryview(record).cast("B")
        mac = self._mac(self._write_key, self._head, block_key, view)
        return b"".join((self._head, mac, view))

    def record_offset(self, block_key: bytes, head: Any) -> int:
        """Where the record starts in a value whose first bytes are ``head``, once the
        envelope there is one this tier could verify (magic, version, algorithm, a key id
        it holds); the MAC itself needs the whole value (:meth:`open`). Anything else is an
        :class:`AuthenticationError`."""
        return self._envelope(block_key, memoryview(head).cast("B"))[0]

    def _envelope(self, block_key: bytes, view: memoryview) -> tuple[int, bytes]:
        where = f"record {block_key.hex()[:16]}"
        if view.nbytes < 8 or bytes(view[:4]) != MAGIC:
            raise AuthenticationError(f"{where} is not sealed (no MAC envelope): rejected")
        if view[4] == OLD_VERSION:
            raise AuthenticationError(f"{where} is sealed by envelope version 1 (its MAC does "
                                      "not bind the namespace): rejected")
        if view[4] != VERSION or view[5] != self._alg or view[7] != 0:
            raise AuthenticationError(f"{where}: unknown MAC envelope {bytes(view[4:8]).hex()}")
        n = view[6]
        start = 8 + n + MAC_BYTES
        if not 1 <= n <= 32 or view.nbytes < start:
            raise AuthenticationError(f"{where}: MAC envelope is truncated")
        kid = bytes(view[8:8 + n])
        key = self._keys.get(kid)
        if key is None:
            raise AuthenticationError(
                f"{where} is sealed with key id {kid.decode('ascii', 'replace')!r}, which "
                "this tier does not accept")
        return start, key

    def open(self, block_key: bytes, value: Any) -> memoryview:
        """The record inside ``value`` once its MAC verifies (a view into ``value``);
        anything else is an :class:`AuthenticationError`."""
        view = memoryview(value).cast("B")
        start, key = self._envelope(block_key, view)
        n = start - 8 - MAC_BYTES
        want = self._mac(key, bytes(view[:8 + n]), block_key, view[start:])
        if not hmac.compare_digest(want, bytes(view[8 + n:start])):
            raise AuthenticationError(f"record {block_key.hex()[:16]} failed its MAC (forged, "
                                      "moved from another key or namespace, truncated or "
                                      "corrupted): rejected")
        return view[start:]

    @staticmethod
    def fits(size: int, length: int) -> bool:
        """Whether a value of ``length`` bytes can be the envelope of a record of ``size``
        (a key id is 1 to 32 bytes)."""
        return size + 9 + MAC_BYTES <= length <= size + 40 + MAC_BYTES

    @staticmethod
    def overhead(key_id: str) -> int:
        return 8 + len(key_id.encode("ascii")) + MAC_BYTES
