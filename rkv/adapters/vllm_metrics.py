"""The rkv connector's counters on vLLM's connector-stats and Prometheus path (vLLM 0.32).

vLLM asks each connector role for the stats of the last step
(``KVConnectorBase_V1.get_kv_connector_stats``), ships the worker's to the scheduler process,
aggregates them with the scheduler's, and passes the aggregate to the connector class's
``build_prom_metrics`` object (``KVConnectorPromMetrics.observe``) and to the periodic log
line. :func:`step_stats` builds that step's :class:`RkvConnectorStats`: the increments, since
the previous call, of the connector's own counters (:mod:`rkv.adapters.vllm_stats`: loads,
verified, corrected and failed blocks, recomputed tokens, saves, lookups, hit tokens) and of
its engine's session counters (``StoreCore.counters``: gets, hits, corrected and
uncorrectable blocks, adoptions; read without scanning the index). :class:`RkvPromMetrics`
adds each to a ``vllm:rkv_<name>_total`` counter with vLLM's per-engine labels.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
)

from rkv.store.core import StoreCore

__all__ = ["Deltas", "RkvConnectorStats", "RkvPromMetrics", "metric_name", "step_stats"]


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


@dataclass
class RkvConnectorStats(KVConnectorStats):  # type: ignore[misc]
    """One interval's increments, ``{"connector_<name>" or "store_<name>": amount}``."""

    def reset(self) -> None:
        empty: dict[str, Any] = {}
        self.data = empty

    def aggregate(self, other: KVConnectorStats) -> RkvConnectorStats:
        for k, v in other.data.items():
            if _number(v):
                self.data[k] = self.data.get(k, 0) + v
        return self

    def reduce(self) -> dict[str, int | float]:
        return {k: v for k, v in sorted(self.data.items()) if _number(v)}

    def is_empty(self) -> bool:
        return not any(v for v in self.data.values() if _number(v))


class Deltas:
    """What named counters rose by since the previous :meth:`take`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}

    def take(self, now: Mapping[str, Any]) -> dict[str, float]:
        out = {}
        with self._lock:
            for k, v in now.items():
                if _number(v) and v != self._last.get(k, 0):
                    out[k] = v - self._last.get(k, 0)
                    self._last[k] = v
        return out


def step_stats(deltas: Deltas, connector: Mapping[str, Any], core: StoreCore
               ) -> RkvConnectorStats | None:
    """This step's stats (None when nothing moved): ``connector`` is the connector's counter
    snapshot, ``core`` its engine's."""
    with core.lock:
        store = dict(core.counters)
    now = {**{f"connector_{k}": v for k, v in connector.items() if k != "pid"},
           **{f"store_{k}": v for k, v in store.items()}}
    data = deltas.take(now)
    return RkvConnectorStats(data=data) if data else None


def metric_name(key: str) -> str:
    """The Prometheus name of stats key ``key`` (seconds spelled out, as the convention
    asks): ``connector_load_s`` -> ``vllm:rkv_connector_load_seconds``."""
    if key.endswith("_s"):
        key = key[:-2] + "_seconds"
    return f"vllm:rkv_{key}"


class RkvPromMetrics(KVConnectorPromMetrics):  # type: ignore[misc]
    """A ``vllm:rkv_<key>_total`` counter per stats key, made when the key first appears
    (the set of store counters grows as the store meets new cases)."""

    def __init__(self, vllm_config: Any, metric_types: dict[type, type],
                 labelnames: list[str], per_engine_labelvalues: dict[int, list[object]]
                 ) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._metrics: dict[str, Any] = {}
        self._lock = threading.Lock()

    def _counter(self, key: str) -> Any:
        with self._lock:
            metric = self._metrics.get(key)
            if metric is None:
                metric = self._counter_cls(
                    name=metric_name(key), labelnames=self._labelnames,
                    documentation=f"rkv connector: {key.replace('_', ' ')} (docs/metrics.md)")
                self._metrics[key] = metric
            return metric

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        labels = self.per_engine_labelvalues.get(engine_idx, [])
        for key, v in transfer_stats_data.items():
            if _number(v) and v > 0:
                self._counter(key).labels(*labels).inc(v)
