"""How much of the LRU-Belady gap is *whether* a block returns: an LRU that knows it.

    .venv/bin/python benchmarks/reuse_oracle.py benchmarks/traces/mooncake_conversation_trace.jsonl

For each capacity (a share of the trace's unique blocks), the prefix-token hit % of a plain
LRU over blocks and of the same LRU told, for every reference, whether the block will be
referenced again: it caches only blocks that will, and drops a block after its last use. The
plain column must equal ``rkv replay --policy lru`` (the same prefix-token accounting: a
request's blocks count while every earlier block hit; its last block holds the prompt's
remainder); the oracle column shows what a perfect *whether* predictor would buy with LRU's
*when*. Reads Mooncake-format JSON Lines; prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
from collections import OrderedDict
from pathlib import Path
from typing import Any

BLOCK_TOKENS = 512


def _load(path: Path) -> list[dict[str, Any]]:
    with path.open() as f:
        return [json.loads(line) for line in f if line.strip()]


def _last_uses(reqs: list[dict[str, Any]]) -> set[tuple[int, int]]:
    """(request, block) pairs after which the block is never referenced again."""
    seen: set[int] = set()
    out: set[tuple[int, int]] = set()
    for i in range(len(reqs) - 1, -1, -1):
        for h in set(reqs[i]["hash_ids"]):
            if h not in seen:
                out.add((i, h))
                seen.add(h)
    return out


def hit_percent(reqs: list[dict[str, Any]], capacity: int,
                last: set[tuple[int, int]] | None) -> float:
    """Prefix-token hit % of an LRU of ``capacity`` blocks; with ``last``, the oracle."""
    cache: OrderedDict[int, None] = OrderedDict()
    hit = total = 0
    for i, r in enumerate(reqs):
        ids = r["hash_ids"]
        prefix = True
        for j, h in enumerate(ids):
            tokens = BLOCK_TOKENS if j < len(ids) - 1 else \
                max(r["input_length"] - BLOCK_TOKENS * (len(ids) - 1), 0)
            total += tokens
            if h in cache:
                cache.move_to_end(h)
                hit += tokens if prefix else 0
                continue
            prefix = False
            if last is not None and (i, h) in last:
                continue                    # never needed again: not cached
            cache[h] = None
            if len(cache) > capacity:
                cache.popitem(last=False)
        if last is not None:
            for h in ids:
                if (i, h) in last:
                    cache.pop(h, None)      # its last use: drop it
    return 100.0 * hit / total if total else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--capacity", type=float, action="append",
                    help="share of unique blocks (repeatable; default 0.02 0.05 0.1 0.2)")
    args = ap.parse_args()
    reqs = _load(args.trace)
    unique = len({h for r in reqs for h in r["hash_ids"]})
    last = _last_uses(reqs)
    print("| capacity | lru | lru knowing whether a block returns |")
    print("|---|---:|---:|")
    for frac in args.capacity or [0.02, 0.05, 0.1, 0.2]:
        cap = max(1, round(frac * unique))
        print(f"| {100 * frac:g}% | {hit_percent(reqs, cap, None):.1f} | "
              f"{hit_percent(reqs, cap, last):.1f} |")


if __name__ == "__main__":
    main()
