"""``rkv plan`` says what it is doing (issue 32): a count of the fault models' predictions
(the slow stage) and of the search on stderr, quiet with -q; and it prints capacities for
people: the planner's unbounded free capacity (2**62) as "unbounded", never its digits."""

from __future__ import annotations

from pathlib import Path

import pytest

from rkv.cli import main
from rkv.placement.options import ReliabilityCache

CONFIG = '''chunk_tokens = 16
[[tiers]]
name = "t"
fault_model = "raw-ber"
[placement]
'''


def _plan(tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[str, str]:
    cfg = tmp_path / "c.toml"
    cfg.write_text(CONFIG)
    assert main(["plan", "--config", str(cfg), "--tokens", "32", "--rows", "2", *extra]) == 0
    cap = capsys.readouterr()
    return cap.out, cap.err


def test_plan_counts_its_stages(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RKV_PROGRESS", "plain")
    out, err = _plan(tmp_path, capsys)
    lines = err.strip().splitlines()
    assert any(line.startswith("plan: predictions: ") and "done in" in line for line in lines)
    assert any(line.startswith("plan: search: 1/1 plan") for line in lines), err
    assert "of unbounded" in out and str(1 << 62) not in out


def test_plan_quiet_says_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RKV_PROGRESS", "plain")
    out, err = _plan(tmp_path, capsys, "-q")
    assert "plan: predictions" not in err and "plan: search" not in err
    assert "of unbounded" in out


def test_warm_reports_each_prediction() -> None:
    import faultmodels

    model = faultmodels.get_model({"model": "raw-ber", "ber": 1e-6})
    seen: list[tuple[int, int]] = []
    cache = ReliabilityCache()
    reqs = [("none", 1024, model, 1.0), ("rs(255,239)", 1024, model, 1.0),
            ("none", 4096, model, 1.0), ("none", 1024, model, 1.0)]      # one repeat
    assert cache.warm(reqs, progress=lambda d, t: seen.append((d, t))) == 3
    assert seen == [(0, 3), (1, 3), (2, 3), (3, 3)]
    seen.clear()
    assert cache.warm(reqs, progress=lambda d, t: seen.append((d, t))) == 0
    assert seen == [(0, 0)]                                  # all known: nothing to count
