"""The scheduler side of the rkv vLLM connector: what to load and what to save, per step.

It runs in vLLM's engine-core process and only reads rkv's index (``Engine.lookup``): a hit
is the longest stored prefix of a request in whole chunks, cut to a multiple of vLLM's
block size and to at most all but the last prompt token (vLLM computes at least one).
Nothing is verified here; the worker verifies every block it loads and reports the ones
that fail, which vLLM then recomputes.

Queue: a request vLLM queues is announced to the worker, which prefetches and holds its
stored prefix until the request is scheduled (:mod:`rkv.adapters.vllm_queue`); so is one
vLLM preempts, which waits again and is recomputed from its start when resumed.

Saves: once a chunk of a request's tokens has its KV computed (prompt chunks during the
prefill, generated ones while decoding), the worker is told to store the prefix up to it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rkv.adapters.vllm_queue import Announce, QueueWaits
from rkv.adapters.vllm_settings import ConnectorSettings
from rkv.adapters.vllm_stats import Counters
from rkv.errors import RkvError

if TYPE_CHECKING:
    from rkv.format.model import ModelSpec
    from rkv.store.engine import Engine

log = logging.getLogger("rkv.vllm")


@dataclass
class ReqWork:
    """What the worker does for one request in one step (sent with the step's metadata).

    ``tokens``: the request's tokens as far as this step needs them; ``block_ids``: its
    vLLM blocks from position 0; load: inject positions ``[load_start, load_end)`` from a
    verified read of ``tokens[:read_end]``; save: store ``tokens[:save_end]``."""

    req_id: str
    tokens: list[int]
    block_ids: list[int]
    load_start: int = 0
    load_end: int = 0
    read_end: int = 0
    save_end: int = 0


@dataclass
class _Req:
    request: Any
    block_ids: list[int] = field(default_factory=list)
    saved: int = 0                       # tokens known stored (whole chunks)
    load: tuple[int, int] | None = None  # positions to load in its next scheduled step


class SchedulerSide:
    """Lookups and per-step work lists (one per vLLM engine core)."""

    def __init__(self, engine: Engine, spec: ModelSpec, settings: ConnectorSettings,
                 block_size: int, stats: Counters) -> None:
        self.engine, self.spec, self.settings = engine, spec, settings
        self.block_size = block_size
        self.chunk = engine.config.chunk_tokens
        self.stats = stats
        self.loads_disabled = not settings.load
        self._reqs: dict[str, _Req] = {}
        #: request id -> (tokens vLLM holds locally, tokens stored, tokens to load up to)
        self._looked: dict[str, tuple[int, int, int]] = {}
        self.waits = QueueWaits(settings.queue_hold_s)
        self._announce: list[Announce] = []
        self._served: list[str] = []

    def queued(self, request: Any) -> None:
        """``on_new_request``: announce the request's whole chunks of prompt to the worker."""
        if self._announces(request.request_id, list(request.prompt_token_ids or ())):
            self.stats.add(queued=1)

    def preempted(self, so: Any) -> None:
        """Requests vLLM preempted in this step (``SchedulerOutput.preempted_req_ids``) are
        back in its waiting queue and will be recomputed from token 0 when resumed: announce
        the whole chunks of all their tokens so far (prompt and any stored output), so the
        saves of the requests now running do not evict the prefix they will load back."""
        ids = getattr(so, "preempted_req_ids", None) or ()
        resumed = set(getattr(getattr(so, "scheduled_cached_reqs", None),
                              "resumed_req_ids", None) or ())
        resumed |= {new.req_id for new in getattr(so, "scheduled_new_reqs", ())}
        for rid in sorted(ids):
            st = self._reqs.get(rid)
            if st is None or rid in resumed:     # unknown, or already running again
                continue
            if self._announces(rid, list(st.request.all_token_ids)):
                self.stats.add(preempted=1)

    def _announces(self, rid: str, tokens: list[int]) -> bool:
        """Queue an announcement of ``tokens``' whole chunks for request ``rid``; whether
        there was anything to announce."""
        if not self.settings.announce_queue or self.loads_disabled:
            return False
        tokens = tokens[: len(tokens) // self.chunk * self.chunk]
        if not tokens:
            return False
        self.waits.joined(rid)
        self._announce.append(Announce(rid, tokens, self.waits.hold_s()))
        return True

    def take_queue(self) -> tuple[list[Announce], list[str]]:
        """The announcements and served request ids to send with this step's metadata (a
        request announced and scheduled in the same step is neither)."""
        served = set(self._served)
        announce = [a for a in self._announce if a.req_id not in served]
        fresh = {a.req_id for a in self._announce}
        out = [r for r in self._served if r not in fresh]
        self._announce, self._served = [], []
        return announce, out

    def matched(self, request: Any, num_computed: int) -> tuple[int, bool]:
        """``get_num_new_matched_tokens``: tokens beyond ``num_computed`` to load."""
        tokens = list(request.all_token_ids)
        try:
            stored = self.engine.lookup(tokens, model=self.spec)
        except RkvError as exc:     # an unreadable index is a miss, never a crash
            log.warning("rkv lookup failed, recomputing: %s", exc)
            self.stats.add(lookup_errors=1)
            stored = 0
        bs = self.block_size
        limit = (len(tokens) - 1) // bs * bs
        hit = min(stored, limit) // bs * bs
        if self.loads_disabled or hit - num_computed < max(1, self.settings.min_load_tokens):
            hit = num_computed
        self._looked[request.request_id] = (num_computed, stored, hit)
        self.stats.add(lookups=1, lookup_tokens=len(tokens), hit_tokens=hit - num_computed)
        return hit - num_computed, False

    def after_alloc(self, request: Any, n_external: int) -> None:
        """``update_state_after_alloc``: remember the request and its load."""
        rid = request.request_id
        st = self._reqs.get(rid)
        if st is None:
            st = self._reqs[rid] = _Req(request)
        st.request = request
        if self.waits.left(rid, scheduled=True):
            self._served.append(rid)
        looked = self._looked.pop(rid, None)
        if looked is not None:
            st.saved = max(st.saved, looked[1] // self.chunk * self.chunk)
            if n_external > 0:
                st.load = (looked[2] - n_external, looked[2])

    def build(self, so: Any) -> list[ReqWork]:
        """The step's work from vLLM's ``SchedulerOutput``."""
        work = []
        for new in so.scheduled_new_reqs:
            st = self._reqs.get(new.req_id)
            if st is None:
                continue
            st.block_ids = list(new.block_ids[0])
            w = self._work(new.req_id, st, new.num_computed_tokens
                           + so.num_scheduled_tokens[new.req_id])
            if w is not None:
                work.append(w)
        cached = so.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            st = self._reqs.get(rid)
            if st is None:
                continue
            new_ids = cached.new_block_ids[i]
            if rid in cached.resumed_req_ids:   # after a preemption: all its blocks anew
                st.block_ids = list(new_ids[0]) if new_ids else []
            elif new_ids:
                st.block_ids += new_ids[0]
            w = self._work(rid, st, cached.num_computed_tokens[i] + so.num_scheduled_tokens[rid])
            if w is not None:
                work.append(w)
        return work

    def _work(self, rid: str, st: _Req, computed: int) -> ReqWork | None:
        w = ReqWork(rid, [], st.block_ids)
        if st.load is not None:
            w.load_start, w.load_end = st.load
            w.read_end = -(-w.load_end // self.chunk) * self.chunk
            st.load = None
        if self.settings.save:
            limit = computed
            if not self.settings.save_decode:
                limit = min(limit, len(st.request.prompt_token_ids or ()))
            end = limit // self.chunk * self.chunk
            if end > st.saved:
                w.save_end = end
                st.saved = end
        if not (w.load_end or w.save_end):
            return None
        need = max(w.read_end, w.save_end)
        w.tokens = list(st.request.all_token_ids)[:need]
        if len(w.tokens) < need:         # cannot happen: a stored chunk has known tokens
            w.read_end = min(w.read_end, len(w.tokens) // self.chunk * self.chunk)
            w.save_end = min(w.save_end, len(w.tokens) // self.chunk * self.chunk)
        return w

    def finished(self, request: Any) -> None:
        """``request_finished``: forget it (the worker copied what it saves already)."""
        self._reqs.pop(request.request_id, None)
        self._looked.pop(request.request_id, None)
        if self.waits.left(request.request_id, scheduled=False):
            self._served.append(request.request_id)

    def worker_said(self, loads_disabled: bool) -> None:
        """The worker's start-up canary failed: offer no more hits."""
        if loads_disabled and not self.loads_disabled:
            self.loads_disabled = True
            log.error("rkv: the worker disabled loading (canary); every prefix is recomputed")
            self.stats.add(loads_disabled=1)
