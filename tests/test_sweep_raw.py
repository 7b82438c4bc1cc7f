"""The default sweep's raw-storage cells and faults in the quality windows: raw storage
really returns wrong KV (nothing verifies it), broken windows (non-finite scores) are counted
with an interval instead of being dropped, the summary says only what was measured, and the
figures draw intervals and zero-event upper bounds as such."""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

import numpy as np
import pytest

from rkv.errors import ConfigError
from rkv.eval.faults.campaign import wilson
from rkv.eval.quality import t_quantile
from rkv.eval.sweep import cells
from rkv.eval.sweep.cell_campaign import reliability
from rkv.eval.sweep.report import summary
from rkv.eval.sweep.report_rows import settings as pooled
from rkv.eval.sweep.spec import load_sweep, parse_sweep, quality_multiplier

# -- the default sweep -------------------------------------------------------------------------


def test_default_sweep_has_raw_planned_cells_and_faulty_quality_windows() -> None:
    s = load_sweep("default")
    presets = {c["preset"] for c in s.cells}
    raw = [c for c in s.cells if c["code"] == "raw"]
    assert {c["preset"] for c in raw} == presets and len(raw) == len(presets)
    assert all(c["bits"] == 16 for c in raw)
    assert any(c["placement"] is not None for c in s.cells)
    for c in s.cells:
        # every quality window injects faults well above the campaigns' rates
        assert quality_multiplier(c) > c["ber_multiplier"], c["preset"]
    assert len(s.cells) <= 60      # the main job stays a few minutes on 2 cores


def test_quality_multiplier_table_is_checked() -> None:
    base = {"sweep": {"name": "q", "metrics": ["quality"]},
            "axes": {"preset": ["raw-ber"], "code": ["none"], "ber_multiplier": [10.0]}}
    s = parse_sweep({**base, "quality": {"ber_multiplier": {"raw-ber": 50}}})
    assert quality_multiplier(s.cells[0]) == 50.0
    assert quality_multiplier(parse_sweep(base).cells[0]) == 10.0       # the cell's own
    assert "ber_multiplier" not in parse_sweep(base).cells[0]["settings"]["quality"]
    with pytest.raises(ConfigError, match=r"quality\.ber_multiplier\.nvme-tlc"):
        parse_sweep({**base, "quality": {"ber_multiplier": {"nvme-tlc": 5}}})
    with pytest.raises(ConfigError, match=r"quality\.ber_multiplier\.raw-ber"):
        parse_sweep({**base, "quality": {"ber_multiplier": {"raw-ber": 0}}})


# -- raw storage is really unverified ------------------------------------------------------------
def _cell(code: str, metrics: list[str], ber: float = 1e-5) -> dict[str, Any]:
    s = parse_sweep({"sweep": {"name": "raw", "metrics": metrics},
                     "axes": {"preset": ["raw-ber"], "bits": [16], "code": [code]},
                     "params": {"raw-ber": {"ber": ber}},
                     "reliability": {"trials": 3, "blocks": 2, "sampling": "direct"},
                     "quality": {"windows": 1, "prefix": 16, "scored": 4}})
    return dict(s.cells[0])


def test_raw_cell_returns_silently_wrong_blocks() -> None:
    """A campaign of raw storage under silent bit flips: the wrong blocks come back
    unflagged (SDC). Verified storage under the same faults returns none."""
    raw = reliability(_cell("raw", ["reliability"]))
    assert raw["rates"]["sdc"]["n"] == 6 and raw["rates"]["due"]["n"] == 0
    chk = reliability(_cell("none", ["reliability"]))
    assert chk["rates"]["sdc"]["n"] == 0 and chk["rates"]["due"]["n"] == 6


def test_raw_quality_transform_hands_wrong_kv_to_the_model() -> None:
    """What the quality windows of a raw cell get: the stored KV with the flips in it, and
    the window log says so; rkv's checksum-only cell returns nothing wrong (a DUE)."""
    rng = np.random.default_rng(0)
    kv = rng.standard_normal((2, 2, 16, 2, 16)).astype(np.float32)
    tokens = list(range(16))
    raw = cells.WindowLog(cells._transform(_cell("raw", ["quality"], ber=1e-3)), exact=True)
    out, report = raw(kv, tokens)
    assert out is not None and out.shape == kv.shape and not np.array_equal(out, kv)
    assert raw.wrong == [True] and report["flipped_bits"] > 0 and report["faulted_blocks"]
    chk = cells.WindowLog(cells._transform(_cell("none", ["quality"], ber=1e-3)), exact=True)
    got, rep = chk(kv, tokens)
    assert got is None and chk.wrong == [False] and rep["due_blocks"] >= 1


# -- broken windows -------------------------------------------------------------------------------
def test_broken_windows_are_counted_not_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the real evaluate on a tiny model: windows whose returned KV holds inf get
    non-finite scores; they are counted (with a Wilson interval) and KL is over the rest."""
    from rkvtest import tiny_llama

    model = tiny_llama()
    wins = tuple(tuple(int(t) for t in np.random.default_rng(i).integers(0, 97, 40))
                 for i in range(4))
    calls = {"n": 0}

    def poison_two(kv: np.ndarray, tokens: list[int]) -> tuple[np.ndarray, dict[str, int]]:
        calls["n"] += 1
        out = kv.copy()
        if calls["n"] in (2, 4):            # an exponent flip's worth: inf in one key
            out[0, 0, 3, 0, 0] = np.inf
            return out, {"faulted_blocks": 1}
        return out, {}

    monkeypatch.setattr(cells, "smollm2", lambda threads: (model, None))
    monkeypatch.setattr(cells, "_windows", lambda *a: wins)
    monkeypatch.setattr(cells, "_transform", lambda cell: poison_two)
    q = cells.quality(_cell("raw", ["quality"]))
    lo, hi = wilson(2, 4)
    assert q["broken"] == {"n": 2, "total": 4, "rate": 0.5, "lo": lo, "hi": hi}
    assert q["finite_windows"] == 2 and q["faulted_windows"] == 2
    assert q["wrong_kv_windows"] == 2                 # inf != what was stored
    assert q["kl"]["mean"] is not None and math.isfinite(q["kl"]["mean"])
    assert q["kl"]["mean"] == pytest.approx(0.0, abs=1e-9)   # the two intact windows
    assert [w["broken"] for w in q["per_window"]] == [False, True, False, True]


# -- the report says what was measured -----------------------------------------------------------
def _rate(n: int, total: int = 40) -> dict[str, Any]:
    lo, hi = wilson(n, total)
    return {"n": n, "rate": n / total, "lo": lo, "hi": hi}


def row(code: str, bits: int = 16, *, sdc: int = 0, due: int = 0, broken: int = 0,
        wrong: int | None = 0, kl: float | None = 0.001, seed: int = 0,
        tier: str = "dram", preset: str = "raw-ber") -> dict[str, Any]:
    config = {"tier": tier, "preset": preset, "params": {}, "ber_multiplier": 1000.0,
              "bits": bits, "code": code, "layout": {}, "placement": None, "seed": seed,
              "metrics": ["reliability", "quality", "cost"]}
    key = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]
    lo, hi = wilson(broken, 4)
    iv = None if kl is None else {"mean": kl, "lo": kl / 2, "hi": kl * 2}
    return {
        "key": key, "sweep": "t", "config": config, "version": "t", "timings": {},
        "reliability": {"blocks": 4, "trials": 10, "analytic": {"p_due": None, "p_sdc": None},
                        "rates": {"corrected": _rate(40 - sdc - due), "due": _rate(due),
                                  "sdc": _rate(sdc), "degraded": _rate(0)}},
        "quality": {"windows": 4, "text": "topics", "ber_multiplier": 2000.0,
                    "ppl": iv or {"mean": None, "lo": None, "hi": None}, "ppl_ref": 20.0,
                    "kl": iv or {"mean": None, "lo": None, "hi": None},
                    "top1": {"mean": 1.0, "lo": 1.0, "hi": 1.0}, "due_blocks": due // 10,
                    "recomputed_tokens": 256 * (due // 10), "finite_windows": 4 - broken,
                    "broken": {"n": broken, "total": 4, "rate": broken / 4, "lo": lo, "hi": hi},
                    "faulted_windows": 4, "recomputed_windows": due // 10,
                    "corrected_windows": 0, "degraded_blocks": 0, "wrong_kv_windows": wrong},
        "cost": {"bytes_per_token": 23040.0 * bits / 16 * (1.0 if code == "raw" else 1.1),
                 "raw_bytes_per_token": 23040.0, "overhead": 0.0, "put_gbps": None,
                 "get_gbps": None}}


def rows() -> list[dict[str, Any]]:
    return [row("raw", sdc=40, broken=1, wrong=4, kl=0.8), row("none", due=40, kl=0.0),
            row("rs(255,239)", kl=0.0), row("rs(255,239)", bits=4, wrong=None, kl=0.004),
            row("raw", tier="nvme", preset="nvme-tlc", due=40, wrong=0, kl=0.0),
            row("none", tier="nvme", preset="nvme-tlc", due=40, kl=0.0)]


def test_summary_states_measured_raw_and_rkv_outcomes_only() -> None:
    text = summary(rows())
    assert "would have" not in text and "would" not in text
    assert "4-bit (Q4_1)" in text
    lines = text.splitlines()
    raw = next(i for i, ln in enumerate(lines) if ln.strip().startswith("raw storage, 16 bits"))
    assert "SDC 1 [" in lines[raw] and "(40/40)" in lines[raw]
    assert "4/4 met faults" in lines[raw + 1] and "4 returned wrong KV" in lines[raw + 1]
    assert f"broken 1/4 [{wilson(1, 4)[0]:.2g}" in lines[raw + 1]
    assert "over 3 finite window(s)" in lines[raw + 1]
    assert any(ln.strip().startswith("rkv 16b chk: SDC 0/40") for ln in lines)
    assert "dram/raw-ber" in text                  # a non-default preset is its own panel
    assert lines[-1] == ("raw storage returned 40 silently wrong block(s) in 80 "
                         "fault-injected block reads, and wrong KV in 4 of 8 quality "
                         "windows (1 broken)")


def test_broken_windows_keep_a_setting_off_the_safe_list() -> None:
    rs = [r for r in rows() if r["config"]["code"] == "rs(255,239)"]
    rs[0]["quality"]["broken"] = {"n": 1, "total": 4, "rate": 0.25, "lo": 0.05, "hi": 0.7}
    text = summary(rs)
    assert "cheapest with no SDC seen and KL < 0.01: 4 bits" in text


def test_seeds_pool_with_the_t_quantile() -> None:
    a, b = row("none", kl=0.01, seed=0), row("none", kl=0.03, seed=1)
    for r in (a, b):
        r["quality"]["kl"]["lo"] = r["quality"]["kl"]["hi"] = r["quality"]["kl"]["mean"]
    kl = pooled([a, b])[0].kl
    assert kl is not None
    half = t_quantile(0.975, 1) * math.sqrt(2 * 0.01 ** 2) / math.sqrt(2)
    assert kl.hi - kl.mean == pytest.approx(half) and half > 0.1      # 12.7, not 1.96


# -- the figures ----------------------------------------------------------------------------------
def test_figures_draw_intervals_and_distinct_upper_bounds() -> None:
    from matplotlib.collections import PathCollection
    from matplotlib.container import ErrorbarContainer
    from matplotlib.lines import Line2D

    from rkv.eval.sweep.report_plot import (
        GID_BOUND,
        GID_CARET,
        GID_MEASURED,
        _plt,
        figure_pareto,
        figure_reliability,
    )

    plt = _plt()
    sets = pooled(rows())
    for draw in (figure_pareto, figure_reliability):
        fig = draw(plt, sets, set())
        try:
            for ax in [a for a in fig.axes if a.get_visible()]:
                assert any(isinstance(c, ErrorbarContainer) for c in ax.containers), draw
            if draw is figure_reliability:
                ax = fig.axes[0]
                colls = [c for c in ax.collections if isinstance(c, PathCollection)]
                bounds = [c for c in colls if c.get_gid() == GID_BOUND]
                measured = [c for c in colls if c.get_gid() == GID_MEASURED]
                assert bounds and measured
                for c in bounds:           # open, grey: not the colour of a measured rate
                    assert len(c.get_facecolors()) == 0 or c.get_facecolors()[0][3] == 0
                    assert tuple(c.get_edgecolors()[0][:3]) == pytest.approx((0.45,) * 3)
                for c in measured:
                    assert c.get_facecolors()[0][3] > 0
                    assert tuple(c.get_facecolors()[0][:3]) != pytest.approx((0.45,) * 3)
                carets = [ln for ln in ax.get_lines() if isinstance(ln, Line2D)
                          and ln.get_gid() == GID_CARET and ln.get_marker() == 7]
                assert len(carets) == len(bounds)
                # raw first, then the codes: the group names are drawn under the axis
                names = [t.get_text() for t in ax.texts]
                assert names[:2] == ["raw", "chk"]
        finally:
            plt.close(fig)


def test_kept_references_are_not_changed_by_a_transform() -> None:
    """The sweep's cells share each window's reference pass; a transform that writes into
    the KV it is given must not change what the next cell is compared with."""
    from rkvtest import tiny_llama

    from rkv.eval.quality import evaluate

    model = tiny_llama()
    wins = [list(np.random.default_rng(i).integers(0, 97, 40)) for i in range(2)]

    def in_place(kv: np.ndarray, tokens: list[int]) -> tuple[np.ndarray, dict[str, int]]:
        kv += 0.5
        return kv, {}

    first = evaluate(model, wins, in_place, prefix=32, attention=False)
    again = evaluate(model, wins, in_place, prefix=32, attention=False)
    assert first.per_window == again.per_window and first.kl > 0
    clean = evaluate(model, wins, lambda kv, t: (kv, {}), prefix=32, attention=False)
    assert clean.kl == 0.0
