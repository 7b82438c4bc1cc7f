"""rkv as a vLLM KV connector: verified, ECC-protected, tiered prefix KV for vLLM (v1).

Load it by name with ``kv_connector="RkvConnector"`` and
``kv_connector_module_path="rkv.adapters.vllm"``, ``kv_role="kv_both"`` and
``kv_load_failure_policy="recompute"``; settings go in ``kv_connector_extra_config``
(:class:`rkv.adapters.vllm_settings.ConnectorSettings`; docs/vllm.md)::

    KVTransferConfig(kv_connector="RkvConnector", kv_connector_module_path="rkv.adapters.vllm",
                     kv_role="kv_both", kv_load_failure_policy="recompute",
                     kv_connector_extra_config={"store": "/var/lib/rkv"})

The two sides: :mod:`rkv.adapters.vllm_scheduler` (lookups, per-step work) and
:mod:`rkv.adapters.vllm_worker` (streamed verified loads, background saves);
:mod:`rkv.adapters.vllm_queue` turns vLLM's waiting queue (``on_new_request``) into
prefetches and holds in the worker's engine. Keys bind the
weights, the config, the KV dtype and shape, the paged layout, the attention backend and
the vLLM version (:func:`rkv.adapters.vllm_settings.model_spec`); the start-up canary
checks the paged layout against vLLM's own cache writer (:mod:`rkv.adapters.vllm_layout`).
Only rkv's public API is used: ``Engine.open/lookup/get_layers/put/get/delete/wrap_tier``
and ``Engine.prefetch/release``.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorWorkerMetadata,
)

from rkv.adapters.vllm_layout import resolve_layout
from rkv.adapters.vllm_metrics import Deltas, RkvConnectorStats, RkvPromMetrics, step_stats
from rkv.adapters.vllm_queue import Announce, QueueHolds
from rkv.adapters.vllm_scheduler import ReqWork, SchedulerSide
from rkv.adapters.vllm_settings import (
    ConnectorSettings,
    KVShape,
    model_spec,
    spec_summary,
    torch_dtype_name,
)
from rkv.adapters.vllm_stats import Counters
from rkv.adapters.vllm_worker import WorkerSide
from rkv.errors import ConfigError
from rkv.store.engine import Engine

log = logging.getLogger("rkv.vllm")

__all__ = ["RkvConnector", "RkvMetadata", "RkvWorkerMetadata"]


@dataclass
class RkvMetadata(KVConnectorMetadata):  # type: ignore[misc]
    """Scheduler -> worker, per step: what to load and save for each request."""

    work: list[ReqWork] = field(default_factory=list)
    announce: list[Announce] = field(default_factory=list)
    served: list[str] = field(default_factory=list)


@dataclass
class RkvWorkerMetadata(KVConnectorWorkerMetadata):  # type: ignore[misc]
    """Worker -> scheduler: the worker disabled loading (its canary failed)."""

    loads_disabled: bool = False

    def aggregate(self, other: Any) -> RkvWorkerMetadata:
        return RkvWorkerMetadata(self.loads_disabled
                                 or bool(getattr(other, "loads_disabled", False)))


def kv_shape(vllm_config: Any, kv_cache_config: Any) -> tuple[KVShape, list[str]]:
    """The model's KV shape and its attention layers in order, from vLLM's KV cache config;
    anything but one group of full-attention layers is a ConfigError."""
    groups = kv_cache_config.kv_cache_groups
    if len(groups) != 1:
        raise ConfigError(f"RkvConnector supports one KV cache group (full attention); this "
                          f"model has {len(groups)}")
    spec = groups[0].kv_cache_spec
    if (type(spec).__name__ != "FullAttentionSpec" or getattr(spec, "sliding_window", None)
            or getattr(spec, "attention_chunk_size", None)):
        raise ConfigError(f"RkvConnector stores full-attention KV only, not {spec!r}")
    if spec.head_size_v != spec.head_size:
        raise ConfigError("RkvConnector needs equal K and V head sizes")
    par = vllm_config.parallel_config
    if par.tensor_parallel_size != 1 or par.pipeline_parallel_size != 1:
        raise ConfigError("RkvConnector is tested with tensor_parallel_size=1 and "
                          "pipeline_parallel_size=1 only")
    names = list(groups[0].layer_names)
    return KVShape(len(names), int(spec.num_kv_heads), int(spec.head_size),
                   int(spec.block_size), torch_dtype_name(spec.dtype)), names


def backend_name(vllm_config: Any, shape: KVShape) -> str:
    """The attention backend vLLM picks for this model (with the CPU kernel's ISA), as both
    connector roles compute it: it is part of every key."""
    import torch

    dtype = getattr(torch, shape.dtype)
    cache_dtype = vllm_config.cache_config.cache_dtype
    try:
        from vllm.config import set_current_vllm_config
        from vllm.v1.attention.selector import get_attn_backend

        with set_current_vllm_config(vllm_config):
            name = str(get_attn_backend(shape.head_dim, dtype, cache_dtype).get_name())
    except Exception as exc:    # an unresolvable backend: keys of their own, loudly
        log.warning("rkv: cannot resolve the attention backend (%s)", exc)
        name = f"unresolved:{vllm_config.attention_config.backend}"
    if name == "CPU_ATTN":
        try:
            from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

            name += "/" + str(_get_attn_isa(dtype, shape.block_size, shape.head_dim,
                                            cache_dtype))
        except Exception:
            name += "/unknown"
    return name


class RkvConnector(KVConnectorBase_V1):  # type: ignore[misc]
    """vLLM's ``KVConnectorBase_V1`` over an rkv store (see the module docstring)."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        tc = self._kv_transfer_config
        settings = ConnectorSettings.from_extra(tc.kv_connector_extra_config)
        if getattr(tc, "kv_load_failure_policy", "recompute") != "recompute":
            log.warning("rkv: kv_load_failure_policy=%r: a block that fails verification "
                        "fails its request; set 'recompute' to recompute it instead",
                        tc.kv_load_failure_policy)
        shape, names = kv_shape(vllm_config, kv_cache_config)
        backend = backend_name(vllm_config, shape)
        layout = resolve_layout(settings.layout, backend)
        import vllm
        from vllm.platforms import current_platform

        salt = {"vllm": str(vllm.__version__), "platform": str(current_platform.device_type),
                "backend": backend, "paged_layout": layout.name,
                "kv_cache_layout": str(kv_cache_config.kv_cache_layout or ""),
                "cache_dtype": str(vllm_config.cache_config.cache_dtype),
                "salt": settings.salt}
        mc = vllm_config.model_config
        # The config minus what names the copy (its path) or the library that wrote it.
        cfg = {k: v for k, v in mc.hf_config.to_dict().items()
               if not k.startswith("_") and k != "transformers_version"}
        arch = (cfg.get("architectures") or ["model"])[0]
        self.spec = model_spec(str(mc.model), shape, model_id=f"vllm:{arch}",
                               hf_config=json.dumps(cfg, sort_keys=True, default=str),
                               salt=salt)
        self.settings = settings
        is_worker = role == KVConnectorRole.WORKER
        path = settings.stats_file
        self.stats = Counters(path if is_worker or path is None else path + ".scheduler")
        self.engine = Engine.open(settings.store, settings.engine_config())
        chunk = self.engine.config.chunk_tokens
        if chunk % shape.block_size:
            self.engine.close()
            raise ConfigError(f"RkvConnector: the store's chunk_tokens ({chunk}) must be a "
                              f"multiple of vLLM's block_size ({shape.block_size})")
        self.stats.set(role="worker" if is_worker else "scheduler", spec=spec_summary(self.spec),
                       chunk_tokens=chunk, block_size=shape.block_size, backend=backend,
                       layout=layout.name)
        log.info("rkv connector (%s): store %s, %s", "worker" if is_worker else "scheduler",
                 settings.store, spec_summary(self.spec))
        self._sched: SchedulerSide | None = None
        self._worker: WorkerSide | None = None
        self._queue: QueueHolds | None = None
        if is_worker:
            self._queue = QueueHolds(self.engine, self.spec, self.stats)
            self._worker = WorkerSide(self.engine, self.spec, settings, layout, names,
                                      shape.block_size, backend, self.stats)
        else:
            self._sched = SchedulerSide(self.engine, self.spec, settings, shape.block_size,
                                        self.stats)
        self.stats.write(force=True)
        self._deltas = Deltas()

    # -- vLLM's connector stats and Prometheus metrics (rkv.adapters.vllm_metrics) -----------
    def get_kv_connector_stats(self) -> RkvConnectorStats | None:
        return step_stats(self._deltas, self.stats.snapshot(), self.engine.core)

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None
                                 ) -> RkvConnectorStats:
        return RkvConnectorStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(cls, vllm_config: Any, metric_types: dict[type, type],
                           labelnames: list[str],
                           per_engine_labelvalues: dict[int, list[object]]) -> RkvPromMetrics:
        return RkvPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    # -- worker side -------------------------------------------------------------------------
    def _work(self) -> list[ReqWork]:
        meta = self._connector_metadata
        return meta.work if isinstance(meta, RkvMetadata) else []

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        assert self._worker is not None
        layers = self._vllm_config.compilation_config.static_forward_context
        self._worker.register(kv_caches, layers)
        self.stats.write(force=True)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        if self._worker is not None:
            meta = self._connector_metadata
            if isinstance(meta, RkvMetadata) and self._queue is not None:
                self._queue.announce(meta.announce)
                self._queue.served(meta.served)
            self._worker.start_load(self._work())

    def wait_for_layer_load(self, layer_name: str) -> None:
        if self._worker is not None:
            self._worker.layer_loaded(layer_name)

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any,
                      **kwargs: Any) -> None:
        if self._worker is not None:
            self._worker.save_layer(layer_name, self._work())

    def wait_for_save(self) -> None:
        if self._worker is not None:
            self._worker.finish_loads()
            # A queued save is on file before vLLM returns the step's output, so a reader
            # of the stats file can wait for it.
            self.stats.write(force=self._worker.submit_saves())

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._worker.load_errors() if self._worker is not None else set()

    def build_connector_worker_meta(self) -> Any:
        if self._worker is None or not self._worker.tell_scheduler():
            return None
        return RkvWorkerMetadata(loads_disabled=True)

    def shutdown(self) -> None:
        if self._queue is not None:
            self._queue.close()
        if self._worker is not None:
            self._worker.close()
        self.stats.write(force=True)
        self.engine.close()

    # -- scheduler side ----------------------------------------------------------------------
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int
                                   ) -> tuple[int | None, bool]:
        assert self._sched is not None
        n, is_async = self._sched.matched(request, num_computed_tokens)
        self.stats.write()
        return n, is_async

    def on_new_request(self, request: Any) -> None:
        assert self._sched is not None
        self._sched.queued(request)

    def update_state_after_alloc(self, request: Any, blocks: Any,
                                 num_external_tokens: int) -> None:
        assert self._sched is not None
        self._sched.after_alloc(request, num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> RkvMetadata:
        assert self._sched is not None
        self._sched.preempted(scheduler_output)
        announce, served = self._sched.take_queue()
        return RkvMetadata(self._sched.build(scheduler_output), announce, served)

    def update_connector_output(self, connector_output: Any) -> None:
        meta = getattr(connector_output, "kv_connector_worker_meta", None)
        if self._sched is not None and isinstance(meta, RkvWorkerMetadata):
            self._sched.worker_said(meta.loads_disabled)

    def request_finished(self, request: Any, block_ids: list[int]
                         ) -> tuple[bool, dict[str, Any] | None]:
        if self._sched is not None:
            self._sched.finished(request)
        return False, None
