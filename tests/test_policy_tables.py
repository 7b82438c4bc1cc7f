"""benchmarks/policy_tables.py, which turns replay JSONs into docs/policies.md's tables: the
margins against LRU with the same queue, recomputed here from the results themselves."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.policy_tables import _queue_of, margins, tables
from rkv.eval.replay.report import to_json
from rkv.eval.replay.simulate import CostModel, parse_capacity, prepare, run_replay
from rkv.format.traces import Request

COST = CostModel(block_bytes=1, bandwidth=1.0, latency=0.0, recompute_tps=512)


def results_file(tmp_path: Path) -> tuple[Path, list[dict[str, object]]]:
    reqs = [(0, 1, 2), (3,), (0, 1, 4), (5, 6), (0, 1, 2, 7), (3, 8), (5, 6, 9), (0, 1)] * 3
    trace = prepare([Request(float(i), 512 * len(b), tuple(b), 512)
                     for i, b in enumerate(reqs)], COST)
    caps = [parse_capacity(c) for c in ("0.2", "0.5")]
    res = run_replay(trace, ["lru", "prefix", "adaptive"], caps, COST, lookaheads=[0, 2])
    path = tmp_path / "r.json"
    path.write_text(json.dumps(to_json(res, trace, COST, {"trace": "t.jsonl"})))
    return path, [r.row() for r in res]


def test_margins_are_the_differences_with_the_same_queue(tmp_path: Path) -> None:
    path, rows = results_file(tmp_path)
    hit = {(r["policy"], r["capacity"]): 100 * float(str(r["prefix_token_hit_ratio"]))
           for r in rows}
    text = margins(path, "lru")
    lines = {line.split(" | ")[0].strip("| "): line for line in text.splitlines()
             if line.startswith("| ") and "points above" not in line}
    assert set(lines) == {"prefix", "adaptive", "prefix +queue 2", "adaptive +queue 2"}
    for label, line in lines.items():
        _, queue = _queue_of(label)
        cells = [c.strip() for c in line.strip("|").split("|")][1:]
        want = [hit[(label, c)] - hit[("lru" + queue, c)] for c in ("0.2", "0.5")]
        assert cells[:2] == [f"{d:+.2f}" for d in want]
        assert cells[2] == f"{min(want):+.2f}"


def test_tables_show_gap_closed_and_speed(tmp_path: Path) -> None:
    path, _ = results_file(tmp_path)
    text = tables(path, "lru")
    assert "| prefix-token hit % (gap closed) | 0.2 | 0.5 |" in text
    assert "refs/s (median over capacities)" in text
    assert _queue_of("lru") == ("lru", "") and _queue_of("a +queue 75s") == ("a", " +queue 75s")
