"""Layer streaming: a stored prefix's KV handed out layer by layer, as each is verified.

A serving engine restoring a prefix runs attention layer by layer; with :meth:`Engine.get`
it waits for every layer first. :class:`LayerStream` reads layer 0 of every chunk of the
prefix, verifies it and yields it while a background thread reads and verifies the next
layers (at most ``ahead`` layers are waiting), so the consumer's work on layer 0 overlaps the
loading of the rest.

**The prefix rule.** The prefix length comes from the index first (the stored prefix, as
:meth:`Engine.lookup`). Each layer is read over the chunks of the current prefix. A block
that is uncorrectable or missing in chunk ``c`` (a DUE) cuts the prefix to the chunks before
``c``, for that layer and every later one: the verified prefix of the stream is the minimum
over its layers. Each :class:`LayerKV` carries ``n_tokens``, the verified prefix over that
layer and every earlier one (non-increasing along the stream; the stream's final
``n_tokens`` is the last one). Layers already handed out are not changed: their first
``n_tokens`` positions stay valid (causal attention at a position never depends on later
positions), and the caller recomputes from token ``n_tokens`` on, in every layer.

Layer 0 is read in the caller's thread while the stream is created (a thread start and a GIL
hand-off on the way to the first layer cost about as much as reading it), the rest by a
background thread (one the engine keeps from an earlier stream when it has one idle:
:class:`Workers`) in its own snapshot of each tier, opened as it starts: a chunk evicted or
deleted while the stream runs is still read whole from that snapshot. Closing the
stream early (``close()``, leaving a ``with`` block, or dropping it) stops the read before
its next layer; repairs, access times and promotions are applied only by a stream read to its
end.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack, suppress
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from rkv.codec.fastcheck import FastCheck
from rkv.format.keys import chunk_bounds
from rkv.format.model import ModelSpec, as_model_spec
from rkv.store.batch import finish_reads, plan_gets
from rkv.store.readpath import Readers
from rkv.store.results import MISSING, OK, UNCORRECTABLE, BlockLog, BlockStatus

if TYPE_CHECKING:
    from rkv.store.core import StoreCore

_END = object()


class LayerKV(NamedTuple):
    """One verified layer of a streamed prefix."""

    layer: int
    kv: np.ndarray                # [2, n_tokens, kv_heads, head_dim] (a view of ``out``)
    blocks: list[BlockStatus]     # this layer's blocks, one per chunk read
    n_tokens: int                 # verified prefix over this and every earlier layer


class Workers:
    """Threads for the streams' background reads, kept after a stream for the next one:
    starting a thread costs about a third of reading a first layer (0.17 ms here), on the
    way to it. A thread idle for ``idle_s`` seconds ends; :meth:`close` ends the idle ones."""

    def __init__(self, idle_s: float = 30.0) -> None:
        self.idle_s = idle_s
        self._lock = threading.Lock()
        self._idle: list[queue.SimpleQueue[Any]] = []
        self._closed = False

    def run(self, fn: Callable[[], None]) -> threading.Event:
        """Run ``fn`` on an idle thread, or a new one; the event is set once it returned
        (and the thread is idle again)."""
        done = threading.Event()
        with self._lock:
            q = self._idle.pop() if self._idle else None
        if q is None:
            q = queue.SimpleQueue()
            threading.Thread(target=self._loop, args=(q,), name="rkv-layers",
                             daemon=True).start()
        q.put((fn, done))
        return done

    def _loop(self, q: queue.SimpleQueue[Any]) -> None:
        while True:
            try:
                item = q.get(timeout=self.idle_s)
            except queue.Empty:
                with self._lock:
                    if q in self._idle:      # nobody handed it work meanwhile: end
                        self._idle.remove(q)
                        return
                continue
            if item is None:
                return
            fn, done = item
            returned = False
            try:
                fn()
                returned = True
            finally:     # a thread whose job raised ends (never handed work it won't run)
                with self._lock:
                    keep = returned and not self._closed
                    if keep:
                        self._idle.append(q)
                done.set()
            if not keep:
                return

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for q in idle:
            q.put(None)


class _Producer:
    """The layer reader (no reference to the stream, so a dropped stream is closed): layer 0
    by :meth:`first` in the caller's thread, the others by the background thread."""

    def __init__(self, core: StoreCore, spec: ModelSpec, keys: list[bytes], metas: list[Any],
                 out: np.ndarray, ahead: int) -> None:
        self.core, self.spec, self.keys, self.metas, self.out = core, spec, keys, metas, out
        self.q: queue.Queue[Any] = queue.Queue(maxsize=max(1, ahead))
        self.stop = threading.Event()
        self.done: threading.Event | None = None     # set when the background read ended
        self.fp = spec.fingerprint()
        self.starts = np.cumsum([0] + [m.n_tokens for m in metas]).tolist()
        self.checks = [FastCheck(k, self.fp, spec, m.n_tokens)
                       for k, m in zip(keys, metas, strict=False)]
        self.n_chunks = len(metas)

    def first(self) -> LayerKV:
        """Layer 0, read now in its own snapshots."""
        with ExitStack() as stack:
            return self._layer(Readers(self.core.tiers, stack), 0)

    def run(self) -> None:
        time.sleep(0)     # let the caller go on (to hand out layer 0)
        try:
            self._read()
            self.q.put(_END)
        except BaseException as exc:  # handed to the consumer, raised there
            self.q.put(exc)

    def _read(self) -> None:
        with ExitStack() as stack:
            readers = Readers(self.core.tiers, stack)
            n = self.spec.n_layers
            for tier in {t for m in self.metas for t in m.layer_tiers(n)}:
                if tier in readers.tiers:     # the snapshot opens now, before any hook
                    readers(tier)
            for layer in range(1, n):
                if self.stop.is_set():
                    return
                self.q.put(self._layer(readers, layer))
                time.sleep(0)    # hand the GIL to a consumer waiting for this layer

    def _layer(self, readers: Readers, layer: int) -> LayerKV:
        """One layer over the chunks of the prefix so far (cut at a bad block)."""
        hook = self.core.hooks.get("stream_layer")   # tests hold a window open here
        if hook is not None:
            hook()
        spec, metas, keys, starts = self.spec, self.metas, self.keys, self.starts
        reads = self.core.reads
        log = BlockLog()
        statuses = []
        for ci in range(self.n_chunks):
            meta = metas[ci]
            bad = reads.read_layers(readers, keys[ci], ci, meta, self.fp, spec, (layer,),
                                    self.out[:, :, starts[ci]:starts[ci + 1]], log, False,
                                    self.checks[ci], whole=False)
            statuses.append(log.special.get((ci, layer)) or BlockStatus(
                ci, layer, meta.layer_tiers(spec.n_layers)[layer], OK))
            if bad:
                self.n_chunks = ci
                break
        n = starts[self.n_chunks]
        return LayerKV(layer, self.out[layer, :, :n], statuses, n)


class LayerStream:
    """An iterator of :class:`LayerKV`, one per layer in order (see the module docstring).

    ``n_tokens``: the verified prefix so far (final once the stream is exhausted);
    ``stored_tokens``: what the index promised; ``blocks``: every block status so far.
    """

    def __init__(self, core: StoreCore, workers: Workers, tokens: Any,
                 model: ModelSpec | dict[str, Any], out: np.ndarray | None = None,
                 ahead: int = 2) -> None:
        spec = as_model_spec(model)
        (g,) = plan_gets(core, [tokens], spec, None if out is None else [out])
        self._core, self._keys, self._metas = core, g.keys, g.metas
        self.stored_tokens = self.n_tokens = g.stored
        self.blocks: list[BlockStatus] = []
        self._damaged = g.damaged
        self._n_request = g.n_tokens
        self._reading = g.keys[: len(g.metas)]
        self._done = False
        core.decisions.reading(self._reading, +1)
        self._p = _Producer(core, spec, g.keys, g.metas, g.out, ahead)
        try:
            self._first: LayerKV | None = self._p.first()
        except BaseException:
            self._done = True
            core.decisions.reading(self._reading, -1)
            raise
        if spec.n_layers > 1:
            self._p.done = workers.run(self._p.run)
        else:
            self._p.q.put(_END)

    def __iter__(self) -> LayerStream:
        return self

    def __next__(self) -> LayerKV:
        if self._done:
            raise StopIteration
        item = self._first if self._first is not None else self._p.q.get()
        self._first = None
        if isinstance(item, LayerKV):
            self.n_tokens = item.n_tokens
            self.blocks += item.blocks
            return item
        self._release()
        if item is _END:
            self._finish()
            raise StopIteration
        raise item

    def _finish(self) -> None:
        log = BlockLog()
        log.extra = self.blocks
        if self._damaged is not None and self.n_tokens == self.stored_tokens:
            st = BlockStatus(len(self._metas), 0, "index", UNCORRECTABLE, 0, self._damaged)
            self.blocks.append(st)
            s, e = chunk_bounds(self._n_request, self._core.config.chunk_tokens
                                )[len(self._metas)]
            self.stored_tokens += e - s
        finish_reads(self._core, [(self._keys, self._metas, self.n_tokens, log)],
                     self._p.fp)

    @property
    def ok(self) -> bool:
        """True when every stored block of every layer read so far verified."""
        return self.n_tokens == self.stored_tokens and not any(
            b.status in (UNCORRECTABLE, MISSING) for b in self.blocks)

    def _release(self) -> None:
        if not self._done:
            self._done = True
            if self._p.done is not None:
                self._p.done.wait()
            self._core.decisions.reading(self._reading, -1)

    def close(self) -> None:
        """Stop the background reader (it ends before its next layer) and release the
        chunks; idempotent."""
        if self._done:
            return
        p = self._p
        p.stop.set()
        while p.done is not None and not p.done.is_set():   # unblock a producer waiting
            with suppress(queue.Empty):                     # for room in the queue
                p.q.get(timeout=0.05)
        self._release()

    def __enter__(self) -> LayerStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_done", True):
            self.close()
