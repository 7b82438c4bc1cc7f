"""``rkv demo``: the prompts part stores and verifies; the faults part injects the same bursts
into rkv's and raw storage's records through the fault-injection tier wrapper, and rkv
corrects or reports them where raw storage returns wrong values."""

from __future__ import annotations

import numpy as np
import pytest

from rkv.eval.demo import run_demo, synthetic_kv
from rkv.eval.demo_faults import BURSTS, fault_demo, fault_rows
from rkv.format.model import ModelSpec

SPEC = ModelSpec("test/demo", n_layers=8, n_kv_heads=2, head_dim=16, dtype="float16")


def test_fault_demo_rkv_catches_raw_does_not() -> None:
    tokens = np.arange(512, dtype=np.int64)
    kv = synthetic_kv(SPEC, tokens)
    d = fault_demo(SPEC, kv, tokens)
    assert (d.tier, d.ecc) == ("cxl", "rs(255,247)") and len(d.rows) == len(BURSTS)
    small, large = d.rows
    assert small["rkv"] == "corrected (4 symbols), values exact"
    assert large["rkv"] == "detected (uncorrectable): tokens 256-511 recomputed, 0-255 verified"
    assert d.rkv_tokens == 256 and d.rkv_exact
    assert small["raw storage"].startswith("silently wrong: ")
    assert large["raw storage"].startswith("silently wrong: ")
    assert d.raw_wrong > 0 and d.raw_max_error > 0
    head, rows, verdict = fault_rows(d)
    assert "rs(255,247)" in head and rows is d.rows
    assert verdict.startswith("rkv: 0 silently wrong values, 256 tokens to recompute; raw "
                              f"storage: {d.raw_wrong} silently wrong values")


def test_run_demo(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_demo(prompts=2) == 0
    out = capsys.readouterr()
    assert "every reload was byte-exact and verified" in out.out
    assert "corrected (4 symbols), values exact" in out.out
    assert "silently wrong" in out.out and "\x1b" not in out.out
    assert out.err.splitlines()[-1].startswith("demo: 2/2 prompts (100%), done in")
    assert run_demo(prompts=1, faults=False, quiet=True) == 0
    out = capsys.readouterr()
    assert "silently wrong" not in out.out and out.err == ""
