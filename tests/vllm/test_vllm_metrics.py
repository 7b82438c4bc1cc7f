"""The connector's counters on vLLM's connector-stats / Prometheus path
(rkv.adapters.vllm_metrics), without a running vLLM: a step's increments, their aggregation
across roles, and the Prometheus counters vLLM's KVConnectorPromMetrics hook fills, scraped
and parsed with the client library's parser."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
from vllm_jobs import HAVE_VLLM

if not HAVE_VLLM:     # (importorskip would find tests/vllm itself, a namespace package)
    pytest.skip("vLLM is not installed here (scripts/test.sh runs these tests in .venv-vllm)",
                allow_module_level=True)

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from rkvtest import SMALL, local_config, random_kv

from rkv import Engine
from rkv.adapters.vllm import RkvConnector
from rkv.adapters.vllm_metrics import Deltas, RkvConnectorStats, metric_name, step_stats
from rkv.adapters.vllm_stats import Counters


def test_step_stats_are_increments_of_connector_and_store_counters(tmp_path: Path) -> None:
    with Engine.open(tmp_path / "s", local_config()) as e:
        counters, deltas = Counters(), Deltas()
        t = list(range(32))
        e.put(t, random_kv(SMALL, 32), model=SMALL)
        counters.add(loads=1, load_blocks=6)
        first = step_stats(deltas, counters.snapshot(), e.core)
        assert first is not None
        assert first.data["connector_loads"] == 1 and first.data["connector_load_blocks"] == 6
        assert first.data["store_puts"] == 1 and "connector_pid" not in first.data
        assert step_stats(deltas, counters.snapshot(), e.core) is None     # nothing moved
        e.get(t, model=SMALL)
        e.get(t, model=SMALL)
        counters.add(loads=2)
        second = step_stats(deltas, counters.snapshot(), e.core)
        assert second is not None
        assert second.data == {"connector_loads": 2, "store_gets": 2, "store_hits": 2,
                               "store_blocks_read": 12, "store_blocks_ok": 12}


def test_prometheus_hook_counts_aggregated_stats() -> None:
    reg = CollectorRegistry()
    types = {Counter: partial(Counter, registry=reg), Gauge: partial(Gauge, registry=reg),
             Histogram: partial(Histogram, registry=reg)}
    vllm_config = type("Cfg", (), {"kv_transfer_config": None})()
    prom = RkvConnector.build_prom_metrics(vllm_config, types, ["model_name", "engine"],
                                           {0: ["m", "0"], 1: ["m", "1"]})
    worker = RkvConnector.build_kv_connector_stats(
        {"connector_corrected_blocks": 2, "store_blocks_uncorrectable": 1,
         "connector_load_s": 0.5})
    sched = RkvConnectorStats(data={"connector_hit_tokens": 64,
                                    "connector_corrected_blocks": 1})
    agg = worker.aggregate(sched)
    assert agg.reduce() == {"connector_corrected_blocks": 3, "connector_hit_tokens": 64,
                            "connector_load_s": 0.5, "store_blocks_uncorrectable": 1}
    prom.observe(agg.to_dict(), engine_idx=0)
    prom.observe({"connector_corrected_blocks": 4}, engine_idx=1)
    prom.observe({"connector_corrected_blocks": 1}, engine_idx=0)
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in text_string_to_metric_families(generate_latest(reg).decode())
               for s in fam.samples if s.name.endswith("_total")}
    e0 = (("engine", "0"), ("model_name", "m"))
    e1 = (("engine", "1"), ("model_name", "m"))
    assert samples[("vllm:rkv_connector_corrected_blocks_total", e0)] == 4
    assert samples[("vllm:rkv_connector_corrected_blocks_total", e1)] == 4
    assert samples[("vllm:rkv_store_blocks_uncorrectable_total", e0)] == 1
    assert samples[("vllm:rkv_connector_load_seconds_total", e0)] == 0.5
    assert metric_name("store_gets") == "vllm:rkv_store_gets"
    assert RkvConnectorStats(data={"a": 0}).is_empty() and not agg.is_empty()
    assert len(samples) == 5
