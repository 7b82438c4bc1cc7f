"""vLLM's waiting queue, announced to the store: prefetch and hold what queued requests read.

vLLM calls ``on_new_request`` when a request joins its waiting queue, long before the
scheduler reaches it. The scheduler side records the request and sends an
:class:`Announce` to the worker with the step's metadata; the worker (the process whose
saves evict, so the one whose protection counts) calls :meth:`rkv.store.engine.Engine.
prefetch`: the request's stored prefix moves up to the top tier in the background and its
chunks are held, so the saves of the requests ahead of it do not evict what it is about to
read. When the scheduler schedules the request (or it leaves the queue unserved), a
``served`` id tells the worker to drop the hold (:meth:`Engine.release`).

A hold also expires on its own, so a request vLLM never reports leaks nothing for long. Its
length is sized from the queue itself: :class:`QueueWaits` measures how long requests waited
between joining the queue and being scheduled, and a new hold lasts ``margin`` x a high
quantile of recent waits (within a floor and a ceiling). A fixed length would be either too
short under load (the hold lapses before the request runs) or too long when the queue is
empty (chunks of aborted requests stay protected).
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rkv.adapters.vllm_stats import Counters
from rkv.errors import RkvError

if TYPE_CHECKING:
    from rkv.format.model import ModelSpec
    from rkv.store.engine import Engine

log = logging.getLogger("rkv.vllm")

#: Hold length before any wait has been measured, and the bounds of a measured one (s).
FIRST_HOLD_S = 60.0
MIN_HOLD_S = 5.0
MAX_HOLD_S = 600.0


@dataclass
class Announce:
    """Scheduler -> worker: request ``req_id`` joined vLLM's queue; prefetch and hold the
    stored prefix of ``tokens`` (whole chunks) for at most ``hold_s`` seconds."""

    req_id: str
    tokens: list[int]
    hold_s: float


class QueueWaits:
    """How long requests wait in vLLM's queue, and how long a hold should therefore last.

    ``hold_s()`` is ``margin`` x the ``quantile`` of the last ``window`` waits, clamped to
    ``[MIN_HOLD_S, MAX_HOLD_S]``; ``fixed`` (a number of seconds) overrides the estimate.
    Until ``min_samples`` waits are measured it answers ``FIRST_HOLD_S``.
    """

    def __init__(self, fixed: float | None = None, *, window: int = 256,
                 quantile: float = 0.95, margin: float = 2.0, min_samples: int = 8,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.fixed = fixed
        self.quantile, self.margin, self.min_samples = quantile, margin, min_samples
        self.clock = clock
        self._waits: deque[float] = deque(maxlen=window)
        self._joined: dict[str, float] = {}

    def joined(self, req_id: str) -> None:
        self._joined[req_id] = self.clock()

    def left(self, req_id: str, scheduled: bool) -> bool:
        """``req_id`` left the queue (scheduled, or finished without being scheduled).
        Returns whether it had been announced. Only scheduled requests are measured."""
        t = self._joined.pop(req_id, None)
        if t is None:
            return False
        if scheduled:
            self._waits.append(max(0.0, self.clock() - t))
        return True

    def waiting(self) -> int:
        return len(self._joined)

    def hold_s(self) -> float:
        if self.fixed is not None:
            return self.fixed
        if len(self._waits) < self.min_samples:
            return FIRST_HOLD_S
        ranked = sorted(self._waits)
        q = ranked[min(len(ranked) - 1, math.ceil(self.quantile * len(ranked)) - 1)]
        return min(MAX_HOLD_S, max(MIN_HOLD_S, self.margin * q))


class QueueHolds:
    """The worker's half: prefetch and hold announced requests, release served ones."""

    def __init__(self, engine: Engine, spec: ModelSpec, stats: Counters) -> None:
        self.engine, self.spec, self.stats = engine, spec, stats
        self._held: dict[str, list[int]] = {}

    def announce(self, items: list[Announce]) -> None:
        for a in items:
            if a.req_id in self._held or not a.tokens:
                continue
            try:
                future = self.engine.prefetch(a.tokens, model=self.spec, hold=a.hold_s)
            except RkvError as exc:       # a queue hint that fails is a hint lost, no more
                log.warning("rkv prefetch of queued %s failed: %s", a.req_id, exc)
                self.stats.add(queue_errors=1)
                continue
            self._held[a.req_id] = a.tokens
            self.stats.add(queue_announced=1)
            future.add_done_callback(self._moved)

    def _moved(self, future: Future[Any]) -> None:
        exc = future.exception()
        if exc is not None:
            log.warning("rkv prefetch of a queued request failed: %s", exc)
            self.stats.add(queue_errors=1)
            return
        r = future.result()
        self.stats.add(queue_chunks_promoted=r.promoted)

    def served(self, req_ids: list[str]) -> None:
        for rid in req_ids:
            tokens = self._held.pop(rid, None)
            if tokens is not None:
                self.engine.release(tokens, model=self.spec)
                self.stats.add(queue_released=1)

    def holding(self) -> int:
        """Announced requests whose hold is not released yet."""
        return len(self._held)

    def close(self) -> None:
        self.served(list(self._held))
