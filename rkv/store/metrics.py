"""Prometheus metrics of a store: a custom collector over ``stats()``, and an HTTP exporter.

:class:`StoreCollector` reads a ``stats()`` dict (:func:`rkv.store.upkeep.stats`) at scrape
time and turns it into metric families, so there is no second set of counters to drift from
what ``Engine.stats()`` reports. Names follow Prometheus conventions: an ``rkv_`` prefix,
``_total`` on counters, base units (``_bytes``, ``_seconds``, ``_ratio``), and labels ``tier``
and ``model`` (a model is its 12-hex-digit fingerprint label; ``rkv_model_info`` maps it to
the model's name). The metric list is in docs/metrics.md.

:func:`serve` starts an HTTP server on its own thread (``prometheus_client``'s WSGI app on a
``wsgiref`` server) and returns a :class:`MetricsServer` handle that stops it. Each scrape
calls ``stats()``, which scans the store's index: its cost grows with the number of stored
chunks (see docs/metrics.md for a measured figure).

``prometheus_client`` is imported here only: ``import rkv`` does not load it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from rkv.errors import TierUnavailableError
from rkv.store.remote_share import remote_of
from rkv.store.tally import DOWN_STATES

if TYPE_CHECKING:
    from rkv.store.core import StoreCore

__all__ = ["MetricsServer", "StoreCollector", "probe_tiers", "registry_for", "serve"]

#: The key :func:`probe_tiers` asks a remote tier for (no block has it: a miss that proves
#: the server answers).
PROBE_KEY = b"rkv-metrics-probe"

Stats = Callable[[], dict[str, Any]]

#: Counters kept per tier and model (``stats()["session_by"]``): name in the tally, metric
#: name, help text.
_TIER_COUNTERS = (
    ("blocks_read", "rkv_blocks_read_total", "Blocks read by gets, by the tier they came from."),
    ("bytes_read", "rkv_read_bytes_total", "Record bytes of the blocks gets read."),
    ("blocks_corrected", "rkv_blocks_corrected_total",
     "Blocks read back with errors the code corrected."),
    ("symbols_corrected", "rkv_corrected_symbols_total",
     "Symbols (Reed-Solomon) or bits (BCH) the code corrected in reads."),
    ("blocks_degraded", "rkv_blocks_degraded_total",
     "Blocks read with a damaged tolerant part (served, flagged degraded)."),
    ("blocks_uncorrectable", "rkv_blocks_uncorrectable_total",
     "Detected uncorrectable blocks (DUE): the caller recomputes from there."),
    ("blocks_missing", "rkv_blocks_missing_total",
     "Indexed blocks whose record was gone (the caller recomputes from there)."),
    ("chunks_written", "rkv_chunks_written_total", "Chunks puts wrote into the tier."),
)

#: Counters kept per model only.
_MODEL_COUNTERS = (
    ("gets", "rkv_gets_total", "Get calls."),
    ("hits", "rkv_get_hits_total", "Gets that returned at least one token."),
    ("misses", "rkv_get_misses_total", "Gets that returned no token."),
)

#: A remote tier's own counters (``stats()["tiers"][t]["remote"]``).
_REMOTE_COUNTERS = (
    ("hits", "rkv_remote_hits_total", "Values the remote server had."),
    ("misses", "rkv_remote_misses_total", "Values asked of the remote server that it lacked."),
    ("bytes_read", "rkv_remote_read_bytes_total", "Bytes read from the remote server."),
    ("bytes_written", "rkv_remote_written_bytes_total", "Bytes written to the remote server."),
    ("unavailable", "rkv_remote_unavailable_total",
     "Calls that failed because the server was unavailable."),
    ("auth_rejected", "rkv_remote_auth_rejected_total",
     "Values rejected by their authentication tag."),
)

#: Session counters (``stats()["session"]``) exported under a name of their own.
_SESSION_COUNTERS = (
    ("puts", "rkv_puts_total", "Put calls."),
    ("lookups", "rkv_lookups_total", "Lookup calls."),
    ("bytes_written", "rkv_written_bytes_total", "Record bytes puts wrote."),
    ("blocks_repaired", "rkv_blocks_repaired_total",
     "Corrected blocks rewritten from their corrected data."),
    ("remote_adopted", "rkv_remote_adopted_chunks_total",
     "Chunks adopted from a shared tier (written there by another node)."),
    ("remote_written_through", "rkv_remote_written_through_blocks_total",
     "Blocks written through to a shared tier."),
    ("remote_write_errors", "rkv_remote_write_errors_total",
     "Write-throughs to a shared tier that failed."),
    ("remote_probe_rejected", "rkv_remote_probe_rejected_total",
     "Shared-tier chunks not adopted: their values failed authentication."),
    ("promoted_chunks", "rkv_promoted_chunks_total", "Chunks moved up a tier."),
)


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) else None


class StoreCollector(Collector):
    """Metric families of ``stats()``, built at each scrape (see the module docstring)."""

    def __init__(self, stats: Stats) -> None:
        self._stats = stats

    def describe(self) -> list[Metric]:
        return []        # no collect() at registration: a scrape is the only caller

    def collect(self) -> Iterator[Metric]:
        s = self._stats()
        yield from self._store(s)
        yield from self._tiers(s)
        yield from self._by(s)
        yield from self._session(s)
        yield from self._scrub(s)

    # -- the store's durable state ----------------------------------------------------------
    def _store(self, s: dict[str, Any]) -> Iterator[Metric]:
        info = GaugeMetricFamily("rkv_model_info", "A stored model: its label and name.",
                                 labels=["model", "name"])
        for m in s.get("models", []):
            info.add_metric([str(m["fingerprint"])[:12],
                             str(m.get("model_id") or m.get("name") or "damaged")], 1.0)
        yield info
        for key, name, doc in (("chunks", "rkv_chunks", "Chunks in the index."),
                               ("tokens", "rkv_tokens", "Tokens of the stored chunks."),
                               ("pinned_chunks", "rkv_pinned_chunks", "Pinned chunks."),
                               ("unreadable_chunks", "rkv_unreadable_chunks",
                                "Index entries that cannot be read.")):
            yield GaugeMetricFamily(name, doc, value=float(s.get(key, 0)))

    def _tiers(self, s: dict[str, Any]) -> Iterator[Metric]:
        lab = ["tier"]
        used = GaugeMetricFamily("rkv_tier_used_bytes", "Record bytes indexed in the tier.",
                                 labels=lab)
        cap = GaugeMetricFamily("rkv_tier_capacity_bytes", "The tier's configured capacity.",
                                labels=lab)
        blocks = GaugeMetricFamily("rkv_tier_blocks", "Blocks indexed in the tier.",
                                   labels=lab)
        up = GaugeMetricFamily("rkv_tier_available",
                               "1 while the tier is available as this process sees it, else 0.",
                               labels=lab)
        nodes = GaugeMetricFamily("rkv_tier_node_available",
                                  "1 while a node of a clustered tier is ok, else 0.",
                                  labels=["tier", "node"])
        plan = GaugeMetricFamily("rkv_tier_plan_blocks",
                                 "Blocks in the tier by plan (bits and code).",
                                 labels=["tier", "bits", "code"])
        plan_bytes = GaugeMetricFamily("rkv_tier_plan_bytes",
                                       "Record bytes in the tier by plan (bits and code).",
                                       labels=["tier", "bits", "code"])
        oldest = GaugeMetricFamily("rkv_tier_block_age_oldest_seconds",
                                   "Age of the tier's oldest written block.", labels=lab)
        median = GaugeMetricFamily("rkv_tier_block_age_median_seconds",
                                   "Median age of the tier's written blocks.", labels=lab)
        down = s.get("availability", {}).get("down", {})
        remote: list[tuple[str, dict[str, Any]]] = []
        for name, t in s.get("tiers", {}).items():
            used.add_metric([name], float(t.get("bytes") or 0))
            cap.add_metric([name], float(t.get("capacity_bytes") or 0))
            blocks.add_metric([name], float(t.get("blocks") or 0))
            up.add_metric([name], float(t.get("state") not in DOWN_STATES and name not in down))
            for node, state in (t.get("nodes") or {}).items():
                nodes.add_metric([name, str(node)], float(state == "ok"))
            for row in (t.get("mix") or {}).values():
                bits = row.get("bits")
                if row.get("vbits") not in (None, bits):
                    bits = f"{bits}+{row['vbits']}"
                key = [name, "unknown" if bits is None else str(bits),
                       str(row.get("code") or "unknown")]
                plan.add_metric(key, float(row.get("blocks", 0)))
                plan_bytes.add_metric(key, float(row.get("bytes", 0)))
            ages = t.get("ages") or {}
            for fam, k in ((oldest, "oldest_s"), (median, "median_s")):
                if _num(ages.get(k)) is not None:
                    fam.add_metric([name], float(ages[k]))
            if isinstance(t.get("remote"), dict):
                remote.append((name, t["remote"]))
        yield from (used, cap, blocks, up, nodes, plan, plan_bytes, oldest, median)
        yield GaugeMetricFamily("rkv_tier_state_changes",
                                "Tier availability changes this process logged.",
                                value=float(s.get("availability", {}).get("changes", 0)))
        calls = CounterMetricFamily("rkv_remote_calls_total",
                                    "Calls to the remote server, by operation.",
                                    labels=["tier", "op"])
        for name, r in remote:
            for op in ("gets", "mgets", "writes"):
                calls.add_metric([name, op], float(r.get(op, 0)))
        yield calls
        for field, metric, doc in _REMOTE_COUNTERS:
            counter = CounterMetricFamily(metric, doc, labels=lab)
            for name, r in remote:
                counter.add_metric([name], float(r.get(field, 0)))
            yield counter

    # -- this session's counters ------------------------------------------------------------
    def _by(self, s: dict[str, Any]) -> Iterator[Metric]:
        by: dict[str, dict[str, dict[str, int]]] = s.get("session_by", {})
        for key, metric, doc in _TIER_COUNTERS:
            fam = CounterMetricFamily(metric, doc, labels=["tier", "model"])
            for tier, models in by.items():
                for model, counts in models.items():
                    if tier and key in counts:
                        fam.add_metric([tier, model], float(counts[key]))
            yield fam
        for key, metric, doc in _MODEL_COUNTERS:
            fam = CounterMetricFamily(metric, doc, labels=["model"])
            for model, counts in by.get("", {}).items():
                if model and key in counts:
                    fam.add_metric([model], float(counts[key]))
            yield fam
        fam = CounterMetricFamily("rkv_scrub_blocks_total",
                                  "Blocks scrub passes handled, by outcome (corrected, "
                                  "repaired and lost are damage the scrub found).",
                                  labels=["tier", "outcome"])
        for tier, models in by.items():
            for name, n in models.get("", {}).items():
                if tier and name.startswith("scrub_"):
                    fam.add_metric([tier, name[len("scrub_"):]], float(n))
        yield fam

    def _session(self, s: dict[str, Any]) -> Iterator[Metric]:
        session = s.get("session", {})
        for key, metric, doc in _SESSION_COUNTERS:
            yield CounterMetricFamily(metric, doc, value=_num(session.get(key)) or 0.0)
        events = CounterMetricFamily("rkv_session_events_total",
                                     "Every counter of stats()['session'], by name.",
                                     labels=["event"])
        for name, n in sorted(session.items()):
            if _num(n) is not None:
                events.add_metric([name], float(n))
        yield events

    def _scrub(self, s: dict[str, Any]) -> Iterator[Metric]:
        last = s.get("last_scrub")
        if not last:
            return
        total = int(last.get("blocks", 0))
        yield GaugeMetricFamily("rkv_scrub_last_coverage_ratio",
                                "Share of its planned blocks the last scrub pass read.",
                                value=float(last.get("scanned", 0)) / total if total else 1.0)
        yield GaugeMetricFamily("rkv_scrub_last_age_seconds",
                                "Time since the last scrub pass of this process ended.",
                                value=max(0.0, (int(s.get("now_ns", 0)) - int(last["at_ns"]))
                                          / 1e9))


def probe_tiers(core: StoreCore) -> dict[str, bool]:
    """Ask each remote tier of ``core`` for one absent value, so its availability is known
    to a process that does not otherwise call it (``rkv serve-metrics``); returns tier ->
    answered. The outcome goes to ``core.watch`` (a change is logged once)."""
    out = {}
    for name in core.order:
        tier = remote_of(core.tiers[name])
        if tier is None:
            continue
        try:
            tier.get(PROBE_KEY)
        except TierUnavailableError as exc:
            core.watch.failed(name, str(exc))
            out[name] = False
            continue
        core.watch.succeeded(name)
        out[name] = True
    return out


def registry_for(stats: Stats) -> CollectorRegistry:
    """A registry holding only a :class:`StoreCollector` over ``stats``."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(StoreCollector(stats))
    return reg


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not logged (one a few seconds would flood the log)."""


class MetricsServer:
    """A running exporter: ``url`` to scrape, :meth:`close` to stop it (also on ``with``)."""

    def __init__(self, server: WSGIServer, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread
        host, port = server.server_address[:2]
        self.addr, self.port = str(host), int(port)
        self.url = f"http://{self.addr}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving and join the thread; closing again does nothing."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join()
        self._server.server_close()

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def serve(stats: Stats, port: int = 0, addr: str = "127.0.0.1") -> MetricsServer:
    """Serve the metrics of ``stats`` at ``http://addr:port/metrics`` on a daemon thread
    (``port`` 0: a free one, see :attr:`MetricsServer.port`)."""
    app = make_wsgi_app(registry_for(stats))
    server = make_server(addr, port, app, WSGIServer, handler_class=_Quiet)
    thread = threading.Thread(target=server.serve_forever, name="rkv-metrics", daemon=True)
    thread.start()
    return MetricsServer(server, thread)
