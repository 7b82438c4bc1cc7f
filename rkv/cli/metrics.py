"""``rkv serve-metrics PATH``: serve a store's Prometheus metrics until interrupted (see
:mod:`rkv.store.metrics` and docs/metrics.md)."""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any

import click

from rkv.cli.common import STORE_PATH, call, command


@command("serve-metrics")
@click.argument("path", type=STORE_PATH)
@click.option("--port", type=click.IntRange(0, 65535), default=9464, show_default=True,
              help="TCP port to serve on (0: a free one, printed at start)")
@click.option("--addr", default="127.0.0.1", show_default=True,
              help="address to bind (0.0.0.0: every interface)")
@click.option("--interval", type=click.FloatRange(min=0, min_open=True), default=15.0,
              show_default=True, metavar="SECONDS",
              help="how often to probe the remote tiers' servers")
def serve_metrics_cmd(**kw: Any) -> int:
    """Serve a store's metrics for Prometheus at http://ADDR:PORT/metrics until Ctrl-C or
    SIGTERM. The store is opened read-only: what this process sees is the store's durable
    state (contents, per-tier usage, plan mix, block ages) and the availability of its remote
    tiers (probed every --interval seconds); the live counters of a serving engine (hits,
    corrections, DUEs) are exported by that engine itself (``Engine.serve_metrics``)."""
    return call(cmd_serve_metrics, **kw)


def cmd_serve_metrics(args: Any) -> int:
    from rkv.store.engine import Engine
    from rkv.store.metrics import probe_tiers

    stop = threading.Event()
    old = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        with Engine.open(args.path, create=False, readonly=True) as engine:
            probe_tiers(engine.core)
            with engine.serve_metrics(args.port, args.addr) as server:
                print(f"serving metrics of {args.path} at {server.url} (Ctrl-C stops)",
                      file=sys.stderr, flush=True)
                try:
                    while not stop.wait(args.interval):
                        probe_tiers(engine.core)
                except KeyboardInterrupt:
                    pass
        print("metrics server stopped", file=sys.stderr)
    finally:
        signal.signal(signal.SIGTERM, old)
    return 0
