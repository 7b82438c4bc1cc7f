"""The worker side of the rkv vLLM connector: verified, streamed loads and background saves.

**Loads.** ``start_load_kv`` opens one :meth:`Engine.get_layers` stream per request to
restore: layer 0 is read and verified at once, later layers by the stream's background
thread while vLLM computes the earlier ones. ``wait_for_layer_load(layer i)`` takes layer
``i`` from the stream and scatters the verified positions into vLLM's paged cache
(:mod:`rkv.adapters.vllm_layout`). A block that fails verification (or whose tier is
down) ends the verified prefix at its chunk, for that layer and every later one: nothing
of it, or after it, is injected, and the vLLM blocks from there to the end of the load
are reported by ``get_block_ids_with_load_errors``, so vLLM recomputes them (with
``kv_load_failure_policy="recompute"``; vLLM's default fails the request instead).

**Saves.** ``save_kv_layer`` copies the layer's KV of the chunks to store out of the paged
cache as soon as the layer has written it; ``wait_for_save`` hands the copy to a background
thread that puts it (encode, checksum, ECC, tier writes), so the next step does not wait.
At most ``save_queue_mb`` of KV waits; a save past that is dropped and counted.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rkv.adapters.vllm_layout import PagedLayout, run_canary
from rkv.adapters.vllm_scheduler import ReqWork
from rkv.adapters.vllm_settings import ConnectorSettings
from rkv.adapters.vllm_stats import Counters
from rkv.errors import ConfigError, RkvError
from rkv.format.model import ModelSpec
from rkv.store.results import CORRECTED, DEGRADED, MISSING, UNCORRECTABLE

if TYPE_CHECKING:
    from rkv.store.engine import Engine
    from rkv.store.streaming import LayerStream

log = logging.getLogger("rkv.vllm")


@dataclass
class _Load:
    work: ReqWork
    stream: LayerStream | None
    next_layer: int = 0
    injected: int = 0                   # positions injected in the last layer done
    seconds: float = 0.0


class WorkerSide:
    """Loads into and saves from one worker's paged KV cache."""

    def __init__(self, engine: Engine, spec: ModelSpec, settings: ConnectorSettings,
                 layout: PagedLayout, layer_names: list[str], block_size: int,
                 backend: str, stats: Counters) -> None:
        self.engine, self.spec, self.settings, self.layout = engine, spec, settings, layout
        self.layer_index = {n: i for i, n in enumerate(layer_names)}
        self.layer_names = layer_names
        self.block_size = block_size
        self.backend = backend
        self.stats = stats
        self.loading = settings.load
        self.saving = settings.save
        self._told_scheduler = not settings.load   # the scheduler knows it already
        self._views: list[tuple[Any, Any]] = []
        self._loads: list[_Load] = []
        self._errors: set[int] = set()
        self._staged: dict[str, tuple[ReqWork, Any]] = {}
        self._queue: queue.Queue[tuple[list[int], Any, int] | None] = queue.Queue()
        self._queued_bytes = 0
        self._qlock = threading.Lock()
        self._saver: threading.Thread | None = None
        self.faulty: list[Any] = []

    # -- start -------------------------------------------------------------------------------
    def register(self, kv_caches: dict[str, Any], layers: dict[str, Any]) -> None:
        """Take vLLM's cache tensors (by layer name), check the backend, run the canary,
        then wrap the tiers named in ``faults``."""
        spec = self.spec
        missing = [n for n in self.layer_names if n not in kv_caches]
        if missing:
            raise ConfigError(f"RkvConnector: vLLM registered no KV cache for {missing[:3]}")
        self._views = [self.layout.kv_views(kv_caches[n], spec.n_kv_heads, spec.head_dim,
                                            self.block_size) for n in self.layer_names]
        first = layers.get(self.layer_names[0])
        actual = _layer_backend(first)
        if actual != self.backend:
            self._disable(f"the attention backend is {actual}, the keys were made for "
                          f"{self.backend}")
        elif self.settings.canary and (self.loading or self.saving):
            self._canary(kv_caches[self.layer_names[0]], first)
        else:
            self.stats.set(canary="off")
        for f in self.settings.faults:
            self.faulty.append(_wrap_faults(self.engine, f))

    def _canary(self, like: Any, layer: Any) -> None:
        t0 = time.perf_counter()
        cspec = ModelSpec("rkv-canary", n_layers=1, n_kv_heads=self.spec.n_kv_heads,
                          head_dim=self.spec.head_dim, dtype=self.spec.dtype,
                          layout=self.layout.name,
                          extra=(("for", self.spec.fingerprint().hex()),))

        def writer(key: Any, value: Any, kv: Any, slots: Any) -> None:
            layer.impl.do_kv_cache_update(layer, key, value, kv, slots)

        try:
            bad = run_canary(self.engine, cspec, self.layout, writer, like,
                             block_size=self.block_size,
                             chunk_tokens=self.engine.config.chunk_tokens)
        except Exception as exc:   # any failure to check means: do not trust the layout
            bad = f"the canary could not run: {type(exc).__name__}: {exc}"
        self.stats.set(canary_s=round(time.perf_counter() - t0, 4))
        if bad is None:
            self.stats.set(canary="ok")
            log.info("rkv canary ok: layout %s matches vLLM's cache writer", self.layout.name)
        else:
            self._disable(bad)

    def _disable(self, why: str) -> None:
        self.loading = self.saving = False
        self.stats.set(canary=f"failed: {why}")
        self.stats.add(canary_failures=1)
        log.error("rkv: loading and saving DISABLED (every prefix is recomputed): %s", why)

    def tell_scheduler(self) -> bool | None:
        """True once after loading was disabled (sent back to the scheduler side)."""
        if self._told_scheduler or self.loading:
            return None
        self._told_scheduler = True
        return True

    # -- loads -------------------------------------------------------------------------------
    def start_load(self, work: list[ReqWork]) -> None:
        """Open a verified layer stream per request to restore."""
        for w in work:
            if w.load_end <= w.load_start:
                continue
            if not self.loading:
                self._fail(w, w.load_start)
                continue
            t0 = time.perf_counter()
            try:
                stream = self.engine.get_layers(w.tokens[:w.read_end], model=self.spec,
                                                ahead=self.settings.stream_ahead)
            except RkvError as exc:
                log.warning("rkv load of %s failed, recomputing: %s", w.req_id, exc)
                self._fail(w, w.load_start)
                continue
            self._loads.append(_Load(w, stream, seconds=time.perf_counter() - t0))
            self.stats.add(loads=1)

    def layer_loaded(self, layer_name: str) -> None:
        """Inject layer ``layer_name`` of every open load (``wait_for_layer_load``)."""
        i = self.layer_index.get(layer_name)
        if i is None:
            return
        for ld in self._loads:
            while ld.next_layer <= i and ld.stream is not None:
                self._advance(ld)

    def _advance(self, ld: _Load) -> None:
        """Take the next layer of ``ld``'s stream and scatter what verified."""
        import torch

        from rkv.format.hf_kv import as_torch_kv

        w, stream = ld.work, ld.stream
        assert stream is not None
        t0 = time.perf_counter()
        try:
            item = next(stream)
        except StopIteration:
            item = None
        except RkvError as exc:
            log.warning("rkv load of %s stopped at layer %d: %s", w.req_id, ld.next_layer, exc)
            item = None
        if item is None:           # the stream ended early or failed: the rest is lost
            self._close(ld, 0)
            return
        bs = self.block_size
        ok = min(w.load_end, item.n_tokens // bs * bs)
        if ok > w.load_start:
            ids = torch.tensor(w.block_ids[w.load_start // bs: ok // bs], dtype=torch.long)
            kv = as_torch_kv(item.kv)[:, w.load_start:ok]
            self.layout.scatter(self._views[item.layer], ids, kv)
        ld.injected = max(ok, w.load_start)
        ld.next_layer = item.layer + 1
        ld.seconds += time.perf_counter() - t0
        if ld.next_layer == self.spec.n_layers:
            self._close(ld, ld.injected)

    def _close(self, ld: _Load, verified: int) -> None:
        stream, ld.stream = ld.stream, None
        if stream is None:
            return
        blocks = list(stream.blocks)
        stream.close()
        statuses = [b.status for b in blocks]
        self.stats.add(load_blocks=len(statuses),
                       corrected_blocks=statuses.count(CORRECTED),
                       degraded_blocks=statuses.count(DEGRADED),
                       failed_blocks=statuses.count(UNCORRECTABLE) + statuses.count(MISSING),
                       load_tokens=max(0, verified - ld.work.load_start),
                       load_s=ld.seconds)
        if self.faulty:
            self.stats.set(faults_injected=sum(len(t.log) for t in self.faulty))
        if verified < ld.work.load_end:
            self._fail(ld.work, verified)

    def _fail(self, w: ReqWork, start: int) -> None:
        """Report the vLLM blocks of ``w``'s load from position ``start`` on."""
        bs = self.block_size
        bad = w.block_ids[start // bs: w.load_end // bs]
        self._errors.update(bad)
        self.stats.add(failed_loads=1, failed_vllm_blocks=len(bad),
                       recomputed_tokens=w.load_end - start)

    def load_errors(self) -> set[int]:
        """``get_block_ids_with_load_errors``: the blocks reported this step."""
        out, self._errors = self._errors, set()
        return out

    def finish_loads(self) -> None:
        """Inject whatever vLLM did not ask for layer by layer (a step without attention
        metadata), and close the streams."""
        for ld in self._loads:
            while ld.stream is not None:
                self._advance(ld)
        self._loads = []

    # -- saves -------------------------------------------------------------------------------
    def save_layer(self, layer_name: str, work: list[ReqWork]) -> None:
        """Copy layer ``layer_name``'s KV of each request to save (``save_kv_layer``)."""
        i = self.layer_index.get(layer_name)
        if i is None or not self.saving:
            return
        import torch

        spec, bs = self.spec, self.block_size
        for w in work:
            if not w.save_end:
                continue
            staged = self._staged.get(w.req_id)
            if staged is None:
                buf = torch.empty((spec.n_layers, 2, w.save_end, spec.n_kv_heads,
                                   spec.head_dim), dtype=self._views[0][0].dtype)
                staged = self._staged[w.req_id] = (w, buf)
            ids = torch.tensor(w.block_ids[: w.save_end // bs], dtype=torch.long)
            self.layout.gather_into(self._views[i], ids, staged[1][i])

    def submit_saves(self) -> bool:
        """``wait_for_save``: queue the copies made this step for the background put;
        True when something was queued."""
        staged, self._staged = self._staged, {}
        for w, buf in staged.values():
            nbytes = buf.numel() * buf.element_size()
            with self._qlock:
                full = (self._queued_bytes + nbytes > self.settings.save_queue_mb * (1 << 20)
                        and self._queued_bytes > 0)
                if not full:
                    self._queued_bytes += nbytes
            if full:
                self.stats.add(saves_dropped=1)
                continue
            self.stats.add(saves_queued=1)
            if not self.settings.save_async:
                self._put(w.tokens[: w.save_end], buf, nbytes)
                continue
            if self._saver is None:
                self._saver = threading.Thread(target=self._save_loop, name="rkv-vllm-save",
                                               daemon=True)
                self._saver.start()
            self._queue.put((w.tokens[: w.save_end], buf, nbytes))
        return bool(staged)

    def _save_loop(self) -> None:
        while (item := self._queue.get()) is not None:
            self._put(*item)
            self.stats.write(force=self._queue.empty())

    def _put(self, tokens: list[int], buf: Any, nbytes: int) -> None:
        t0 = time.perf_counter()
        try:
            res = self.engine.put(tokens, buf, model=self.spec,
                                  placement=self.settings.placement)
            self.stats.add(saves_done=1, save_tokens=len(tokens),
                           chunks_written=res.chunks_written, save_s=time.perf_counter() - t0)
        except Exception as exc:   # a failed save is a future miss, never a serving error
            log.warning("rkv save of %d tokens failed: %s", len(tokens), exc)
            self.stats.add(saves_failed=1, saves_done=1)
        finally:
            with self._qlock:
                self._queued_bytes -= nbytes

    def close(self, timeout: float = 60.0) -> None:
        """Finish the queued saves (up to ``timeout`` seconds), then stop the saver."""
        if self._saver is not None:
            self._queue.put(None)
            self._saver.join(timeout)
            self._saver = None
        for ld in self._loads:
            if ld.stream is not None:
                ld.stream.close()
        self._loads = []
        injected = sum(len(t.log) for t in self.faulty)
        self.stats.set(faults_injected=injected)
        self.stats.write(force=True)


def _layer_backend(layer: Any) -> str:
    """The attention backend's name of a vLLM attention layer, with the CPU kernel's ISA."""
    if layer is None:
        return "unknown"
    try:
        name = str(layer.attn_backend.get_name())
    except AttributeError:
        return "unknown"
    isa = getattr(layer, "isa", None)
    return f"{name}/{isa}" if name == "CPU_ATTN" else name


def _wrap_faults(engine: Engine, f: dict[str, Any]) -> Any:
    """Wrap tier ``f["tier"]`` in a :class:`FaultyTier` drawing each read's errors from
    fault model ``f["model"]`` at ``f.get("hours", 1.0)`` hours of age."""
    import numpy as np

    import faultmodels
    from rkv.tiers.faulty import FaultyTier

    model = faultmodels.get_model(f["model"])
    hours = float(f.get("hours", 1.0))
    rng = np.random.default_rng(int(f.get("seed", 0)))

    def transient(key: bytes, nbytes: int) -> Any:
        return model.sample(nbytes, hours, rng)

    return engine.wrap_tier(str(f["tier"]), lambda t: FaultyTier(
        t, seed=int(f.get("seed", 0)), transient=transient))
