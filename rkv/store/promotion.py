"""Moving chunks up the tiers in the background: read promotions and prefetches.

One worker thread per engine runs them, in the order asked. A move takes the writer lock like
any put, so a long one is cut into mutations of at most :data:`BATCH` chunks: the lock is
released between them, and puts (and the occasional bookkeeping a read asks for) get in
while a long prefix climbs from NVMe. Reads never wait for a move: they take no lock, and
the policy bookkeeping they queue is applied by the worker, not by the reader. A prefetch
with a byte budget stays one mutation (its prefetch policy chooses among all the chunks at
once). A read that found chunks below the top tier queues them;
the engine's promotion policy (``EngineConfig.promote``, e.g. ``"after(n=2)"``) decides
inside the mutation which move, from the hits the policies have been told about. A prefetch
moves a whole stored prefix without asking. A failed read promotion is logged and dropped
(the read already succeeded); a failed prefetch raises from its future.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import TYPE_CHECKING, Any

from policies.base import Reason
from rkv.errors import RkvError
from rkv.store.decisions import Protected, item_for
from rkv.store.index import ChunkMeta
from rkv.store.results import PrefetchResult
from rkv.store.txn import Pending

if TYPE_CHECKING:
    from rkv.store.core import StoreCore

log = logging.getLogger("rkv")

#: Chunks moved per mutation (the writer lock is released between batches).
BATCH = 4


class Promotions:
    """The background mover of one core."""

    def __init__(self, core: StoreCore) -> None:
        self.core = core
        self._worker: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._flush_queued = False

    def after_read(self, keys: list[bytes], metas: list[ChunkMeta], done: int) -> None:
        """Tell the policies what a get served (``done`` tokens of ``metas``); queue the
        served chunks found below the top tier for the promotion policy to judge."""
        core = self.core
        n = tokens = 0
        for m in metas:
            if tokens + m.n_tokens > done:
                break
            tokens += m.n_tokens
            n += 1
        if not n:
            return
        if core.decisions.served(keys[:n], time.time()) and not core.readonly:
            # Many hits wait: the worker applies them (a reader never waits for the lock),
            # once per batch of hits however many reads ask meanwhile.
            with self._lock:
                queued, self._flush_queued = self._flush_queued, True
            if not queued:
                self.submit(self._flush)
        if core.config.promote == "never":
            return
        if core.placement is not None and core.placement.cfg.place_tiers:
            # The planner put each block where it is needed in time: a read promotion would
            # undo that (a prefetch still moves whole prefixes up).
            return
        top = core.decisions.order[0]
        low = [k for k, m in zip(keys[:n], metas[:n], strict=True)
               if any(t != top for t in m.tiers())]
        if low:
            self.submit(self.run, low, top, True)

    def _flush(self) -> None:
        with self._lock:
            self._flush_queued = False
        self.core.mutate(lambda txn, pending: None)

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        with self._lock:
            self.core.check()
            if self._worker is None:
                self._worker = ThreadPoolExecutor(1, thread_name_prefix="rkv-promote")
            future: Future[Any] = self._worker.submit(fn, *args)
            return future

    def settle(self, timeout: float | None = None) -> None:
        """Wait until everything queued so far is done."""
        with self._lock:
            worker = self._worker
        if worker is not None:
            worker.submit(lambda: None).result(timeout)

    def shutdown(self) -> None:
        """Finish the move in progress, drop the queued ones (they were only hints)."""
        with self._lock:
            worker, self._worker = self._worker, None
        if worker is not None:
            worker.shutdown(wait=True, cancel_futures=True)

    def run(self, keys: list[bytes], tier: str, from_read: bool,
            budget: int | None = None) -> PrefetchResult:
        core = self.core
        step = len(keys) if budget is not None else BATCH
        parts: list[PrefetchResult] = []
        try:
            for i in range(0, len(keys), max(1, step)):
                parts.append(core.mutate(partial(promote, core, keys=keys[i:i + step],
                                                    tier=tier, from_read=from_read,
                                                    budget=budget)))
        except RkvError as exc:
            if not from_read:
                raise
            log.warning("read promotion skipped: %s", exc)
            done = sum(p.promoted for p in parts)
            return PrefetchResult(tier, len(keys), done, sum(p.already for p in parts),
                                  len(keys) - done)
        res = PrefetchResult(tier, len(keys), *(sum(getattr(p, f) for p in parts) for f in (
            "promoted", "already", "failed", "evicted_chunks", "demoted_chunks", "skipped")))
        core.count(promoted_chunks=res.promoted)
        return res


def promote(core: StoreCore, txn: Any, pending: Pending, keys: list[bytes], tier: str,
            from_read: bool, budget: int | None = None) -> PrefetchResult:
    """Move chunks up into ``tier`` (one mutation). ``from_read``: only those the read
    promotion policy picks; otherwise (a prefetch) those the prefetch policy picks within
    ``budget`` bytes (None: all)."""
    ix, decide = core.index, core.decisions
    level = decide.order.index(tier)
    stats: Counter[str] = Counter()
    protect = Protected(set(keys), decide, txn)
    now = time.time()
    promoted = already = failed = 0
    plan: dict[bytes, tuple[ChunkMeta, str]] = {}
    for key in keys:
        meta = ix.read_chunk(txn, key)
        if meta is None:
            failed += 1
            continue
        low = sorted((t for t in meta.tiers() if t in decide.order
                      and decide.order.index(t) > level), key=decide.order.index)
        if not low:
            already += 1
            continue
        if from_read and not decide.want_promotion(key, item_for(key, meta, low[0]), now):
            continue
        plan[key] = (meta, low[0])
    order = list(plan)
    if not from_read:
        upcoming = [item_for(k, m, src) for k, (m, src) in plan.items()]
        picked = decide.prefetcher.hints(upcoming, sys.maxsize if budget is None else budget)
        order = [k for k in picked if isinstance(k, bytes) and k in plan]
    skipped = len(plan) - len(order)
    for key in order:
        meta, src = plan[key]
        if not decide.usable(tier) or not decide.move(
                txn, key, meta, src, tier, protect, pending, stats, Reason.PROMOTED):
            failed += 1
            continue
        promoted += 1
        # Re-encoding for the faster tier may have grown the chunk: settle the overshoot.
        decide.make_room(txn, level, 0, protect, pending, stats)
    return PrefetchResult(tier, len(keys), promoted, already, failed, stats["evicted"],
                          stats["demoted"], skipped)
