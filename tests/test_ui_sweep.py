"""Sweeps through rkv.ui: progress lines off a terminal while cells run, and the Pareto front
as a table (text, JSON, CSV) that agrees with ``pareto``."""

from __future__ import annotations

import csv
import io
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from rkv.eval.sweep.report import front_rows, front_table, pareto
from rkv.eval.sweep.run import run_sweep
from rkv.eval.sweep.spec import parse_sweep
from tests.test_sweep_report import grid


def test_sweep_progress_and_log_off_a_terminal(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str],
                                               caplog: pytest.LogCaptureFixture) -> None:
    sweep = parse_sweep({
        "sweep": {"name": "tiny", "metrics": ["reliability"], "seeds": [0],
                  "results": str(tmp_path / "r.jsonl")},
        "axes": {"preset": ["raw-ber"], "bits": [16], "code": ["none", "crc32c"],
                 "layout": [{"chunk_tokens": 32}]},
        "params": {"raw-ber": {"ber": [1e-6]}},
        "reliability": {"trials": 1, "blocks": 1}})
    with caplog.at_level(logging.INFO, logger="rkv.eval.sweep.run"):
        run = run_sweep(sweep, executor="serial", progress=True)
    assert len(run.ran) == 2
    err = capsys.readouterr().err
    assert "\x1b" not in err
    assert err.splitlines()[-1].startswith("sweep tiny: 2/2 cells (100%), done in")
    done = [r.getMessage() for r in caplog.records if "done in" in r.getMessage()]
    assert len(done) == 2 and all(m.startswith("sweep tiny: cell ") for m in done)
    run_sweep(sweep, executor="serial", progress=False)
    assert capsys.readouterr().err == ""


def test_front_table_agrees_with_pareto() -> None:
    rows: list[dict[str, Any]] = grid()
    front = pareto(rows)
    flat = front_rows(rows)
    assert [(r["tier"], r["setting"]) for r in flat] == [(p["tier"], p["label"]) for p in front]
    assert [r["overhead"] for r in flat] == [p["overhead"] for p in front]
    assert json.loads(front_table(rows, "json")) == json.loads(json.dumps(flat))
    back = list(csv.DictReader(io.StringIO(front_table(rows, "csv"))))
    assert [b["setting"] for b in back] == [p["label"] for p in front]
    text = front_table(rows).splitlines()
    assert text[0] == "Pareto-optimal settings"
    assert text[1].split()[:4] == ["tier", "setting", "overhead", "KL"]
    assert len(text) == 3 + len(front) and "\x1b" not in "".join(text)
    assert text[3].split()[0] == front[0]["tier"]
