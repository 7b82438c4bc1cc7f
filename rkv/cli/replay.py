"""``rkv replay``: a request trace through eviction policies (hit ratios, modeled TTFT,
Belady and an infinite cache), or with ``--moe`` a routing trace through expert caches."""

from __future__ import annotations

from typing import Any

import click

from rkv.cli.common import OUT_FILE, call, command, quiet_flag
from rkv.cli.moe_replay import dispatch, moe_options, moe_params


@command("replay")
@click.argument("trace")
@click.option("--format", type=click.Choice(["mooncake", "accesslog"]), default="mooncake",
              help="trace format")
@click.option("--policy", multiple=True, metavar="SPEC",
              help="policy spec, e.g. lru or s3fifo(small=0.1), optionally with an admission "
                   "policy: prefix+after(n=2) (repeatable)  [default: every registered policy]")
@click.option("--markdown", is_flag=True, help="print Markdown tables")
@click.option("--csv", is_flag=True, help="print the results table alone as CSV")
@click.option("--lookahead", multiple=True, metavar="N|Ts",
              help="also replay with a scheduler that knows the queued requests: the next N "
                   "(256) or those arriving within a time (75s, 500ms, 2min); their cached "
                   "blocks are not evicted, and with --tiers they are also prefetched into the "
                   "top tier; repeatable; 0 = no look-ahead  [default: 0]")
@click.option("--capacity", multiple=True, metavar="C",
              help="cache size: a fraction of the trace's unique blocks (0.05, 5%) or bytes "
                   "(2GiB) (repeatable)  [default without --tiers: 0.01 0.02 0.05 0.1 0.2]")
@click.option("--tiers", multiple=True, metavar="LAYOUT",
              help="tiers top to bottom, NAME=C[@GBPS/US],...: dram=2%,cxl=5%,nvme=20% (dram, "
                   "cxl and nvme have rkv's default bandwidth and latency; other names need "
                   "@GBPS/US) (repeatable)")
@click.option("--promote", default=None, metavar="hit|never",
              help="with --tiers: move a block hit in a lower tier to the top tier (hit) or "
                   "leave it there (never)  [default: hit]")
@click.option("--prefetch-policy", default=None, metavar="SPEC",
              help="which queued blocks a budget moves: queue or shallow  [default: queue]")
@click.option("--prefetch-budget", default=None, metavar="B",
              help="with --tiers and --lookahead: bytes prefetched per request, as bytes "
                   "(2GiB) or a fraction of the top tier (0: queued blocks are protected but "
                   "not prefetched)  [default: 0.25]")
@click.option("--block-bytes", type=click.IntRange(min=1), default=None, metavar="N",
              help="bytes of one block  [default: 11796480, 512 tokens of SmolLM2-135M fp16 "
                   "KV]")
@click.option("--limit", type=click.IntRange(min=1), default=None, metavar="N",
              help="replay only the first N requests")
@click.option("--recompute-tps", type=float, default=None, metavar="X",
              help="prefill tokens per second on a miss  [default: 530, SmolLM2-135M on 2 CPU "
                   "threads]")
@click.option("--bandwidth", type=float, default=20.0, metavar="GBPS",
              help="GB/s when loading hit blocks (DRAM-like)")
@click.option("--latency", type=float, default=0.1, metavar="US",
              help="microseconds per loaded block")
@click.option("--json", "json", type=OUT_FILE, default=None, metavar="PATH",
              help="write every result as JSON here")
@click.option("--plot", type=OUT_FILE, default=None, metavar="PNG",
              help="plot the hit ratio against capacity (needs matplotlib)")
@quiet_flag()
@click.option("--store", default=None, metavar="DIR",
              help="also replay every policy through real one-tier stores created (and "
                   "destroyed) under this new directory")
@moe_options
def replay_cmd(**kw: Any) -> int:
    """Replay a request trace (JSON Lines) through eviction policies: hit ratios, modeled
    TTFT, Belady and an infinite cache for reference; or, with --moe, a MoE routing trace
    through expert caches and prefetchers (docs/policies.md, docs/moe.md)."""
    for name in ("policy", "lookahead", "capacity", "tiers"):
        kw[name] = list(kw[name])
    if kw["csv"] and kw["markdown"]:
        raise click.UsageError("--csv and --markdown exclude each other")
    kw["fmt"] = "csv" if kw.pop("csv") else "markdown" if kw["markdown"] else "text"
    return call(_run, **moe_params(kw))


def _run(args: Any) -> int:
    from rkv.eval.replay.report import cli_replay

    return dispatch(args, cli_replay)
