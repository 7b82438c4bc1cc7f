"""The validation matrix: campaign against analytic, two-sided, as a standing check."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from rkv.cli import main
from rkv.faults.validate import grid, run_matrix, z_score


def test_z_score() -> None:
    assert z_score(50, 100, 0.5) == 0.0
    assert z_score(60, 100, 0.5) == pytest.approx(2.0)
    assert z_score(40, 100, 0.5) == pytest.approx(-2.0)
    assert z_score(1, 100, 0.0) == 0.0              # one count of slack when degenerate
    assert z_score(3, 100, 0.0) == math.inf
    assert z_score(97, 100, 1.0) == -math.inf


def test_quick_matrix_agrees(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A subset of presets x codes (12-30 s): every cell within |z| <= 4."""
    out = tmp_path / "v.json"
    rc = main(["validate", "--quick", "--json", str(out), "--quiet"])
    cells = json.loads(out.read_text())
    assert rc == 0, capsys.readouterr().out
    assert len(cells) == len(grid(quick=True)) and all(c["ok"] for c in cells)
    # Both outcomes occur somewhere, so the check is not vacuous.
    assert any(0 < c["due"] < c["blocks"] for c in cells)
    assert "cells agree within |z| <= 4" in capsys.readouterr().out


@pytest.mark.slow
def test_full_matrix_agrees() -> None:
    """Every preset x every code family x two residencies, and raw-BER rates."""
    cells = run_matrix(trials=40)
    bad = [c for c in cells if not c.ok]
    assert not bad, bad
