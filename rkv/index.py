"""The store's index: which chunks exist, where their blocks live, pins, reference counts.

One LMDB environment at ``<store>/index`` with named databases:

* ``chunks``: chunk key (32 bytes) -> :class:`ChunkMeta` as JSON;
* ``lru``: ``tier name | 0x00 | last access (u64 ns, big-endian) | chunk key`` -> empty, one
  entry per (tier, chunk) so the least recently used chunks of a tier come first in a scan;
* ``models``: fingerprint (16 bytes) -> the :class:`~rkv.model.ModelSpec` as JSON;
* ``meta``: ``format``, ``config`` (the engine config as JSON), ``tiers`` (store ids of the
  tiers this index was written against) and ``usage`` (blocks and bytes per tier).

The index is the single writer lock of the store: every mutation runs inside an index write
transaction, so concurrent processes serialize and no update is lost.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rkv.errors import CorruptRecordError, UnknownFormatError
from rkv.lmdbenv import SharedEnv, acquire, release

INDEX_FORMAT = 1
CHUNKS = b"chunks"
LRU = b"lru"
MODELS = b"models"
META = b"meta"
_DBS = (CHUNKS, LRU, MODELS, META)


@dataclass(frozen=True)
class ChunkMeta:
    """What the index knows about one stored chunk."""

    parent: bytes                 # previous chunk's key, b"" for the first chunk
    pos: int                      # chunk index within its sequences
    n_tokens: int
    fingerprint: bytes
    blocks: tuple[tuple[str, int], ...]   # per layer: (tier name, record bytes)
    kids: int = 0                 # stored chunks whose parent this is
    end: bool = False             # some stored sequence ends here
    pins: int = 0
    at: int = 0                   # last access, ns since the epoch

    @property
    def refs(self) -> int:
        """References that keep this chunk alive: children plus a sequence ending here."""
        return self.kids + int(self.end)

    @property
    def nbytes(self) -> int:
        return sum(size for _, size in self.blocks)

    def tiers(self) -> set[str]:
        return {t for t, _ in self.blocks}

    def bytes_in(self, tier: str) -> int:
        return sum(size for t, size in self.blocks if t == tier)

    def to_json(self) -> bytes:
        return json.dumps(
            {"p": self.parent.hex(), "i": self.pos, "n": self.n_tokens,
             "fp": self.fingerprint.hex(), "b": [list(b) for b in self.blocks],
             "k": self.kids, "e": self.end, "pin": self.pins, "at": self.at},
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_json(cls, raw: Any) -> ChunkMeta:
        try:
            d = json.loads(bytes(raw))
            return cls(
                parent=bytes.fromhex(d["p"]), pos=int(d["i"]), n_tokens=int(d["n"]),
                fingerprint=bytes.fromhex(d["fp"]),
                blocks=tuple((str(t), int(s)) for t, s in d["b"]),
                kids=int(d["k"]), end=bool(d["e"]), pins=int(d["pin"]), at=int(d["at"]),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptRecordError(f"corrupt index entry: {exc}") from exc

    def with_(self, **changes: Any) -> ChunkMeta:
        return replace(self, **changes)


def lru_key(tier: str, at: int, key: bytes) -> bytes:
    return tier.encode() + b"\x00" + at.to_bytes(8, "big") + key


@dataclass
class Usage:
    """Blocks and bytes per tier, as the index accounts them."""

    tiers: dict[str, list[int]] = field(default_factory=dict)

    def add(self, tier: str, blocks: int, nbytes: int) -> None:
        cur = self.tiers.setdefault(tier, [0, 0])
        cur[0] += blocks
        cur[1] += nbytes

    def bytes(self, tier: str) -> int:
        return self.tiers.get(tier, [0, 0])[1]

    def blocks(self, tier: str) -> int:
        return self.tiers.get(tier, [0, 0])[0]


class Index:
    """Typed access to the index databases inside caller-managed transactions."""

    def __init__(self, path: Path, *, sync: bool) -> None:
        self.env: SharedEnv = acquire(path, map_size=16 << 20, dbs=_DBS, sync=sync)
        self._chunks = self.env.db(CHUNKS)
        self._lru = self.env.db(LRU)
        self._models = self.env.db(MODELS)
        self._meta = self.env.db(META)

    def close(self) -> None:
        release(self.env)

    # -- meta -------------------------------------------------------------------------------
    def get_meta(self, txn: Any, name: str) -> Any:
        v = txn.get(name.encode(), db=self._meta)
        if v is None:
            return None
        try:
            return json.loads(bytes(v))
        except ValueError as exc:
            raise CorruptRecordError(f"corrupt index metadata {name!r}") from exc

    def set_meta(self, txn: Any, name: str, value: Any) -> None:
        txn.put(name.encode(), json.dumps(value, sort_keys=True).encode(), db=self._meta)

    def check_format(self, txn: Any) -> bool:
        """True when the index exists; raises if it has an unknown format."""
        fmt = self.get_meta(txn, "format")
        if fmt is None:
            return False
        if fmt != INDEX_FORMAT:
            raise UnknownFormatError(f"index format {fmt!r} is not supported")
        return True

    def usage(self, txn: Any) -> Usage:
        return Usage(self.get_meta(txn, "usage") or {})

    def set_usage(self, txn: Any, usage: Usage) -> None:
        self.set_meta(txn, "usage", usage.tiers)

    # -- models -----------------------------------------------------------------------------
    def put_model(self, txn: Any, fingerprint: bytes, spec_json: bytes) -> None:
        if txn.get(fingerprint, db=self._models) is None:
            txn.put(fingerprint, spec_json, db=self._models)

    def models(self, txn: Any) -> dict[bytes, dict[str, Any]]:
        return {bytes(k): json.loads(bytes(v)) for k, v in txn.cursor(db=self._models)}

    # -- chunks -----------------------------------------------------------------------------
    def get_chunk(self, txn: Any, key: bytes) -> ChunkMeta | None:
        v = txn.get(key, db=self._chunks)
        return None if v is None else ChunkMeta.from_json(v)

    def has_chunk(self, txn: Any, key: bytes) -> bool:
        return txn.get(key, db=self._chunks) is not None

    def put_chunk(self, txn: Any, key: bytes, meta: ChunkMeta, old: ChunkMeta | None) -> None:
        if old is not None:
            self._drop_lru(txn, key, old)
        txn.put(key, meta.to_json(), db=self._chunks)
        for tier in meta.tiers():
            txn.put(lru_key(tier, meta.at, key), b"", db=self._lru)

    def del_chunk(self, txn: Any, key: bytes, meta: ChunkMeta) -> None:
        self._drop_lru(txn, key, meta)
        txn.delete(key, db=self._chunks)

    def _drop_lru(self, txn: Any, key: bytes, meta: ChunkMeta) -> None:
        for tier in meta.tiers():
            txn.delete(lru_key(tier, meta.at, key), db=self._lru)

    def chunks(self, txn: Any) -> Iterator[tuple[bytes, ChunkMeta]]:
        for k, v in txn.cursor(db=self._chunks):
            yield bytes(k), ChunkMeta.from_json(v)

    def count_chunks(self, txn: Any) -> int:
        return int(txn.stat(self._chunks)["entries"])

    def lru_order(self, txn: Any, tier: str) -> Iterator[bytes]:
        """Chunk keys with blocks in ``tier``, least recently used first."""
        prefix = tier.encode() + b"\x00"
        cur = txn.cursor(db=self._lru)
        if not cur.set_range(prefix):
            return
        for k in cur.iternext(values=False):
            k = bytes(k)
            if not k.startswith(prefix):
                return
            yield k[len(prefix) + 8:]

    def clear(self, txn: Any) -> None:
        for db in (self._chunks, self._lru, self._models):
            txn.drop(db, delete=False)
        self.set_usage(txn, Usage())
