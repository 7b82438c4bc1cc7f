"""The store core: the state the store's parts share, and the few verbs they use.

:class:`~rkv.store.engine.Engine` is the facade users call; every part of the store (the write
and read paths, batches, layer streaming, promotion, remote sharing, upkeep, scrub and ages)
takes a :class:`StoreCore` instead, and touches only its public surface:

* what the store is: ``root``, ``config``, ``identity``, ``readonly``;
* where blocks live: ``index``, ``tiers`` (one dict, shared with the decision site, the read
  path and the mutator, so a wrapped tier is seen by all), ``order`` (top tier first);
* how a tier protects a block: ``pipelines`` / :meth:`pipeline` (its quantizer, then its
  code; ``codecs``: the code alone), ``placement`` (the planner's per-block choices, or
  None);
* who decides and who reads: ``decisions`` (the one decision site), ``reads``;
* what the session counted: ``counters`` under ``lock``, through :meth:`count`; per tier and
  model: ``tally``; each tier's availability as seen: ``watch`` (:mod:`rkv.store.tally`);
* the verbs: :meth:`check`, :meth:`prepare`, :meth:`mutate`, :meth:`touch`.

Two services the parts call on each other, remote sharing and promotions, are attached by the
engine after the core exists (they are built from it); the core knows them only by the
protocols below, so no part imports another through the core.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from rkv.codec.blockcodec import RecordArena
from rkv.codec.pipeline import Pipeline
from rkv.errors import ReadOnlyStoreError, StoreClosedError
from rkv.format.keys import as_token_array, chunk_keys
from rkv.format.model import ModelSpec, as_model_spec
from rkv.store.clock import Clock
from rkv.store.config import EngineConfig
from rkv.store.decisions import Decisions
from rkv.store.index import ChunkMeta, Index
from rkv.store.paths import Identity
from rkv.store.readpath import ReadPath
from rkv.store.results import BlockLog
from rkv.store.tally import Tally, TierWatch
from rkv.store.txn import Hooks, Mutator, Pending
from rkv.tiers import Tier

if TYPE_CHECKING:
    from rkv.store.accesslog import AccessLog
    from rkv.store.plans import EnginePlacement

class Sharing(Protocol):
    """What the parts ask of remote sharing (:class:`rkv.store.remote_share.RemoteShare`)."""

    def probe(self, requests: Sequence[tuple[list[bytes], int]], spec: ModelSpec, *,
              put: bool = False) -> int: ...

    def write_through(self, pending: Pending, puts: Sequence[list[bytes]]) -> int: ...

    def forget_failed(self, reads: Sequence[tuple[list[bytes], Any, int, BlockLog]]
                      ) -> int: ...

    def raise_if_down(self, size: Callable[[str], int]) -> None: ...


class Moves(Protocol):
    """What the read path asks of promotions (:class:`rkv.store.promotion.Promotions`)."""

    def after_read(self, keys: list[bytes], metas: list[ChunkMeta], done: int) -> None: ...


class Arenas:
    """The store's record arenas: those handed out in the current mutation and the free
    ones. All come back when the next mutation starts (mutations run one at a time, under
    the writer lock, and each flushes its records before it ends)."""

    def __init__(self) -> None:
        self._mutation: Pending | None = None
        self._free: list[RecordArena] = []
        self._used: list[RecordArena] = []

    def begin(self, pending: Pending) -> None:
        """Called for each put of mutation ``pending``: a new mutation frees them all."""
        if self._mutation is not pending:
            self._mutation = pending
            self._free += self._used
            self._used = []

    def take(self) -> RecordArena:
        arena = self._free.pop() if self._free else RecordArena()
        self._used.append(arena)
        return arena


class StoreCore:
    """One open store's shared state (see the module docstring for its surface)."""

    def __init__(self, root: Path, config: EngineConfig, index: Index, tiers: dict[str, Tier],
                 identity: Identity, readonly: bool,
                 placement: EnginePlacement | None) -> None:
        self.root = root
        self.config = config
        self.identity = identity
        self.readonly = readonly
        self.index = index
        self.tiers = tiers
        self.order = [t.name for t in config.tiers]
        #: Each tier's own protection of a block (its ``quant``, then its ``ecc``).
        self.pipelines = {t.name: Pipeline.parse(t.quant, t.ecc) for t in config.tiers}
        #: Each tier's code alone (what a block moved or rewritten into it is coded with).
        self.codecs = {name: p.codec for name, p in self.pipelines.items()}
        self.placement = placement
        self.pid = os.getpid()
        self.closed = False
        self.lock = threading.RLock()
        self.counters: Counter[str] = Counter()
        self.tally = Tally()
        self.watch = TierWatch()
        self.clock: Clock = time.time_ns
        #: Test hooks of the mutation protocol (see :mod:`rkv.store.txn`).
        self.hooks: Hooks = {}
        self.mutator = Mutator(index.env, tiers, self.hooks)
        self.decisions = Decisions(index, tiers, config, self.codecs, placement,
                                   lambda: self.clock())
        self.reads = ReadPath(index, tiers)
        #: Record arenas of the puts' encode batches (rkv.store.writepath.EncodeBatch).
        self.arenas = Arenas()
        #: The access log (``Engine.open(access_log=...)``), or None.
        self.access_log: AccessLog | None = None
        #: Chunks the open dropped (damaged or of a dropped tier).
        self.dropped_at_open = 0
        #: The index format this open upgraded from (None: it was current).
        self.migrated_from: int | None = None
        self._share: Sharing | None = None
        self._moves: Moves | None = None

    def attach(self, share: Sharing, moves: Moves) -> None:
        """The engine's remote sharing and promotions, once built from this core."""
        self._share, self._moves = share, moves

    @property
    def share(self) -> Sharing:
        if self._share is None:
            raise RuntimeError("the store core has no remote sharing attached")
        return self._share

    @property
    def moves(self) -> Moves:
        if self._moves is None:
            raise RuntimeError("the store core has no promotions attached")
        return self._moves

    def pipeline(self, tier: str) -> Pipeline:
        """Tier ``tier``'s own protection of a block: its quantizer, then its code."""
        return self.pipelines[tier]

    def check(self) -> None:
        """A typed error if the store is closed or was opened in another process."""
        if self.closed:
            raise StoreClosedError("the engine is closed")
        if os.getpid() != self.pid:
            raise StoreClosedError(
                "this Engine was opened in another process; call Engine.open() again after fork"
            )

    def prepare(self, tokens: Any, model: ModelSpec | dict[str, Any]
                ) -> tuple[ModelSpec, bytes, np.ndarray, list[bytes]]:
        """A call's model spec, fingerprint, token array and chunk keys, checked."""
        self.check()
        spec = as_model_spec(model)
        fp = spec.fingerprint()
        toks = as_token_array(tokens)
        keys = chunk_keys(toks, fp, self.config.chunk_tokens,
                          partial=self.config.store_partial_chunks)
        return spec, fp, toks, keys

    def mutate(self, fn: Callable[[Any, Pending], Any], freeing: bool = False) -> Any:
        """Run ``fn(txn, pending)`` under the store's writer lock (see :mod:`rkv.store.txn`);
        ``freeing``: it deletes, and may use the space reserve on a full disk."""
        self.check()
        if self.readonly:
            raise ReadOnlyStoreError(f"{self.root} is open read-only")
        decide = self.decisions
        touched = decide.take_touches()

        def body(txn: Any, pending: Pending) -> Any:
            out = decide.run(txn, lambda: fn(txn, pending))
            self.index.flush(txn)
            return out

        try:
            result = self.mutator.run(
                body, before=lambda txn: decide.write_touches(txn, touched), freeing=freeing)
        except BaseException:
            decide.invalidate()
            raise
        decide.committed()
        return result

    def touch(self, keys: list[bytes]) -> None:
        """Record a use of ``keys``; many pending access times are written at once."""
        if not self.readonly and self.decisions.touch(keys):
            self.mutate(lambda txn, pending: None)

    def observe_tiers(self) -> None:
        """Poll each tier's ``state`` into :attr:`watch` (logs a change once)."""
        for name in self.order:
            self.watch.observe(name, self.tiers[name].state)

    def count(self, **counts: int) -> None:
        """Add to this session's counters."""
        with self.lock:
            for name, n in counts.items():
                self.counters[name] += n
