"""The engine: put, lookup and get KV caches by token prefix over verified, tiered records."""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from contextlib import ExitStack, suppress
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from rkv.blockcodec import (
    codec_for,
    encode_block,
    quantizer_for,
    read_block,
    record_size,
    reencode,
)
from rkv.config import EngineConfig, TierConfig
from rkv.errors import (
    ConfigError,
    IntegrityError,
    MissingRecordError,
    RecordMismatchError,
    RkvError,
    ShapeError,
    StoreClosedError,
    TierFullError,
)
from rkv.index import INDEX_FORMAT, ChunkMeta, Index, Usage
from rkv.keys import as_token_array, block_key, chunk_bounds, chunk_keys
from rkv.model import ModelSpec, as_model_spec
from rkv.record import (
    RecordHeader,
    decode_record,
)
from rkv.tensors import as_kv_array, numpy_dtype, to_output
from rkv.tiers import LmdbTier, Tier, TierReader

log = logging.getLogger("rkv")

#: Block outcomes reported by :meth:`Engine.get` and :meth:`Engine.verify`.
OK, CORRECTED, UNCORRECTABLE, MISSING = "ok", "corrected", "uncorrectable", "missing"
_TOUCH_FLUSH = 4096


def memory_dir() -> Path | None:
    """A memory-backed directory for the memory tiers, or None when the machine has none."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK):
        return shm
    return None


def resolve_tier_path(root: Path, tier: TierConfig) -> Path:
    if tier.path:
        p = Path(tier.path).expanduser()
        return p if p.is_absolute() else root / p
    shm = memory_dir()
    if tier.medium == "memory" and shm is not None:
        tag = hashlib.blake2b(str(root.resolve()).encode(), digest_size=8).hexdigest()
        return shm / f"rkv-{tag}" / tier.name
    return root / "tiers" / tier.name


@dataclass(frozen=True, slots=True)
class BlockStatus:
    """The outcome of reading one block."""

    chunk: int
    layer: int
    tier: str
    status: str                   # ok | corrected | uncorrectable | missing
    corrected: int = 0            # symbols (Reed-Solomon) or bits (BCH) the ECC corrected
    error: IntegrityError | None = None
    header_repairs: int = 0       # header/prelude copies that were outvoted or skipped


@dataclass(frozen=True)
class GetResult:
    """KV for the longest verified stored prefix of the requested tokens."""

    n_tokens: int
    kv: Any                       # [layers, 2, n_tokens, kv_heads, head_dim], numpy or torch
    blocks: list[BlockStatus]
    stored_tokens: int            # what lookup() promised before verification

    @property
    def counts(self) -> dict[str, int]:
        c = Counter(b.status for b in self.blocks)
        return {s: c.get(s, 0) for s in (OK, CORRECTED, UNCORRECTABLE, MISSING)}

    @property
    def corrected(self) -> int:
        return sum(b.corrected for b in self.blocks)

    @property
    def ok(self) -> bool:
        """True when every stored block was read back verified (clean or corrected)."""
        return self.n_tokens == self.stored_tokens

    def errors(self) -> list[IntegrityError]:
        return [b.error for b in self.blocks if b.error is not None]


@dataclass(frozen=True)
class PutResult:
    n_tokens: int
    chunks: int
    chunks_written: int
    chunks_deduped: int
    blocks_written: int
    bytes_written: int
    evicted_chunks: int = 0
    demoted_chunks: int = 0
    tiers: dict[str, int] = field(default_factory=dict)   # chunks written per tier


@dataclass(frozen=True)
class VerifyReport:
    chunks: int
    blocks: int
    ok: int
    corrected: int
    uncorrectable: int
    missing: int
    orphans: int
    problems: list[tuple[str, int, str, str]]   # (chunk key hex, layer, tier, message)
    repaired: int = 0

    @property
    def clean(self) -> bool:
        return self.uncorrectable == 0 and self.missing == 0


class _Scratch:
    """A reusable, growable uint8 buffer (records are encoded into it one at a time)."""

    def __init__(self) -> None:
        self._buf = np.empty(0, dtype=np.uint8)

    def __call__(self, n: int) -> np.ndarray:
        if self._buf.size < n:
            self._buf = np.empty(n, dtype=np.uint8)
        return self._buf[:n]


class _Pending:
    """Tier writes and deletions planned inside one index transaction.

    Writes go to the tiers before the index commits; deletions only after it, so a crash in
    between leaves unreferenced records (harmless, reported by verify), never dangling ones.
    """

    def __init__(self, tiers: dict[str, Tier], reader: Callable[[str, bytes], bytes | None]):
        self.tiers = tiers
        self._read = reader
        self.writes: dict[str, dict[bytes, tuple[Any, int]]] = defaultdict(dict)
        self.deletes: dict[str, set[bytes]] = defaultdict(set)

    def write(self, tier: str, key: bytes, value: Any, size: int) -> None:
        """Plan a write of ``value`` (bytes-like, or a callable producing ``size`` bytes)."""
        self.writes[tier][key] = (value, size)
        self.deletes[tier].discard(key)

    def move(self, key: bytes, src: str, dst: str,
             transform: Callable[[Any], Any] | None = None) -> int:
        """Plan moving a record between tiers, through ``transform`` (re-encoding) when
        given. Returns the record's size in ``dst``."""
        planned = self.writes[src].pop(key, None)
        if planned is None:
            value = self._read(src, key)
            if value is None:
                raise MissingRecordError(f"record {key.hex()} is missing from tier {src}")
            planned = (value, len(value))
        if transform is not None:
            value = planned[0]() if callable(planned[0]) else planned[0]
            value = transform(bytes(value))
            planned = (value, memoryview(value).nbytes)
        self.write(dst, key, *planned)
        self.deletes[src].add(key)
        return planned[1]

    def drop(self, tier: str, key: bytes) -> None:
        self.writes[tier].pop(key, None)
        self.deletes[tier].add(key)

    def flush_writes(self) -> None:
        for tier, items in self.writes.items():
            if items:
                self.tiers[tier].put_many([(k, v) for k, (v, _) in items.items()],
                                          reserve=sum(n for _, n in items.values()))

    def flush_deletes(self) -> None:
        for tier, keys in self.deletes.items():
            if keys and tier in self.tiers:
                self.tiers[tier].delete_many(keys)


class Engine:
    """A reliability-aware tiered KV store. Open with :meth:`Engine.open`."""

    def __init__(self, root: Path, config: EngineConfig, index: Index,
                 tiers: dict[str, Tier]) -> None:
        self.root = root
        self.config = config
        self._index = index
        self._tiers = tiers
        self._order = [t.name for t in config.tiers]
        self._codecs = {t.name: codec_for(t.ecc) for t in config.tiers}
        self._quants = {t.name: quantizer_for(t.quant) for t in config.tiers}
        self._pid = os.getpid()
        self._closed = False
        self._lock = threading.RLock()
        self._touched: dict[bytes, int] = {}
        self._counters: Counter[str] = Counter()

    # -- opening and closing ------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | os.PathLike[str], config: EngineConfig | None = None, *,
             create: bool = True) -> Engine:
        """Open (or create) the store at ``path``.

        Without ``config`` an existing store keeps its stored configuration and a new one gets
        the embedded default (DRAM and CXL tiers in memory, NVMe on disk). A given config
        replaces the stored one, except ``chunk_tokens``, which is fixed once a store exists.
        """
        if config is not None and not isinstance(config, EngineConfig):
            raise ConfigError(f"config must be an EngineConfig, got {type(config).__name__}")
        root = Path(path).expanduser()
        if not create and not (root / "index" / "data.mdb").exists():
            raise RkvError(f"{root} is not an rkv store (no index)")
        root.mkdir(parents=True, exist_ok=True)
        index = Index(root / "index", sync=bool(config and config.index_sync))
        try:
            with index.env.read() as txn:
                exists = index.check_format(txn)
                stored = index.get_meta(txn, "config") if exists else None
            if stored is not None:
                stored_cfg = EngineConfig.from_dict(stored)
                if config is None:
                    config = stored_cfg
                elif config.chunk_tokens != stored_cfg.chunk_tokens:
                    raise ConfigError(
                        f"store {root} uses chunk_tokens={stored_cfg.chunk_tokens}; "
                        f"cannot reopen it with {config.chunk_tokens}"
                    )
            config = config or EngineConfig()
            tiers: dict[str, Tier] = {}
            try:
                for t in config.tiers:
                    tiers[t.name] = LmdbTier(t, resolve_tier_path(root, t))
            except BaseException:
                for tier in tiers.values():
                    tier.close()
                raise
        except BaseException:
            index.close()
            raise
        engine = cls(root, config, index, tiers)
        final = config
        engine._mutate(lambda txn, pending: engine._reconcile(txn, pending, final))
        return engine

    @classmethod
    def destroy(cls, path: str | os.PathLike[str]) -> None:
        """Delete the store at ``path``, including tiers kept outside it (memory tiers)."""
        import shutil

        root = Path(path).expanduser()
        if not root.exists():
            return
        try:
            with cls.open(root, create=False) as engine:
                dirs = [resolve_tier_path(root, t) for t in engine.config.tiers]
        except RkvError:
            dirs = []
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
            parent = d.parent
            if parent.name.startswith("rkv-") and parent.parent == memory_dir():
                with suppress(OSError):
                    parent.rmdir()
        shutil.rmtree(root, ignore_errors=True)

    def _reconcile(self, txn: Any, pending: _Pending, config: EngineConfig) -> None:
        """Record the config and drop index entries whose tier storage is gone."""
        ix = self._index
        ix.set_meta(txn, "format", INDEX_FORMAT)
        ix.set_meta(txn, "config", config.to_dict())
        known = ix.get_meta(txn, "tiers") or {}
        current = {name: tier.store_id for name, tier in self._tiers.items()}
        lost = {name for name, sid in known.items() if current.get(name) != sid}
        if lost:
            dropped = 0
            for key, meta in list(ix.chunks(txn)):
                if meta.tiers() & lost:
                    self._free_chunk(txn, key, meta, pending, None)
                    dropped += 1
            dropped += self._drop_orphans(txn, pending)
            log.warning("tiers %s were wiped or removed; dropped %d chunks from the index",
                        sorted(lost), dropped)
            usage = ix.usage(txn)
            for name in lost:
                usage.tiers.pop(name, None)
            ix.set_usage(txn, usage)
        ix.set_meta(txn, "tiers", current)

    def _drop_orphans(self, txn: Any, pending: _Pending) -> int:
        """Remove chunks whose parent is gone (unreachable by any lookup)."""
        dropped = 0
        while True:
            orphans = [(k, m) for k, m in self._index.chunks(txn)
                       if m.parent and not self._index.has_chunk(txn, m.parent)]
            if not orphans:
                return dropped
            for k, m in orphans:
                self._free_chunk(txn, k, m, pending, None)
                dropped += 1

    def close(self) -> None:
        """Flush access times and release the LMDB environments. Idempotent."""
        if self._closed:
            return
        if os.getpid() == self._pid:
            try:
                if self._touched:
                    self._mutate(lambda txn, pending: None)
            finally:
                for tier in self._tiers.values():
                    tier.close()
                self._index.close()
        self._closed = True

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _check(self) -> None:
        if self._closed:
            raise StoreClosedError("the engine is closed")
        if os.getpid() != self._pid:
            raise StoreClosedError(
                "this Engine was opened in another process; call Engine.open() again after fork"
            )

    @property
    def tiers(self) -> dict[str, Tier]:
        return dict(self._tiers)

    def wrap_tier(self, name: str, wrap: Callable[[Tier], Tier]) -> Tier:
        """Replace tier ``name`` by ``wrap(tier)`` (e.g. a fault-injecting or logging tier
        around it); returns the wrapper. The wrapper must implement :class:`Tier`."""
        self._check()
        if name not in self._tiers:
            raise ConfigError(f"no tier named {name!r}")
        wrapped = wrap(self._tiers[name])
        if not isinstance(wrapped, Tier):
            raise ConfigError("a tier wrapper must return a Tier")
        self._tiers[name] = wrapped
        return wrapped

    # -- the write path -----------------------------------------------------------------------
    def _read_record(self, tier: str, key: bytes) -> bytes | None:
        return self._tiers[tier].get(key)

    def _mutate(self, fn: Callable[[Any, _Pending], Any]) -> Any:
        """Run ``fn`` under the store's write lock (the index write transaction)."""
        self._check()
        pending_box: list[_Pending] = []
        with self._lock:
            touched, self._touched = self._touched, {}

        def body(txn: Any) -> Any:
            pending = _Pending(self._tiers, self._read_record)
            pending_box[:] = [pending]
            self._flush_touches(txn, touched)
            result = fn(txn, pending)
            pending.flush_writes()
            return result

        result = self._index.env.write(body)
        pending_box[0].flush_deletes()
        return result

    def _flush_touches(self, txn: Any, touched: dict[bytes, int]) -> None:
        for key, at in touched.items():
            meta = self._index.get_chunk(txn, key)
            if meta is not None and at > meta.at:
                self._index.put_chunk(txn, key, meta.with_(at=at), meta)

    def _touch(self, keys: list[bytes]) -> None:
        now = time.time_ns()
        with self._lock:
            for k in keys:
                self._touched[k] = now
            flush = len(self._touched) >= _TOUCH_FLUSH
        if flush:
            self._mutate(lambda txn, pending: None)

    def _prepare(self, tokens: Any, model: ModelSpec | dict[str, Any]
                 ) -> tuple[ModelSpec, bytes, np.ndarray, list[bytes]]:
        self._check()
        spec = as_model_spec(model)
        fp = spec.fingerprint()
        toks = as_token_array(tokens)
        keys = chunk_keys(toks, fp, self.config.chunk_tokens,
                          partial=self.config.store_partial_chunks)
        return spec, fp, toks, keys

    def put(self, tokens: Any, kv: Any, *, model: ModelSpec | dict[str, Any]) -> PutResult:
        """Store the KV of ``tokens``; chunks already stored are not written again.

        ``kv`` is a numpy array or torch tensor shaped ``[layers, 2, tokens, kv_heads,
        head_dim]`` in the model's dtype. Everything is validated before anything is written.
        """
        spec, fp, toks, keys = self._prepare(tokens, model)
        arr = as_kv_array(kv, spec, len(toks))
        if not keys:
            return PutResult(0, 0, 0, 0, 0, 0)
        bounds = chunk_bounds(len(toks), self.config.chunk_tokens)[: len(keys)]
        ix = self._index
        with ix.env.read() as txn:
            present = [ix.has_chunk(txn, k) for k in keys]
            last = ix.get_chunk(txn, keys[-1])
        if all(present) and last is not None and last.end:
            self._touch(keys)
            with self._lock:
                self._counters["puts"] += 1
                self._counters["chunks_deduped"] += len(keys)
            return PutResult(len(toks), len(keys), 0, len(keys), 0, 0)
        spec_json = ModelSpec.to_dict(spec)
        scratch = _Scratch()

        def fn(txn: Any, pending: _Pending) -> PutResult:
            import json

            ix.put_model(txn, fp, json.dumps(spec_json, sort_keys=True).encode())
            usage = ix.usage(txn)
            now = time.time_ns()
            protect = set(keys)
            stats: Counter[str] = Counter()
            per_tier: Counter[str] = Counter()
            written = deduped = blocks = nbytes = 0
            for i, key in enumerate(keys):
                if ix.has_chunk(txn, key):
                    deduped += 1
                    continue
                start, end = bounds[i]
                header = RecordHeader(key=key, layer=0, fingerprint=fp,
                                      shape=spec.block_shape(end - start), dtype=spec.dtype,
                                      data_len=0, payload_len=0)
                data_bytes = arr[0, :, start:end].nbytes

                def chunk_size(tier: str, header: RecordHeader = header,
                               data_bytes: int = data_bytes) -> int:
                    return record_size(header, data_bytes, self._codecs[tier],
                                       self._quant_for(tier, header)) * spec.n_layers

                tier = self._place(txn, usage, chunk_size, protect, pending, stats)
                codec = self._codecs[tier]
                quant = self._quant_for(tier, header)
                rec_size = chunk_size(tier) // spec.n_layers
                size = rec_size * spec.n_layers
                for layer in range(spec.n_layers):
                    # Encoded at write time (raw blocks into one reused buffer: LMDB copies
                    # each record, so no block needs a buffer of its own).
                    pending.write(tier, block_key(key, layer), partial(
                        encode_block, replace(header, layer=layer),
                        arr[layer, :, start:end], codec, scratch, quant),
                        rec_size)
                recs = [rec_size] * spec.n_layers
                parent = keys[i - 1] if i else b""
                meta = ChunkMeta(parent=parent, pos=i, n_tokens=bounds[i][1] - bounds[i][0],
                                 fingerprint=fp, blocks=tuple((tier, r) for r in recs),
                                 at=now)
                ix.put_chunk(txn, key, meta, None)
                usage.add(tier, len(recs), size)
                if parent:
                    pmeta = ix.get_chunk(txn, parent)
                    if pmeta is not None:
                        ix.put_chunk(txn, parent, pmeta.with_(kids=pmeta.kids + 1), pmeta)
                written += 1
                blocks += len(recs)
                nbytes += size
                per_tier[tier] += 1
            lmeta = ix.get_chunk(txn, keys[-1])
            if lmeta is not None and not lmeta.end:
                ix.put_chunk(txn, keys[-1], lmeta.with_(end=True), lmeta)
            ix.set_usage(txn, usage)
            return PutResult(len(toks), len(keys), written, deduped, blocks, nbytes,
                             stats["evicted"], stats["demoted"], dict(per_tier))

        result: PutResult = self._mutate(fn)
        self._touch(keys)
        with self._lock:
            c = self._counters
            c["puts"] += 1
            c["chunks_written"] += result.chunks_written
            c["chunks_deduped"] += result.chunks_deduped
            c["blocks_written"] += result.blocks_written
            c["bytes_written"] += result.bytes_written
            c["evicted_chunks"] += result.evicted_chunks
            c["demoted_chunks"] += result.demoted_chunks
        return result

    def _quant_for(self, tier: str, header: RecordHeader) -> Any:
        """The tier's quantizer, unless it would not shrink this block (a short tail chunk,
        whose per-group metadata outweighs its values): then the values are stored as
        they are. Every record says which way it went."""
        quant = self._quants[tier]
        if quant is None:
            return None
        raw = int(np.prod(header.shape)) * numpy_dtype(header.dtype).itemsize
        return quant if quant.encoded_size(header.shape, header.dtype) < raw else None

    def _place(self, txn: Any, usage: Usage, size: Callable[[str], int], protect: set[bytes],
               pending: _Pending, stats: Counter[str]) -> str:
        """Pick the first tier that has (or can be made to have) room for a chunk of
        ``size(tier)`` bytes (the size depends on the tier's codec)."""
        for level, name in enumerate(self._order):
            if self._make_room(txn, level, size(name), usage, protect, pending, stats):
                return name
        raise TierFullError(
            f"no tier can take a chunk of {size(self._order[-1])} bytes (all full of pinned "
            f"or in-use data, or on_full='{self.config.on_full}')"
        )

    def _make_room(self, txn: Any, level: int, need: int, usage: Usage, protect: set[bytes],
                   pending: _Pending, stats: Counter[str]) -> bool:
        """Demote (upper tiers) or evict (last tier) LRU chunks until ``need`` bytes fit."""
        name = self._order[level]
        cap = self.config.tiers[level].capacity_bytes
        if need > cap:
            return False
        last = level == len(self._order) - 1
        ix = self._index
        while usage.bytes(name) + need > cap:
            if last and self.config.on_full == "error":
                raise TierFullError(
                    f"tier {name} is full ({usage.bytes(name)} of {cap} bytes) and "
                    "on_full='error'"
                )
            deficit = usage.bytes(name) + need - cap
            victims: list[tuple[bytes, ChunkMeta]] = []
            freed = 0
            for key in ix.lru_order(txn, name):
                if key in protect:
                    continue
                meta = ix.get_chunk(txn, key)
                if meta is None or meta.pins or (last and meta.kids):
                    continue  # only leaves leave the last tier, so prefixes stay reachable
                victims.append((key, meta))
                freed += meta.bytes_in(name)
                if freed >= deficit:
                    break
            if not victims:
                return False
            for key, meta in victims:
                if last:
                    self._free_chunk(txn, key, meta, pending, usage)
                    stats["evicted"] += 1
                    continue
                nbytes = meta.bytes_in(name)
                dst = self._order[level + 1]
                if not self._make_room(txn, level + 1, nbytes, usage, protect | {key},
                                       pending, stats):
                    return False
                blocks = []
                for layer, (tier, size) in enumerate(meta.blocks):
                    if tier == name:
                        new_size = pending.move(block_key(key, layer), name, dst,
                                                self._transcoder(dst, stats))
                        usage.add(name, -1, -size)
                        usage.add(dst, 1, new_size)
                        tier, size = dst, new_size
                    blocks.append((tier, size))
                current = ix.get_chunk(txn, key) or meta
                ix.put_chunk(txn, key, current.with_(blocks=tuple(blocks)), current)
                stats["demoted"] += 1
        return True

    def _transcoder(self, tier: str, stats: Counter[str]) -> Callable[[Any], Any]:
        """Re-encode a moving record with ``tier``'s codec. A record that fails verification
        moves unchanged, so its reads still report it (never silently "repaired")."""
        codec = self._codecs[tier]

        def transform(record: Any) -> Any:
            try:
                dec = decode_record(record)
                out = reencode(record, dec, codec)
            except IntegrityError:
                stats["moved_corrupt"] += 1
                return record
            if out is not record:
                stats["reencoded"] += 1
            return out

        return transform

    def _free_chunk(self, txn: Any, key: bytes, meta: ChunkMeta, pending: _Pending,
                    usage: Usage | None) -> None:
        """Remove one chunk from the index (records deleted after commit)."""
        ix = self._index
        ix.del_chunk(txn, key, meta)
        for layer, (tier, size) in enumerate(meta.blocks):
            pending.drop(tier, block_key(key, layer))
            if usage is not None:
                usage.add(tier, -1, -size)
        if meta.parent:
            pmeta = ix.get_chunk(txn, meta.parent)
            if pmeta is not None:
                ix.put_chunk(txn, meta.parent, pmeta.with_(kids=max(0, pmeta.kids - 1)), pmeta)

    # -- the read path ------------------------------------------------------------------------
    def _stored(self, txn: Any, keys: list[bytes]) -> list[ChunkMeta]:
        metas = []
        for k in keys:
            m = self._index.get_chunk(txn, k)
            if m is None:
                break
            metas.append(m)
        return metas

    def lookup(self, tokens: Any, *, model: ModelSpec | dict[str, Any]) -> int:
        """Length in tokens of the longest stored prefix of ``tokens`` (not yet verified)."""
        _, _, _, keys = self._prepare(tokens, model)
        with self._index.env.read() as txn:
            metas = self._stored(txn, keys)
        with self._lock:
            self._counters["lookups"] += 1
        return sum(m.n_tokens for m in metas)

    def get(self, tokens: Any, *, model: ModelSpec | dict[str, Any], as_torch: bool = False,
            strict: bool = False, out: np.ndarray | None = None) -> GetResult:
        """Read back the KV of the longest stored prefix of ``tokens``, verified.

        Every block's header and checksum are checked. Reading stops at the first chunk with a
        block that is uncorrectable or missing: ``n_tokens`` counts only the verified prefix,
        and ``blocks`` reports what happened to each block read. With ``strict=True`` the first
        integrity error is raised instead.

        ``out`` (numpy, ``[layers, 2, >= tokens, kv_heads, head_dim]`` in the model's dtype)
        is filled in place instead of allocating, e.g. a serving engine's preallocated buffer;
        positions past ``n_tokens`` are unspecified.
        """
        spec, fp, toks, keys = self._prepare(tokens, model)
        with self._index.env.read() as txn:
            metas = self._stored(txn, keys)
        stored = sum(m.n_tokens for m in metas)
        dtype = numpy_dtype(spec.dtype)
        if out is None:
            out = np.empty((spec.n_layers, 2, stored, spec.n_kv_heads, spec.head_dim), dtype)
        else:
            want = (spec.n_layers, 2, len(toks), spec.n_kv_heads, spec.head_dim)
            if (not isinstance(out, np.ndarray) or out.dtype != dtype or out.ndim != 5
                    or out.shape[:2] != want[:2] or out.shape[3:] != want[3:]
                    or out.shape[2] < stored or not out.flags.writeable):
                raise ShapeError(
                    f"out must be a writeable {dtype} numpy array shaped {want} (or longer "
                    "along tokens)"
                )
        statuses: list[BlockStatus] = []
        done = 0
        with ExitStack() as stack:
            readers: dict[str, TierReader] = {}

            def reader(tier: str) -> TierReader:
                if tier not in readers:
                    readers[tier] = stack.enter_context(self._tiers[tier].reader())
                return readers[tier]

            starts: list[int] = []
            for ci, meta in enumerate(metas):
                starts.append(done)
                good = True
                n = meta.n_tokens
                for layer in range(spec.n_layers):
                    st = self._read_block(reader, keys[ci], ci, layer, meta, fp, spec,
                                          out[layer, :, done:done + n])
                    statuses.append(st)
                    if st.status in (UNCORRECTABLE, MISSING):
                        good = False
                        if strict:
                            assert st.error is not None
                            raise st.error
                if not good:
                    break
                done += n
        if self.config.repair:
            fixes = [(keys[st.chunk], st.layer, st.tier) for st in statuses
                     if st.status == CORRECTED]
            if fixes:
                self._repair(fixes)
        self._touch(keys[: len(metas)])
        with self._lock:
            c = self._counters
            c["gets"] += 1
            c["hits"] += int(done > 0)
            c["blocks_read"] += len(statuses)
            for st in statuses:
                c[f"blocks_{st.status}"] += 1
        kv = out if out.shape[2] == done else out[:, :, :done]
        return GetResult(done, to_output(kv, spec.dtype, as_torch), statuses, stored)

    def _read_block(self, reader: Callable[[str], TierReader], key: bytes, ci: int, layer: int,
                    meta: ChunkMeta, fp: bytes, spec: ModelSpec, dest: np.ndarray
                    ) -> BlockStatus:
        tier = meta.blocks[layer][0] if layer < len(meta.blocks) else "?"
        bkey = block_key(key, layer)
        try:
            if layer >= len(meta.blocks):
                raise RecordMismatchError(
                    f"index entry has {len(meta.blocks)} layers, the model {spec.n_layers}"
                )
            rec = reader(tier).get(bkey)
            if rec is None:
                # A concurrent writer may have demoted the chunk: look again, once.
                with self._index.env.read() as txn:
                    fresh = self._index.get_chunk(txn, key)
                if fresh is None:
                    return BlockStatus(ci, layer, tier, MISSING, 0,
                                       MissingRecordError("chunk was evicted during the read"))
                tier = fresh.blocks[layer][0]
                copy = self._tiers[tier].get(bkey)
                if copy is None:
                    raise MissingRecordError(f"block {bkey.hex()} is missing from tier {tier}")
                rec = memoryview(copy)
            repairs, corrected = self._verify_into(rec, key, layer, fp, spec, meta.n_tokens,
                                                   dest)
        except MissingRecordError as exc:
            return BlockStatus(ci, layer, tier, MISSING, 0, exc)
        except IntegrityError as exc:
            return BlockStatus(ci, layer, tier, UNCORRECTABLE, 0, exc)
        if repairs or corrected:
            return BlockStatus(ci, layer, tier, CORRECTED, corrected, None, repairs)
        return BlockStatus(ci, layer, tier, OK)

    @staticmethod
    def _verify_into(rec: Any, key: bytes, layer: int, fp: bytes, spec: ModelSpec,
                     n_tokens: int, dest: np.ndarray | None) -> tuple[int, int]:
        """Check one record and copy its data into ``dest``.

        Returns (header copies repaired, symbols or bits the ECC corrected).
        """
        dec = decode_record(rec, expect_key=key, expect_layer=layer, expect_fingerprint=fp)
        h = dec.header
        if h.shape != spec.block_shape(n_tokens) or h.dtype != spec.dtype:
            raise RecordMismatchError(
                f"record holds {h.dtype}{list(h.shape)}, expected "
                f"{spec.dtype}{list(spec.block_shape(n_tokens))}"
            )
        corrected = read_block(dec, dest)
        return dec.header_repairs, corrected

    # -- control ------------------------------------------------------------------------------
    def _stored_keys(self, tokens: Any, model: ModelSpec | dict[str, Any]) -> list[bytes]:
        _, _, _, keys = self._prepare(tokens, model)
        return keys

    def pin(self, tokens: Any, *, model: ModelSpec | dict[str, Any]) -> int:
        """Pin the stored prefix of ``tokens`` against eviction and demotion.

        Pins count: each pin needs its own unpin. Returns the number of chunks pinned.
        """
        return self._adjust_pins(tokens, model, +1)

    def unpin(self, tokens: Any, *, model: ModelSpec | dict[str, Any]) -> int:
        """Undo one :meth:`pin` of the stored prefix; returns the number of chunks changed."""
        return self._adjust_pins(tokens, model, -1)

    def _adjust_pins(self, tokens: Any, model: ModelSpec | dict[str, Any], delta: int) -> int:
        keys = self._stored_keys(tokens, model)

        def fn(txn: Any, pending: _Pending) -> int:
            changed = 0
            for meta, key in zip(self._stored(txn, keys), keys, strict=False):
                pins = max(0, meta.pins + delta)
                if pins != meta.pins:
                    self._index.put_chunk(txn, key, meta.with_(pins=pins), meta)
                    changed += 1
            return changed

        return int(self._mutate(fn))

    def delete(self, tokens: Any, *, model: ModelSpec | dict[str, Any],
               force: bool = False) -> int:
        """Remove the stored sequence ``tokens``.

        Its chunks that no other stored sequence needs are freed; shared prefixes stay.
        Pinned chunks are kept unless ``force``. Nothing happens unless all of ``tokens`` is
        stored. Returns the number of chunks freed.
        """
        keys = self._stored_keys(tokens, model)
        if not keys:
            return 0

        def fn(txn: Any, pending: _Pending) -> int:
            ix = self._index
            metas = self._stored(txn, keys)
            if len(metas) != len(keys):
                return 0
            usage = ix.usage(txn)
            last = metas[-1]
            if last.end:
                ix.put_chunk(txn, keys[-1], last.with_(end=False), last)
            freed = 0
            for key in reversed(keys):
                meta = ix.get_chunk(txn, key)
                if meta is None or meta.refs or (meta.pins and not force):
                    break
                self._free_chunk(txn, key, meta, pending, usage)
                freed += 1
            ix.set_usage(txn, usage)
            return freed

        return int(self._mutate(fn))

    def clear(self, *, model: ModelSpec | dict[str, Any] | None = None) -> int:
        """Remove everything (or every chunk of one model). Returns chunks removed."""
        self._check()
        fp = None if model is None else as_model_spec(model).fingerprint()

        def fn(txn: Any, pending: _Pending) -> int:
            ix = self._index
            if fp is None:
                n = ix.count_chunks(txn)
                ix.clear(txn)
                return n
            usage = ix.usage(txn)
            victims = [(k, m) for k, m in ix.chunks(txn) if m.fingerprint == fp]
            for k, m in victims:
                self._free_chunk(txn, k, m, pending, usage)
            ix.set_usage(txn, usage)
            return len(victims)

        n = int(self._mutate(fn))
        if fp is None:
            for tier in self._tiers.values():
                tier.clear()
        return n

    # -- inspection ---------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Store contents, tier usage and this session's counters."""
        self._check()
        ix = self._index
        chunks = pinned = shared = tokens = 0
        with ix.env.read() as txn:
            usage = ix.usage(txn)
            models = ix.models(txn)
            for _, m in ix.chunks(txn):
                chunks += 1
                pinned += m.pins > 0
                shared += m.refs > 1
                tokens += m.n_tokens
        tiers = {}
        for name in self._order:
            tc = self.config.tier(name)
            tiers[name] = {
                "medium": tc.medium,
                "blocks": usage.blocks(name),
                "bytes": usage.bytes(name),
                "capacity_bytes": tc.capacity_bytes,
                "fault_model": tc.fault_model,
                "ecc": tc.ecc,
                **self._tiers[name].stats(),
            }
        with self._lock:
            session = dict(self._counters)
        return {
            "path": str(self.root),
            "chunk_tokens": self.config.chunk_tokens,
            "chunks": chunks,
            "tokens": tokens,
            "pinned_chunks": pinned,
            "shared_chunks": shared,
            "models": [{"fingerprint": fp.hex(), **spec} for fp, spec in models.items()],
            "tiers": tiers,
            "session": session,
        }

    def verify(self, *, progress: Callable[[int, int], None] | None = None,
               repair: bool = False) -> VerifyReport:
        """Read and check every record the index refers to; count unreferenced records.

        With ``repair`` every corrected block is rewritten from its corrected data.
        """
        self._check()
        ix = self._index
        with ix.env.read() as txn:
            entries = list(ix.chunks(txn))
            models = {fp: ModelSpec.from_dict(spec) for fp, spec in ix.models(txn).items()}
        counts: Counter[str] = Counter()
        problems: list[tuple[str, int, str, str]] = []
        referenced: dict[str, set[bytes]] = defaultdict(set)
        to_repair: list[tuple[bytes, int, str]] = []
        for i, (key, meta) in enumerate(entries):
            spec = models.get(meta.fingerprint)
            for layer, (tier, _) in enumerate(meta.blocks):
                bkey = block_key(key, layer)
                referenced[tier].add(bkey)
                if spec is None:
                    counts[UNCORRECTABLE] += 1
                    problems.append((key.hex(), layer, tier, "unknown model fingerprint"))
                    continue
                st = self._check_block(key, layer, tier, meta, spec)
                counts[st.status] += 1
                if st.status == CORRECTED and repair:
                    to_repair.append((key, layer, tier))
                if st.error is not None:
                    problems.append((key.hex(), layer, tier,
                                     f"{type(st.error).__name__}: {st.error}"))
            if progress is not None:
                progress(i + 1, len(entries))
        orphans = 0
        for name, store in self._tiers.items():
            orphans += sum(1 for k in store.iter_keys() if k not in referenced[name])
        repaired = self._repair(to_repair) if to_repair else 0
        return VerifyReport(
            chunks=len(entries), blocks=sum(counts.values()), ok=counts[OK],
            corrected=counts[CORRECTED], uncorrectable=counts[UNCORRECTABLE],
            missing=counts[MISSING], orphans=orphans, problems=problems, repaired=repaired,
        )

    def _repair(self, items: list[tuple[bytes, int, str]]) -> int:
        """Rewrite blocks that needed correction, from their stored record: verified,
        corrected and re-encoded with their tier's ECC (quantized values are kept as they
        are, never re-quantized)."""
        ix = self._index

        def fn(txn: Any, pending: _Pending) -> int:
            usage = ix.usage(txn)
            done = 0
            for key, layer, tier in items:
                meta = ix.get_chunk(txn, key)
                if meta is None or meta.blocks[layer][0] != tier:
                    continue  # moved or freed meanwhile: nothing to repair here
                bkey = block_key(key, layer)
                record = self._tiers[tier].get(bkey)
                if record is None:
                    continue
                try:
                    rec = reencode(record, decode_record(record), self._codecs[tier])
                except IntegrityError:
                    continue  # no longer correctable: reads keep reporting it
                size = memoryview(rec).nbytes
                old = meta.blocks[layer][1]
                if size != old:
                    blocks = list(meta.blocks)
                    blocks[layer] = (tier, size)
                    ix.put_chunk(txn, key, meta.with_(blocks=tuple(blocks)), meta)
                    usage.add(tier, 0, size - old)
                pending.write(tier, bkey, rec, size)
                done += 1
            ix.set_usage(txn, usage)
            return done

        repaired = int(self._mutate(fn))
        with self._lock:
            self._counters["blocks_repaired"] += repaired
        return repaired

    def _check_block(self, key: bytes, layer: int, tier: str, meta: ChunkMeta,
                     spec: ModelSpec, dest: np.ndarray | None = None) -> BlockStatus:
        if tier not in self._tiers:
            return BlockStatus(meta.pos, layer, tier, MISSING, 0,
                               MissingRecordError(f"tier {tier} is not configured"))
        with self._tiers[tier].reader() as r:
            rec = r.get(block_key(key, layer))
            if rec is None:
                return BlockStatus(meta.pos, layer, tier, MISSING, 0,
                                   MissingRecordError("record is missing"))
            try:
                repairs, corrected = self._verify_into(rec, key, layer, meta.fingerprint, spec,
                                                       meta.n_tokens, dest)
            except IntegrityError as exc:
                return BlockStatus(meta.pos, layer, tier, UNCORRECTABLE, 0, exc)
        status = CORRECTED if repairs or corrected else OK
        return BlockStatus(meta.pos, layer, tier, status, corrected, None, repairs)
