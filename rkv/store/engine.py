"""The engine: put, lookup and get KV caches by token prefix over verified, tiered records."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

import rkv.parallel as parallel
from rkv.errors import (
    ConfigError,
    ReadOnlyStoreError,
    RkvError,
    StoreError,
)
from rkv.format.model import ModelSpec, as_model_spec
from rkv.store.ages import BlockAge, block_ages
from rkv.store.batch import get_many, put_many
from rkv.store.clock import Clock
from rkv.store.config import EngineConfig
from rkv.store.core import StoreCore
from rkv.store.envconfig import apply_env
from rkv.store.index import Index
from rkv.store.metrics import MetricsServer
from rkv.store.metrics import serve as serve_metrics
from rkv.store.paths import (
    Identity,
    destroy_store,
    identify,
    memory_dir,
    refresh_marker,
    resolve_config,
    resolve_tier_path,
    store_id_at,
)
from rkv.store.plans import EnginePlacement
from rkv.store.prefix import stored_prefix
from rkv.store.promotion import Promotions
from rkv.store.remote_share import RemoteShare
from rkv.store.results import (
    CORRECTED,
    MISSING,
    OK,
    UNCORRECTABLE,
    BlockStatus,
    GetResult,
    PrefetchResult,
    PutResult,
    VerifyReport,
)
from rkv.store.scrub import scrub as scrub_pass
from rkv.store.scrub import start_background
from rkv.store.scrub_report import ScrubConfig, ScrubReport
from rkv.store.streaming import LayerStream, Workers
from rkv.store.txn import Hooks, Pending
from rkv.store.upkeep import reconcile
from rkv.store.upkeep import stats as store_stats
from rkv.store.upkeep import verify as verify_store
from rkv.store.writepath import clear_chunks, delete_chunks
from rkv.tiers import LmdbTier, Tier, TierSpec, open_tier

log = logging.getLogger("rkv")

__all__ = ["CORRECTED", "MISSING", "OK", "UNCORRECTABLE", "BlockStatus", "Engine",
           "GetResult", "PrefetchResult", "PutResult", "VerifyReport", "memory_dir"]


class Engine:
    """A reliability-aware tiered KV store. Open with :meth:`Engine.open`."""

    def __init__(self, root: Path, config: EngineConfig, index: Index, tiers: dict[str, Tier],
                 identity: Identity, readonly: bool) -> None:
        #: The state the store's parts share (:mod:`rkv.store.core`); tools that work on the
        #: store's internals (scrubbers, replays, campaigns) take it, never the engine.
        self.core = core = StoreCore(root, config, index, tiers, identity, readonly,
                                     EnginePlacement.for_engine(config))
        self._scrubber: Any = None
        parallel.configure(config.codec_threads)   # the codec pool (process-wide)
        self._promotions = Promotions(core)
        #: Threads kept for layer streams' background reads (rkv.store.streaming).
        self._streams = Workers()
        #: Probes shared remote tiers on local index misses (rkv.store.remote_share).
        self._share = RemoteShare(core)
        core.attach(self._share, self._promotions)
        #: Metrics exporters this engine started (stopped at close).
        self._exporters: list[MetricsServer] = []

    @property
    def root(self) -> Path:
        return self.core.root

    @property
    def config(self) -> EngineConfig:
        return self.core.config

    @property
    def identity(self) -> Identity:
        return self.core.identity

    @property
    def readonly(self) -> bool:
        return self.core.readonly

    @property
    def hooks(self) -> Hooks:
        """Test hooks of the mutation protocol (see :mod:`rkv.store.txn`)."""
        return self.core.hooks

    @property
    def clock(self) -> Clock:
        """Ns since the epoch, stamped on every record written (settable: fake/fast time)."""
        return self.core.clock

    @clock.setter
    def clock(self, clock: Clock) -> None:
        self.core.clock = clock

    @property
    def dropped_at_open(self) -> int:
        """Chunks this open dropped (damaged entries, or those of a dropped tier)."""
        return self.core.dropped_at_open

    @property
    def migrated_from(self) -> int | None:
        """The index format this open upgraded from (None: it was current)."""
        return self.core.migrated_from

    # -- opening and closing ------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | os.PathLike[str], config: EngineConfig | None = None, *,
             create: bool = True, readonly: bool = False,
             drop_tiers: Iterable[str] = (),
             access_log: str | os.PathLike[str] | None = None) -> Engine:
        """Open (or create) the store at ``path``.

        Without ``config`` an existing store keeps its stored configuration and a new one gets
        the embedded default (DRAM and CXL tiers in memory, NVMe on disk). A given config
        replaces the stored one, except ``chunk_tokens``, which is fixed once a store exists.
        ``readonly`` opens an existing store for inspection: nothing is written (not even
        access times), and a mutation raises :class:`ReadOnlyStoreError`. A tier that the
        index knows but the config lacks is an error unless named in ``drop_tiers``.
        ``access_log`` appends one JSON line per get and put to that file (the ``accesslog``
        format of ``rkv replay``), so a real workload can be replayed through the policies.
        """
        if config is not None and not isinstance(config, EngineConfig):
            raise ConfigError(f"config must be an EngineConfig, got {type(config).__name__}")
        root = Path(path).expanduser()
        if (readonly or not create) and not (root / "index" / "data.mdb").exists():
            raise StoreError(f"{root} is not an rkv store (no index)")
        with ExitStack() as cleanup:   # a failed open releases everything it opened
            index = Index(root / "index", sync=bool(config and config.index_sync),
                          readonly=readonly, create=create)
            cleanup.callback(index.close)
            with index.env.read() as txn:
                exists = index.check_format(txn)
                config = resolve_config(index, txn, config, root) if exists else config
                stored_identity = index.meta_or_none(txn, "store") if exists else None
            if not exists and (readonly or not create):
                raise StoreError(f"{root} is not an rkv store (its index has no rkv format "
                                 "entry)")
            config = config or apply_env(None) or EngineConfig()   # RKV_* settings
            if config.index_sync:          # the stored config may ask for it too
                index.env.force_sync = True
            identity = identify(root, stored_identity, exists, store_id_at)
            if identity.copied_from:
                log.warning("%s is a copy of %s: it gets its own memory tiers (the original's "
                            "memory-tier chunks are not shared)", root, identity.copied_from)
            tiers: dict[str, Tier] = {}
            for t in config.tiers:
                spec = TierSpec(t.name, t.capacity_bytes, t.map_bytes, t.sync, t.reads,
                                t.remote_settings())
                tiers[t.name] = open_tier(spec, resolve_tier_path(root, t, identity.id),
                                           readonly)
                cleanup.callback(tiers[t.name].close)
            index.check()                  # a damaged index: a typed error, nothing touched
            for tier in tiers.values():    # tiers are checked before their first write or scan
                if isinstance(tier, LmdbTier):
                    tier.scan_lock = index.env.exclusive
            engine = cls(root, config, index, tiers, identity, readonly)
            if access_log is not None:
                from rkv.store.accesslog import AccessLog

                engine.core.access_log = AccessLog(access_log, config.chunk_tokens)
                cleanup.callback(engine.core.access_log.close)
            if not readonly:
                drop = frozenset(drop_tiers)
                engine.core.mutate(lambda txn, pending: reconcile(engine.core, txn, pending, drop))
                refresh_marker(root, identity)
                if config.scrub:     # the background patrol scrubber (docs/scrub.md)
                    engine._scrubber = start_background(engine.core)
            cleanup.pop_all()
        return engine

    @classmethod
    def destroy(cls, path: str | os.PathLike[str]) -> None:
        """Delete the store at ``path``, including tiers kept outside it (memory tiers)."""
        destroy_store(cls, Path(path).expanduser())

    def close(self) -> None:
        """Flush access times and release the LMDB environments. Idempotent."""
        core = self.core
        if core.closed:
            return
        if os.getpid() == core.pid:
            for exporter in self._exporters:
                exporter.close()
            if self._scrubber is not None:
                self._scrubber.close()
            self._promotions.shutdown()
            self._streams.close()
            try:
                if core.decisions.touched and not core.readonly:
                    core.mutate(lambda txn, pending: None)
            except RkvError as exc:
                log.warning("access times not saved at close: %s", exc)
            finally:
                core.closed = True
                for tier in core.tiers.values():
                    tier.close()
                core.index.close()
                if core.access_log is not None:
                    core.access_log.close()
        core.closed = True

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    @property
    def tiers(self) -> dict[str, Tier]:
        return dict(self.core.tiers)

    def wrap_tier(self, name: str, wrap: Callable[[Tier], Tier]) -> Tier:
        """Replace tier ``name`` by ``wrap(tier)`` (e.g. a fault-injecting or logging tier
        around it); returns the wrapper. The wrapper must implement :class:`Tier`
        (:class:`rkv.tiers.wrapper.TierWrapper` forwards it all to the tier it wraps)."""
        self.core.check()
        if name not in self.core.tiers:
            raise ConfigError(f"no tier named {name!r}")
        wrapped = wrap(self.core.tiers[name])
        if not isinstance(wrapped, Tier):
            raise ConfigError("a tier wrapper must return a Tier")
        self.core.tiers[name] = wrapped
        return wrapped

    # -- the write path -----------------------------------------------------------------------
    def put(self, tokens: Any, kv: Any, *, model: ModelSpec | dict[str, Any],
            placement: dict[str, Any] | None = None) -> PutResult:
        """Store the KV of ``tokens``; chunks already stored are not written again.

        ``kv`` is a numpy array or torch tensor shaped ``[layers, 2, tokens, kv_heads,
        head_dim]`` in the model's dtype; ``placement``: this put's own targets over the
        store's (e.g. ``{"max_p_due": 1e-12}``). All is validated before anything is written.
        """
        return self.put_many([(tokens, kv)], model=model, placement=placement)[0]

    def put_many(self, items: Sequence[tuple[Any, Any]], *,
                 model: ModelSpec | dict[str, Any],
                 placement: dict[str, Any] | None = None) -> list[PutResult]:
        """:meth:`put` of each ``(tokens, kv)`` in order, in one mutation (one index write
        transaction, one write batch per tier); a failure while writing stores none of them.
        """
        return put_many(self.core, items, model, placement)

    # -- the read path ------------------------------------------------------------------------
    def lookup(self, tokens: Any, *, model: ModelSpec | dict[str, Any],
               partial: bool = False) -> int:
        """Length in tokens of the longest stored prefix of ``tokens`` (not yet verified).
        ``partial``: also count a stored partial chunk that continues it, one that a shorter
        sequence ended with (read it with ``get(tokens[:n])``; :mod:`rkv.store.prefix`)."""
        spec, fp, toks, keys = self.core.prepare(tokens, model)
        self._share.probe([(keys, len(toks))], spec)
        with self.core.index.env.read() as txn:
            if partial:
                n = stored_prefix(self.core.index, txn, toks, fp, self.config.chunk_tokens,
                                  self.config.store_partial_chunks)
            else:
                n = sum(m.n_tokens for m in self.core.reads.stored(txn, keys)[0])
        with self.core.lock:
            self.core.counters["lookups"] += 1
        return n

    def models(self) -> list[ModelSpec]:
        """The model specs the store holds KV under (damaged entries left out)."""
        self.core.check()
        with self.core.index.env.read() as txn:
            raw = self.core.index.models(txn)
        return [ModelSpec.from_dict(d) for d in raw.values() if d is not None]

    def get(self, tokens: Any, *, model: ModelSpec | dict[str, Any], as_torch: bool = False,
            strict: bool = False, out: np.ndarray | None = None) -> GetResult:
        """Read back the KV of the longest stored prefix of ``tokens``, verified.

        Every block's header and checksum are checked. Reading stops at the first chunk with a
        block that is uncorrectable or missing (or a damaged index entry): ``n_tokens`` counts
        only the verified prefix, and ``blocks`` reports what happened to each block read.
        With ``strict=True`` the first integrity error is raised instead.

        ``out`` (numpy, ``[layers, 2, >= tokens, kv_heads, head_dim]`` in the model's dtype)
        is filled in place instead of allocating, e.g. a serving engine's preallocated buffer;
        positions past ``n_tokens`` are unspecified.
        """
        return self.get_many([tokens], model=model, as_torch=as_torch, strict=strict,
                             out=None if out is None else [out])[0]

    def get_many(self, requests: Sequence[Any], *, model: ModelSpec | dict[str, Any],
                 as_torch: bool = False, strict: bool = False,
                 out: Sequence[np.ndarray | None] | None = None) -> list[GetResult]:
        """:meth:`get` of each token sequence in ``requests``, every block read in one
        snapshot per tier; ``out``: a buffer (or None) per request."""
        return get_many(self.core, requests, model, out, as_torch, strict)

    def get_layers(self, tokens: Any, *, model: ModelSpec | dict[str, Any],
                   out: np.ndarray | None = None, ahead: int = 2) -> LayerStream:
        """The verified KV of the stored prefix of ``tokens``, layer by layer, as soon as each
        layer is verified; later layers are read in a background thread (``ahead`` layers at
        most). See :class:`rkv.store.streaming.LayerStream` for the prefix rule."""
        return LayerStream(self.core, self._streams, tokens, model, out, ahead)

    def prefetch(self, tokens: Any, *, model: ModelSpec | dict[str, Any],
                 tier: str | None = None, hold: float | None = 60.0,
                 budget: int | None = None) -> Future[PrefetchResult]:
        """A request for ``tokens`` is queued: move its stored prefix up into ``tier``
        (default: the top tier) in the background, and hold its chunks.

        Held chunks (all of the request's, stored now or later) are not evicted or demoted
        until a :meth:`get` of the request reads them, or for ``hold`` seconds at most
        (None or 0: no hold), so a scheduler's queue keeps what it is about to read.
        ``budget`` caps the bytes moved; the engine's prefetch policy (``config.prefetch``)
        chooses which chunks fit. Room is made in ``tier`` by its policy, never at the
        expense of pinned, in-flight or held chunks or of the prefix itself; chunks already
        there or above stay where they are. Returns a :class:`concurrent.futures.Future`:
        ``.result(timeout)`` gives a :class:`PrefetchResult` (or raises the typed error that
        stopped it).
        """
        _, _, _, keys = self.core.prepare(tokens, model)
        name = tier or self.core.order[0]
        if name not in self.core.tiers:
            raise ConfigError(f"no tier named {name!r} (tiers: {self.core.order})")
        if self.readonly:
            raise ReadOnlyStoreError(f"{self.root} is open read-only")
        if hold:
            self.core.decisions.hold(keys, time.time() + hold)
        with self.core.index.env.read() as txn:
            metas, _ = self.core.reads.stored(txn, keys)
        level = self.core.order.index(name)
        future: Future[PrefetchResult]
        if all(self.core.order.index(t) <= level for m in metas for t in m.tiers()):
            future = Future()       # nothing to move: no background mutation
            future.set_result(PrefetchResult(name, len(metas), 0, len(metas), 0))
            return future
        moves = self._promotions
        future = moves.submit(moves.run, keys[: len(metas)], name, False, budget)
        return future

    def release(self, tokens: Any, *, model: ModelSpec | dict[str, Any]) -> None:
        """The queued request for ``tokens`` ran or was dropped without a :meth:`get` (a
        serving engine that reads layer by layer): drop the hold one :meth:`prefetch` of it
        took. A release without a hold does nothing."""
        _, _, _, keys = self.core.prepare(tokens, model)
        self.core.decisions.release(keys)

    def settle(self, timeout: float | None = None) -> None:
        """Wait until the background promotions and prefetches queued so far are done."""
        self._promotions.settle(timeout)

    # -- control ------------------------------------------------------------------------------
    def pin(self, tokens: Any, *, model: ModelSpec | dict[str, Any]) -> int:
        """Pin the stored prefix of ``tokens`` against eviction and demotion.

        Pins count: each pin needs its own unpin. Returns the number of chunks pinned.
        """
        return self._adjust_pins(tokens, model, +1)

    def unpin(self, tokens: Any, *, model: ModelSpec | dict[str, Any]) -> int:
        """Undo one :meth:`pin` of the stored prefix; returns the number of chunks changed."""
        return self._adjust_pins(tokens, model, -1)

    def _adjust_pins(self, tokens: Any, model: ModelSpec | dict[str, Any], delta: int) -> int:
        _, _, _, keys = self.core.prepare(tokens, model)

        def fn(txn: Any, pending: Pending) -> int:
            changed = 0
            metas, _ = self.core.reads.stored(txn, keys)
            for meta, key in zip(metas, keys, strict=False):
                pins = max(0, meta.pins + delta)
                if pins != meta.pins:
                    self.core.index.put_chunk(txn, key, meta.with_(pins=pins), meta)
                    changed += 1
            return changed

        return int(self.core.mutate(fn))

    def delete(self, tokens: Any, *, model: ModelSpec | dict[str, Any],
               force: bool = False) -> int:
        """Remove the stored sequence ``tokens``.

        Its chunks that no other stored sequence needs are freed; shared prefixes stay.
        Pinned chunks are kept unless ``force``. Nothing happens unless all of ``tokens`` is
        stored. Returns the number of chunks freed.
        """
        _, _, _, keys = self.core.prepare(tokens, model)
        if not keys:
            return 0
        return int(self.core.mutate(partial(delete_chunks, self.core, keys, force), freeing=True))

    def clear(self, *, model: ModelSpec | dict[str, Any] | None = None) -> int:
        """Remove everything (or every chunk of one model), records included, under the
        writer lock. Returns chunks removed."""
        self.core.check()
        fp = None if model is None else as_model_spec(model).fingerprint()
        return int(self.core.mutate(partial(clear_chunks, self.core, fp), freeing=True))

    # -- inspection ---------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Store contents, tier usage, block ages per tier and this session's counters (also
        per tier and model, ``session_by``), tier availability and the last scrub pass; the
        Prometheus exporter reads this (docs/metrics.md)."""
        return store_stats(self.core)

    def serve_metrics(self, port: int = 0, addr: str = "127.0.0.1") -> MetricsServer:
        """Export this engine's :meth:`stats` (live session counters included) as Prometheus
        metrics at ``http://addr:port/metrics`` on a thread (``port`` 0: a free one); the
        handle's ``close()`` stops it, and so does closing the engine (docs/metrics.md)."""
        self.core.check()
        exporter = serve_metrics(self.stats, port, addr)
        self._exporters.append(exporter)
        return exporter

    def scrub(self, config: ScrubConfig | None = None, *,
              progress: Callable[[int, int], None] | None = None,
              stop: threading.Event | None = None) -> ScrubReport:
        """One patrol-scrub pass (see :mod:`rkv.store.scrub`): ``config`` defaults to the
        store's ``[scrub]`` table; ``progress(done, total)`` per block; ``stop`` ends it."""
        return scrub_pass(self.core, config, progress=progress, stop=stop)

    def block_ages(self, tier: str | None = None) -> Iterator[BlockAge]:
        """Each stored block (of ``tier``) with its write time and age by :attr:`clock`."""
        return block_ages(self.core, tier)

    def verify(self, *, progress: Callable[[int, int], None] | None = None,
               repair: bool = False) -> VerifyReport:
        """Read and check every record the index refers to; count unreferenced records,
        unreadable index entries, unreachable chunks and damaged tiers.

        With ``repair`` (not on a read-only store) every corrected block is rewritten from its
        corrected data, unreferenced records are deleted, usage is recounted from the index
        and dropped chunks are acknowledged.
        """
        self.core.check()
        self.settle()
        if repair and self.readonly:
            raise ReadOnlyStoreError(f"{self.root} is open read-only: cannot repair")
        return verify_store(self.core, progress, repair)
