"""The reports that print tables go through rkv.ui.tables: the replay matrices, the scrub
report, the stored mix and the scrub schedule, in text (no ANSI codes when captured),
Markdown, JSON and CSV."""

from __future__ import annotations

import csv
import io
import json
import math
from typing import Any

from rkv.eval.replay.report import format_table
from rkv.eval.replay.simulate import Result
from rkv.store.schedule_info import schedule_rows, schedule_text
from rkv.store.scrub_report import ScrubReport, TierScrub
from rkv.store.storemix import mix_rows, mix_table


def _result(policy: str, capacity: str, hits: int) -> Result:
    return Result(policy=policy, capacity=capacity, capacity_bytes=1 << 20, capacity_blocks=4,
                  capacity_fraction=float(capacity), requests=10, references=100, hits=hits,
                  tokens=1600, prefix_hit_tokens=hits * 16, evictions=0, ttft_mean=0.5,
                  ttft_p50=0.4, ttft_p90=1.0, ttft_p99=1.25, seconds=0.1,
                  refs_per_second=1000.0)


def _replay_results() -> list[Result]:
    return [_result("lru", "0.05", 40), _result("lru", "0.1", 60), _result("belady", "0.05", 55)]


def test_replay_matrices_text_and_markdown() -> None:
    res = _replay_results()
    text = format_table(res)
    assert "\x1b" not in text
    first = text.split("\n\n")[0].splitlines()
    assert first[0].split() == ["prefix-token", "hit", "%", "5%", "10%"]
    assert first[2].split() == ["lru", "40.0", "60.0"]
    assert first[3].split() == ["belady", "55.0"]
    md = format_table(res, markdown=True)
    assert md == format_table(res, fmt="markdown")
    assert md.splitlines()[:4] == ["| prefix-token hit % | 5% | 10% |", "|---|---:|---:|",
                                   "| lru | 40.0 | 60.0 |", "| belady | 55.0 |  |"]


def test_replay_json_and_csv() -> None:
    rows = json.loads(format_table(_replay_results(), fmt="json"))
    assert [(r["policy"], r["capacity"]) for r in rows] == [("lru", "5%"), ("lru", "10%"),
                                                            ("belady", "5%")]
    assert rows[0]["prefix-token hit %"] == 40.0 and rows[0]["TTFT p99 (s)"] == 1.25
    back = list(csv.DictReader(io.StringIO(format_table(_replay_results(), fmt="csv"))))
    assert back[1]["policy"] == "lru" and float(back[1]["block hit %"]) == 60.0


def _scrub() -> ScrubReport:
    return ScrubReport(tiers={"dram": TierScrub(scanned=10, bytes_read=12_345_678, ok=9,
                                                corrected=1),
                              "nvme": TierScrub(scanned=5, lost=1)},
                       chunks_dropped=1, seconds=2.0, total_blocks=20)


def test_scrub_report_formats() -> None:
    rep = _scrub()
    lines = rep.render().splitlines()
    assert lines[0] == "scrub completed: 15 of 20 blocks, 12.3 MB read in 2.0 s (6.2 MB/s)"
    assert lines[2].split() == ["tier", "scanned", "MB", "corrected", "refreshed", "moved",
                                "repaired", "lost", "degraded"]
    assert lines[4].split() == ["dram", "10", "12.3", "1", "0", "0", "0", "0", "0"]
    assert json.loads(rep.render("json")) == rep.to_dict()
    assert rep.render("csv").splitlines()[:2] == [
        "tier,scanned,bytes_read,ok,corrected,refreshed,moved,repaired,lost,skipped,degraded",
        "dram,10,12345678,9,1,0,0,0,0,0,0"]
    assert "| nvme | 5 | 0.0 | 0 | 0 | 0 | 0 | 1 | 0 |" in rep.render("markdown")


MIX: dict[str, dict[str, Any]] = {
    "dram": {"mix": {"16-bit + none": {"bits": 16, "code": "none", "blocks": 1200,
                                       "bytes": 3 << 20},
                     "unknown": {"bits": None, "code": None, "blocks": 3, "bytes": 1 << 20}}},
    "nvme": {"mix": {}}}


def test_mix_table() -> None:
    text = mix_table(MIX).splitlines()
    assert text[0] == "stored mix"
    assert text[3].split() == ["dram", "16", "none", "1,200", "3.0", "MiB", "75.0", "%"]
    assert text[4].split() == ["dram", "unknown", "unknown", "3", "1.0", "MiB", "25.0", "%"]
    assert mix_table({"nvme": {"mix": {}}}) == ""
    assert json.loads(mix_table(MIX, "json")) == mix_rows(MIX)
    assert mix_table(MIX, "csv").splitlines()[2] == "dram,,,3,1048576,0.25"


def _schedule_stats() -> dict[str, Any]:
    row = {"data_bytes": 196608, "bits": 16, "code": "rs(255,247)", "refresh_hours": 30.0,
           "scrub_hours": math.inf, "p_due_per_block_day_scrubbed": 1.2e-10,
           "p_due_per_block_day_unscrubbed": 3.4e-9, "horizon_hours": 8766.0, "note": ""}
    return {"schedule": {"target_p_due": 1e-9, "block_source": "m",
                         "tiers": {"cxl": row, "nvme": {**row, "note": "never needed"}}}}


def test_schedule_text() -> None:
    out = schedule_text(_schedule_stats())
    lines = out.splitlines()
    assert lines[0].startswith("scrub schedule (target P(DUE) 1e-09 per block; blocks of m;")
    assert lines[1].split() == ["tier", "data", "bits", "code", "refresh", "age", "scrub",
                                "every", "scrubbed", "unscrubbed"]
    assert lines[3].split() == ["cxl", "192", "KiB", "16", "rs(255,247)", "30", "h", "never",
                                "1.2e-10", "3.4e-09"]
    assert lines[3].startswith("  cxl ") and lines[-1] == "  note (nvme): never needed"
    rows = json.loads(schedule_text(_schedule_stats(), "json"))
    assert rows == [{**r, "scrub_hours": None} for r in schedule_rows(_schedule_stats())]
