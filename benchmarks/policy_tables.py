"""Tables of ``rkv replay --json`` results across traces: prefix-token hit %, the share of the
LRU-Belady gap closed, and each policy's replay speed.

    .venv/bin/python benchmarks/policy_tables.py benchmarks/results/policies_conversation.json \
        [more.json ...] [--baseline lru]

For every file: one row per policy (with its look-ahead), one column per capacity, cells
``hit % (gap closed %)`` where gap closed = (policy - baseline) / (Belady - baseline): the
baseline is blind ``--baseline`` (LRU by default, no queue) at the same capacity, taken from
the same file or, for files replayed only with a queue, from the file given by ``--blind``;
Belady is the blind optimum. Then the median references per second of each policy over the
file's capacities. With ``--margins``, instead: each policy's prefix-token hit % minus the
baseline's *with the same look-ahead*, in points, and the smallest margin of each row (the
check that a policy is never below LRU). Markdown on stdout; nothing is re-run, so the
numbers are the files'.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

REFERENCES = ("belady", "infinite")


def _rows(path: Path) -> tuple[dict[str, Any], dict[str, dict[str, dict[str, Any]]], list[str]]:
    """(the file's header, label -> capacity -> result, the capacities in order)."""
    data = json.loads(path.read_text())
    rows: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    caps: list[str] = []
    for r in data["results"]:
        rows[r["policy"]][r["capacity"]] = r      # labels already carry "+queue N"
        if r["capacity"] not in caps:
            caps.append(r["capacity"])
    return data, rows, caps


def tables(path: Path, baseline: str, blind: Path | None = None) -> str:
    """The Markdown tables of one results file."""
    data, rows, caps = _rows(path)
    best = rows.get("belady", {})
    base = rows.get(baseline) or (_rows(blind)[1].get(baseline, {}) if blind else {})
    out = [f"`{data['trace']}`: {data['requests']:,} requests, {data['references']:,} block "
           f"references, {data['unique_blocks']:,} unique blocks", "",
           "| prefix-token hit % (gap closed) | " + " | ".join(caps) + " |",
           "|---|" + "---:|" * len(caps)]
    for label, by_cap in rows.items():
        cells = []
        for c in caps:
            r = by_cap.get(c)
            if r is None:
                cells.append("")
                continue
            hit = 100 * r["prefix_token_hit_ratio"]
            b, o = base.get(c), best.get(c)
            cell = f"{hit:.1f}"
            if label not in REFERENCES and b is not None and o is not None and label != baseline:
                lo, hi = 100 * b["prefix_token_hit_ratio"], 100 * o["prefix_token_hit_ratio"]
                if hi > lo:
                    cell += f" ({100 * (hit - lo) / (hi - lo):.0f} %)"
            cells.append(cell)
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    out += ["", "| policy | refs/s (median over capacities) |", "|---|---:|"]
    for label, by_cap in rows.items():
        speed = statistics.median(r["refs_per_second"] for r in by_cap.values())
        out.append(f"| {label} | {speed:,.0f} |")
    return "\n".join(out) + "\n"


def _queue_of(label: str) -> tuple[str, str]:
    """("adaptive", " +queue 256") from "adaptive +queue 256"; no queue: ("lru", "")."""
    name, sep, rest = label.partition(" +queue ")
    return name, sep + rest


def margins(path: Path, baseline: str) -> str:
    """Each policy minus ``baseline`` with the same look-ahead, in points, per capacity."""
    data, rows, caps = _rows(path)
    out = [f"`{data['trace']}`", "",
           "| points above " + baseline + " (same queue) | " + " | ".join(caps) + " | min |",
           "|---|" + "---:|" * (len(caps) + 1)]
    for label, by_cap in rows.items():
        name, queue = _queue_of(label)
        if label in REFERENCES or name == baseline:
            continue
        base = rows.get(baseline + queue, {})
        diffs: list[float | None] = []
        for c in caps:
            r, b = by_cap.get(c), base.get(c)
            diffs.append(None if r is None or b is None else
                         100 * (r["prefix_token_hit_ratio"] - b["prefix_token_hit_ratio"]))
        known = [d for d in diffs if d is not None]
        cells = ["" if d is None else f"{d:+.2f}" for d in diffs]
        cells.append(f"{min(known):+.2f}" if known else "")
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--baseline", default="lru")
    ap.add_argument("--blind", type=Path, help="results holding the blind baseline row")
    ap.add_argument("--margins", action="store_true",
                    help="points above the baseline with the same look-ahead, per capacity")
    args = ap.parse_args()
    if args.margins:
        print("\n".join(margins(p, args.baseline) for p in args.files))
    else:
        print("\n".join(tables(p, args.baseline, args.blind) for p in args.files))


if __name__ == "__main__":
    main()
