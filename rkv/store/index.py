"""The store's index: which chunks exist, where their blocks live, pins, children.

One LMDB environment at ``<store>/index`` with named databases:

* ``chunks``: chunk key (32 bytes) -> :class:`ChunkMeta` as JSON (since the stored mix,
  with an optional per-layer pipeline label, ``"<bits>/<code>"``, and since record format 2
  an optional per-layer write time: entries without them load with them unknown, so the
  format number did not change);
* ``kids``: ``parent key | child key`` -> empty, so a chunk's children can be listed (and a
  chunk is a leaf when it has none);
* ``lru``: unused since format 3 (format 2 kept an access-ordered row per chunk and tier here;
  eviction order now belongs to the policies of :mod:`rkv.store.decisions`, rebuilt from
  ``ChunkMeta.at``), emptied on upgrade;
* ``models``: fingerprint (16 bytes) -> the :class:`~rkv.format.model.ModelSpec` as JSON;
* ``meta``: ``format``, ``config`` (the engine config), ``tiers`` (store ids of the tiers this
  index was written against), ``store`` (the store's id), ``usage`` (blocks and bytes per
  tier, recomputable from ``chunks`` by :meth:`Index.recount_usage`) and ``gen`` (a counter
  every mutation bumps, so a process can tell that another one changed the index).

Format 2 seals every value of ``chunks``, ``models`` and ``meta`` with an xxh3-64 over key and
value, so a damaged entry reads as :class:`~rkv.errors.CorruptStoreError` instead of as other
data. Format 3 drops the ``lru`` rows. Formats 1 (no seals, no ``kids``) and 2 are read as
they are and upgraded on the first writable open (or by ``rkv migrate``).

The index is the single writer lock of the store: every mutation runs inside an index write
transaction (and the store's writer lock, see :mod:`rkv.store.txn`), so no update is lost.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import lmdb
import xxhash

from rkv.errors import CorruptStoreError, UnknownFormatError
from rkv.store.indexlabels import _labels, _palette, _times
from rkv.store.indexlabels import label_parts as label_parts  # (re-exported: callers import here)
from rkv.store.indexlabels import pipe_label as pipe_label
from rkv.tiers.lmdbenv import SharedEnv, acquire, release

INDEX_FORMAT = 3
CHUNKS = b"chunks"
KIDS = b"kids"
LRU = b"lru"
MODELS = b"models"
META = b"meta"
_DBS = (CHUNKS, KIDS, LRU, MODELS, META)
INDEX_MAP_BYTES = 64 << 30
_PARSED: dict[bytes, ChunkMeta] = {}     # parsed entries by their bytes (frozen: shared)


@dataclass(frozen=True)
class ChunkMeta:
    """What the index knows about one stored chunk."""

    parent: bytes                 # previous chunk's key, b"" for the first chunk
    pos: int                      # chunk index within its sequences
    n_tokens: int
    fingerprint: bytes
    blocks: tuple[tuple[str, int], ...]   # per layer: (tier name, record bytes)
    end: bool = False             # some stored sequence ends here
    pins: int = 0
    at: int = 0                   # last access, ns since the epoch
    #: Per layer, the block's pipeline label (:func:`pipe_label`); "" where unknown, and
    #: () when no layer's is known (entries written before labels existed).
    pipes: tuple[str, ...] = ()
    #: Per layer, when its record was last written (ns since the epoch, the engine's
    #: clock); 0 where unknown, and () when no layer's is known (entries written before
    #: write times existed). Every write of a record, in place or into another tier, sets it.
    written: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.pipes and not any(self.pipes):
            object.__setattr__(self, "pipes", ())
        if self.written and not any(self.written):
            object.__setattr__(self, "written", ())

    def layer_tiers(self, n_layers: int) -> tuple[str, ...]:
        """The tier of each of ``n_layers`` layers ("?" past the entry's), computed once per
        entry object (reads ask for it per block; parsed entries are shared)."""
        got: tuple[str, ...] | None = self.__dict__.get("_tiers")
        if got is None or len(got) != n_layers:
            tiers = tuple(t for t, _ in self.blocks)[:n_layers]
            got = tiers + ("?",) * (n_layers - len(tiers))
            object.__setattr__(self, "_tiers", got)
        return got

    def written_at(self, layer: int) -> int:
        """Layer ``layer``'s write time in ns, 0 when unknown."""
        return self.written[layer] if layer < len(self.written) else 0

    def pipe(self, layer: int) -> str:
        """Layer ``layer``'s pipeline label, "" when unknown."""
        return self.pipes[layer] if layer < len(self.pipes) else ""

    @property
    def nbytes(self) -> int:
        return sum(size for _, size in self.blocks)

    def tiers(self) -> set[str]:
        return {t for t, _ in self.blocks}

    def bytes_in(self, tier: str) -> int:
        return sum(size for t, size in self.blocks if t == tier)

    def to_json(self) -> bytes:
        d: dict[str, Any] = {
            "p": self.parent.hex(), "i": self.pos, "n": self.n_tokens,
            "fp": self.fingerprint.hex(), "b": [list(b) for b in self.blocks],
            "e": self.end, "pin": self.pins, "at": self.at}
        if self.pipes:
            pal, idx = _palette(self.pipes, len(self.blocks), "")
            d["q"] = {"p": pal, "l": idx}
        if self.written:
            times, idx = _palette(self.written, len(self.blocks), 0)
            d["w"] = {"t": times, "l": idx}
        return json.dumps(d, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: Any) -> ChunkMeta:
        """An entry, parsed once per distinct bytes (every get reads the same ones again)."""
        data = bytes(raw)
        meta = _PARSED.get(data) or cls._parse(data)
        if len(_PARSED) >= 4096:
            _PARSED.clear()
        _PARSED[data] = meta
        return meta

    @classmethod
    def _parse(cls, raw: bytes) -> ChunkMeta:
        try:
            d = json.loads(raw)
            blocks = tuple((str(t), int(s)) for t, s in d["b"])
            meta = cls(
                parent=bytes.fromhex(d["p"]), pos=int(d["i"]), n_tokens=int(d["n"]),
                fingerprint=bytes.fromhex(d["fp"]), blocks=blocks,
                end=bool(d["e"]), pins=int(d["pin"]), at=int(d["at"]),
                pipes=_labels(d.get("q"), len(blocks)),
                written=_times(d.get("w"), len(blocks)),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptStoreError(f"corrupt index entry: {exc}") from exc
        if meta.n_tokens < 1 or meta.pins < 0 or meta.at < 0 or len(meta.fingerprint) != 16 \
                or any(s < 0 for _, s in meta.blocks) or len(meta.parent) not in (0, 32):
            raise CorruptStoreError("corrupt index entry: values out of range")
        return meta

    def with_(self, **changes: Any) -> ChunkMeta:
        """A copy with ``changes``. New ``blocks`` without new ``pipes`` (``written``) forget
        the labels (write times) of the layers whose block changed (never a stale one)."""
        blocks = changes.get("blocks")
        if blocks is not None:
            same = [i < len(self.blocks) and self.blocks[i] == b for i, b in enumerate(blocks)]
            if "pipes" not in changes and self.pipes:
                changes["pipes"] = tuple(self.pipe(i) if s else "" for i, s in enumerate(same))
            if "written" not in changes and self.written:
                changes["written"] = tuple(self.written_at(i) if s else 0
                                           for i, s in enumerate(same))
        return replace(self, **changes)


def _lookup(txn: Any, db: Any, key: bytes, what: str) -> Any:
    """``txn.get``, a failure of LMDB (a damaged page; the snapshot is unusable after it) as
    the entry's :class:`CorruptStoreError`."""
    try:
        return txn.get(key, db=db)
    except lmdb.Error as exc:
        raise CorruptStoreError(f"index {what}: the lookup failed on a damaged page "
                                f"({exc})") from exc


def seal(key: bytes, body: bytes) -> bytes:
    return body + xxhash.xxh3_64_digest(key + body)


def unseal(key: bytes, raw: Any, what: str) -> bytes:
    data = bytes(raw)
    if len(data) < 8 or xxhash.xxh3_64_digest(key + data[:-8]) != data[-8:]:
        raise CorruptStoreError(f"index entry {what} failed its checksum")
    return data[:-8]


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

    def __init__(self, path: Path, *, sync: bool, readonly: bool = False,
                 create: bool = True) -> None:
        self.env: SharedEnv = acquire(path, map_size=INDEX_MAP_BYTES, dbs=_DBS, sync=sync,
                                      readonly=readonly, create=create)
        self._chunks = self.env.db(CHUNKS)
        self._kids = self.env.db(KIDS)
        self._lru = self.env.db(LRU)
        self._models = self.env.db(MODELS)
        self._meta = self.env.db(META)
        self.format = INDEX_FORMAT
        self._live: tuple[Any, Usage] | None = None   # the open write txn and its usage

    def check(self) -> None:
        """Verify the index file's structure before a scan (under the writer lock): a cursor
        walking onto a damaged page would abort the process inside LMDB."""
        with self.env.exclusive():
            self.env.check_pages()

    def close(self) -> None:
        release(self.env)

    def _get(self, txn: Any, db: Any, key: bytes, what: str) -> bytes | None:
        if db is None:
            return None
        v = _lookup(txn, db, key, what)
        return None if v is None else self._open(key, v, what)

    def _open(self, key: bytes, raw: Any, what: str) -> bytes:
        return unseal(key, raw, what) if self.format >= 2 else bytes(raw)

    def _put(self, txn: Any, db: Any, key: bytes, body: bytes) -> None:
        txn.put(key, seal(key, body), db=db)

    # -- meta -------------------------------------------------------------------------------
    def get_meta(self, txn: Any, name: str) -> Any:
        v = self._get(txn, self._meta, name.encode(), f"meta/{name}")
        if v is None:
            return None
        try:
            return json.loads(v)
        except ValueError as exc:
            raise CorruptStoreError(f"corrupt index metadata {name!r}") from exc

    def meta_or_none(self, txn: Any, name: str) -> Any:
        """Like :meth:`get_meta`, with None for a damaged value as well as a missing one."""
        try:
            return self.get_meta(txn, name)
        except CorruptStoreError:
            return None

    def set_meta(self, txn: Any, name: str, value: Any) -> None:
        self._put(txn, self._meta, name.encode(), json.dumps(value, sort_keys=True).encode())

    def check_format(self, txn: Any) -> bool:
        """True when the index exists; learns its format (1 to 3); raises on others."""
        raw = None if self._meta is None else txn.get(b"format", db=self._meta)
        if raw is None:
            return False
        raw = bytes(raw)
        for fmt, body in ((3, raw[:-8]), (2, raw[:-8]), (1, raw)):
            try:
                if json.loads(body) == fmt and (fmt == 1 or seal(b"format", body) == raw):
                    self.format = fmt
                    return True
            except ValueError:
                continue
        raise UnknownFormatError(f"index format {raw[:16]!r} is not supported (or damaged)")

    def upgrade(self, txn: Any) -> int:
        """Bring an older index to the current format; returns the format it had."""
        was = self.format
        if self.format == 1:
            self._upgrade_v1(txn)
        if self.format == 2:
            if self._lru is not None:
                txn.drop(self._lru, delete=False)
            self.format = INDEX_FORMAT
        self.set_meta(txn, "format", INDEX_FORMAT)
        return was

    def _upgrade_v1(self, txn: Any) -> None:
        """Rewrite a format-1 index as format 2 (seals and the ``kids`` database)."""
        self.check()
        entries = {db: [(bytes(k), bytes(v)) for k, v in txn.cursor(db=db)]
                   for db in (self._chunks, self._models, self._meta)}
        for db, items in entries.items():
            for k, v in items:
                if db is self._chunks:
                    d = json.loads(v)
                    d.pop("k", None)
                    v = json.dumps(d, separators=(",", ":")).encode()
                    if d["p"]:
                        txn.put(bytes.fromhex(d["p"]) + k, b"", db=self._kids)
                self._put(txn, db, k, v)
        self.format = 2

    # -- usage: kept by the index itself -----------------------------------------------------
    def usage(self, txn: Any) -> Usage:
        """Blocks and bytes per tier as of ``txn``, including this write transaction's own
        changes (:meth:`put_chunk` and :meth:`del_chunk` account for them)."""
        if self._live is not None and self._live[0] is txn:
            return self._live[1]
        try:
            raw = self.get_meta(txn, "usage") or {}
            return Usage({str(t): [int(b), int(n)] for t, (b, n) in raw.items()})
        except (CorruptStoreError, ValueError, TypeError, AttributeError):
            return self.recount_usage(txn)   # derived data: rebuild rather than fail

    def live_usage(self, txn: Any) -> Usage:
        """The usage a write transaction changes as it goes (writers only: under the
        store's writer lock, one write transaction at a time)."""
        if self._live is None or self._live[0] is not txn:
            self._live = (txn, self.usage(txn))
        return self._live[1]

    def set_usage(self, txn: Any, usage: Usage) -> None:
        """Replace the accounting (a recount); written at :meth:`flush`."""
        self._live = (txn, usage)

    def flush(self, txn: Any) -> None:
        """Write this transaction's usage (the end of every mutation, before the commit)."""
        if self._live is not None and self._live[0] is txn:
            self.set_meta(txn, "usage", self._live[1].tiers)
        self._live = None

    def recount_usage(self, txn: Any) -> Usage:
        """Usage recomputed from the chunk entries (readable ones)."""
        usage = Usage()
        for _, meta in self.chunks(txn):
            if meta is not None:
                for tier, size in meta.blocks:
                    usage.add(tier, 1, size)
        return usage

    # -- models -----------------------------------------------------------------------------
    def put_model(self, txn: Any, fingerprint: bytes, spec_json: bytes) -> None:
        try:
            if self._get(txn, self._models, fingerprint, "model") is not None:
                return
        except CorruptStoreError:
            pass  # rewrite a damaged entry with the caller's (identical by fingerprint) spec
        self._put(txn, self._models, fingerprint, spec_json)

    def get_model(self, txn: Any, fingerprint: bytes) -> dict[str, Any] | None:
        """The model spec stored under ``fingerprint`` (None: none, or a damaged entry)."""
        try:
            v = self._get(txn, self._models, fingerprint, "model")
            return None if v is None else json.loads(v)  # type: ignore[no-any-return]
        except (CorruptStoreError, ValueError):
            return None

    def models(self, txn: Any) -> dict[bytes, dict[str, Any] | None]:
        """Model specs by fingerprint; None for an entry that is damaged."""
        out: dict[bytes, dict[str, Any] | None] = {}
        if self._models is None:
            return out
        self.check()
        for k, v in txn.cursor(db=self._models):
            key = bytes(k)
            try:
                out[key] = json.loads(self._open(key, v, "model"))
            except (CorruptStoreError, ValueError):
                out[key] = None
        return out

    # -- chunks -----------------------------------------------------------------------------
    def get_chunk(self, txn: Any, key: bytes) -> ChunkMeta | None:
        """The chunk's entry, None when absent; raises CorruptStoreError when damaged."""
        v = self._get(txn, self._chunks, key, f"chunk {key.hex()[:16]}")
        return None if v is None else ChunkMeta.from_json(v)

    def read_chunk(self, txn: Any, key: bytes) -> ChunkMeta | None:
        """The chunk's entry, or None when it is absent or damaged."""
        try:
            return self.get_chunk(txn, key)
        except CorruptStoreError:
            return None

    def has_chunk(self, txn: Any, key: bytes) -> bool:
        """Whether the chunk has an entry (not checked); raises CorruptStoreError when the
        lookup fails on a damaged page."""
        return (self._chunks is not None
                and _lookup(txn, self._chunks, key, f"chunk {key.hex()[:16]}") is not None)

    def put_chunk(self, txn: Any, key: bytes, meta: ChunkMeta, old: ChunkMeta | None) -> None:
        """Write an entry (``old``: the entry it replaces, None for a new chunk); the
        usage follows the change of its blocks."""
        usage = self.live_usage(txn)
        if old is None and meta.parent:
            txn.put(meta.parent + key, b"", db=self._kids)
        if old is not None and old.blocks != meta.blocks:
            for tier, size in old.blocks:
                usage.add(tier, -1, -size)
        if old is None or old.blocks != meta.blocks:
            for tier, size in meta.blocks:
                usage.add(tier, 1, size)
        self._put(txn, self._chunks, key, meta.to_json())

    def del_chunk(self, txn: Any, key: bytes, meta: ChunkMeta | None) -> None:
        """Remove an entry (``meta`` None for a damaged one: the usage is recounted by
        verify's repair)."""
        if meta is not None:
            usage = self.live_usage(txn)
            for tier, size in meta.blocks:
                usage.add(tier, -1, -size)
            if meta.parent:
                txn.delete(meta.parent + key, db=self._kids)
        txn.delete(key, db=self._chunks)

    def kids(self, txn: Any, key: bytes) -> list[bytes]:
        """Keys of the stored children of chunk ``key``."""
        if self._kids is None:
            return []
        cur = txn.cursor(db=self._kids)
        out: list[bytes] = []
        if not cur.set_range(key):
            return out
        for k in cur.iternext(values=False):
            k = bytes(k)
            if not k.startswith(key):
                break
            out.append(k[len(key):])
        return out

    def kid_counts(self, txn: Any) -> dict[bytes, int]:
        """Number of child rows per parent key (one pass over ``kids``)."""
        out: dict[bytes, int] = {}
        self.check()
        if self._kids is not None:
            for k in txn.cursor(db=self._kids).iternext(values=False):
                parent = bytes(k[:32])
                out[parent] = out.get(parent, 0) + 1
        return out

    def has_kids(self, txn: Any, key: bytes) -> bool:
        if self._kids is None:
            return False
        cur = txn.cursor(db=self._kids)
        return bool(cur.set_range(key)) and bytes(cur.key()).startswith(key)

    def chunks(self, txn: Any) -> Iterator[tuple[bytes, ChunkMeta | None]]:
        """Every entry; None for an entry that is damaged."""
        if self._chunks is None:
            return
        self.check()
        for k, v in txn.cursor(db=self._chunks):
            key = bytes(k)
            try:
                yield key, ChunkMeta.from_json(self._open(key, v, f"chunk {key.hex()[:16]}"))
            except CorruptStoreError:
                yield key, None

    def clear(self, txn: Any) -> None:
        for db in (self._chunks, self._kids, self._lru, self._models):
            txn.drop(db, delete=False)
        self.set_usage(txn, Usage())
