"""``rkv report``: reading results files (torn tails, corrupt and hostile rows), pooling seeds,
the Pareto set against a brute-force oracle, and the files the report writes (with
matplotlib, and without it: the markdown and a one-line hint)."""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rkv.cli import main
from rkv.errors import InputError
from rkv.eval.faults.campaign import wilson
from rkv.eval.sweep.report import load_rows, pareto, summary, write_report
from rkv.eval.sweep.report_rows import TornLineWarning, check_row
from rkv.eval.sweep.report_rows import settings as pooled
from rkv.eval.sweep.results import ResultsError

N = 100  # blocks per row


def _rate(n: int, total: int = N, scale: float = 1.0) -> dict[str, Any]:
    lo, hi = wilson(n, total)
    return {"n": n, "rate": scale * n / total, "lo": scale * lo, "hi": scale * hi}


def row(tier: str = "nvme", bits: int = 4, code: str = "rs(255,223)", seed: int = 0, *,
        overhead: float = 0.3, kl: float | None = 0.005, sdc: int = 0, due: int = 0,
        windows: int = 12, scale: float = 1.0, reliability: bool = True,
        cost: bool = True, **cfg: Any) -> dict[str, Any]:
    """A synthetic result row in the schema ``rkv sweep`` writes."""
    preset = {"dram": "dram-ddr5", "cxl": "cxl"}.get(tier, "nvme-tlc")     # the tier's own
    config = {"tier": tier, "preset": preset, "params": {}, "ber_multiplier": 1000.0,
              "bits": bits, "code": code, "layout": {}, "placement": None, "seed": seed,
              "metrics": ["reliability", "quality", "cost"], **cfg}
    key = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]
    rates = {"corrected": _rate(N - sdc - due, N, scale), "due": _rate(due, N, scale),
             "sdc": _rate(sdc, N, scale)}
    qual = None if kl is None else {
        "windows": windows, "text": "topics,docs", "ppl": {"mean": 20.0, "lo": 19.0, "hi": 21.0},
        "ppl_ref": 20.0, "kl": {"mean": kl, "lo": kl * 0.8, "hi": kl * 1.2 + 1e-6},
        "top1": {"mean": 0.95, "lo": 0.93, "hi": 0.97}, "due_blocks": 0, "recomputed_tokens": 0,
        "delta_ppl": {"mean": kl, "lo": -0.1, "hi": kl + 0.1}}
    return {"key": key, "sweep": "t", "config": config, "version": "0.1.0+gtest",
            "timings": {"total_s": 0.5},
            "reliability": {"blocks": 10, "trials": 10, "rates": rates,
                            "analytic": {"p_due": 1e-6, "p_sdc": None}} if reliability else None,
            "quality": qual,
            "cost": {"bytes_per_token": 1000.0 * overhead, "raw_bytes_per_token": 1000.0,
                     "overhead": overhead, "put_gbps": 1.0, "get_gbps": 2.0} if cost else None}


def write(path: Path, rows: list[dict[str, Any]], tail: str = "") -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + tail)
    return path


def grid() -> list[dict[str, Any]]:
    out = []
    for tier in ("dram", "nvme"):
        for bits, kl in ((16, 0.0), (8, 2e-5), (4, 0.005), (2, 0.17)):
            for code, par, due in (("none", 0.0, 40), ("rs(255,223)", 0.14, 0),
                                   ("bch(m=13,t=40)", 0.07, 2), ("shardrs(k=16,m=2)", 0.2, 5)):
                for seed in (0, 1):
                    out.append(row(tier, bits, code, seed, overhead=bits / 16 * (1 + par),
                                   kl=kl, due=due, sdc=int(bits == 2 and code == "none")))
    return out


# -- the Pareto set against a brute-force oracle --------------------------------------------------
def _objs(r: dict[str, Any], rate: str) -> tuple[float, ...]:
    rel = r["reliability"]["rates"]
    pick = "hi" if rate == "hi" else "rate"
    return (r["cost"]["overhead"], r["quality"]["kl"]["mean"], rel["sdc"][pick], rel["due"][pick])


def _dom(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return all(x <= y for x, y in zip(a, b, strict=True)) and a != b


cells = st.tuples(st.sampled_from(["dram", "nvme"]), st.sampled_from([2, 4, 8, 16]),
                  st.sampled_from(["none", "rs(255,223)", "bch(m=13,t=8)"]),
                  st.sampled_from([0.25, 0.5, 1.0]), st.sampled_from([0.0, 0.01, 0.2]),
                  st.sampled_from([0, 1, 3]), st.sampled_from([0, 5]))


@settings(max_examples=60, deadline=None)
@given(st.lists(cells, min_size=1, max_size=24, unique_by=lambda c: c[:3]),
       st.sampled_from(["hi", "point"]))
def test_pareto_matches_brute_force(cs: list[tuple[Any, ...]], rate: str) -> None:
    rows = [row(t, b, c, overhead=o, kl=k, sdc=s, due=d) for t, b, c, o, k, s, d in cs]
    got = {p["key"] for p in pareto(rows, rate=rate)}
    keyed = {p.key: r for p, r in zip(pooled(rows), rows, strict=True)}
    oracle = {k for k, r in keyed.items()
              if not any(_dom(_objs(x, rate), _objs(r, rate)) for x in rows
                         if x["config"]["tier"] == r["config"]["tier"])}
    assert got == oracle
    for k, r in keyed.items():      # every setting left out is dominated by one returned
        if k not in got:
            assert any(_dom(_objs(keyed[g], rate), _objs(r, rate)) for g in got
                       if keyed[g]["config"]["tier"] == r["config"]["tier"])


def test_pareto_known_front_and_rate_choice() -> None:
    rows = [row(code="a", overhead=1.0, kl=0.0), row(code="b", overhead=0.5, kl=0.0),
            row(code="c", overhead=0.5, kl=0.0, due=3), row(code="d", overhead=0.2, kl=0.1),
            row(code="e", overhead=0.2, kl=0.2), row("dram", code="e", overhead=0.2, kl=0.2)]
    assert [p["config"]["code"] for p in pareto(rows)] == ["e", "d", "b"]
    assert [p["tier"] for p in pareto(rows)] == ["dram", "nvme", "nvme"]
    # Seen once in 1000 blocks has a lower upper bound than none seen in 100: the 95 % upper
    # bound prefers the larger sample, the point estimate the zero.
    big = row(code="x", sdc=1, kl=0.0, overhead=0.5) | {"key": "f" * 16}
    big["reliability"]["rates"]["sdc"] = _rate(1, 1000) | {"n": 1}
    big["reliability"]["rates"]["corrected"] = _rate(999, 1000)
    small = row(code="y", kl=0.0, overhead=0.5)
    assert [p["config"]["code"] for p in pareto([big, small], rate="hi")] == ["x"]
    assert [p["config"]["code"] for p in pareto([big, small], rate="point")] == ["y"]
    with pytest.raises(InputError):
        pareto(rows, rate="mean")


def test_missing_metric_is_left_out_not_guessed() -> None:
    rows = [row(code="a", overhead=1.0, kl=None), row(code="b", overhead=0.5, kl=0.3)]
    # quality missing for one setting: KL is not compared in that tier, so b dominates a.
    assert [p["config"]["code"] for p in pareto(rows)] == ["b"]
    rows = [row(code="a", reliability=False), row(code="b", reliability=False, overhead=0.1)]
    assert [p["config"]["code"] for p in pareto(rows)] == ["b"]


# -- seeds ----------------------------------------------------------------------------------------
def test_seeds_are_pooled_into_one_setting() -> None:
    rows = [row(seed=0, sdc=1, kl=0.01, windows=12, scale=1e-3),
            row(seed=1, sdc=0, kl=0.02, windows=36, scale=1e-3),
            row(code="none", seed=0)]
    sets = pooled(rows)
    assert len(sets) == 2
    s = sets[0]
    assert s.seeds == (0, 1) and s.rows == 2 and s.windows == 48
    assert s.sdc is not None and s.sdc.pooled and (s.sdc.n, s.sdc.total) == (1, 2 * N)
    lo, hi = wilson(1, 2 * N)
    assert math.isclose(s.sdc.rate, 1e-3 / (2 * N)) and math.isclose(s.sdc.hi, 1e-3 * hi)
    assert math.isclose(s.sdc.lo, 1e-3 * lo)
    assert s.kl is not None and math.isclose(s.kl.mean, (0.01 * 12 + 0.02 * 36) / 48)
    assert s.kl.lo < s.kl.mean < s.kl.hi
    assert s.delta_ppl is not None and math.isclose(s.delta_ppl.mean, s.kl.mean)
    front = pareto(rows)
    assert len({p["key"] for p in front}) == len(front)
    assert [p["seeds"] for p in front if p["config"]["code"] == "rs(255,223)"] == [[0, 1]]


def test_rates_not_of_campaign_form_are_averaged() -> None:
    a, b = row(seed=0, due=2), row(seed=1, due=4)
    b["reliability"]["rates"]["due"] = {"n": 4, "rate": 0.5, "lo": 0.1, "hi": 0.9}
    s = pooled([a, b])[0]
    assert s.due is not None and not s.due.pooled and s.due.n == 6
    assert math.isclose(s.due.hi, (wilson(2, N)[1] + 0.9) / 2)


# -- reading files ------------------------------------------------------------------------------
def test_torn_last_line_is_skipped_with_a_warning(tmp_path: Path) -> None:
    rows = grid()[:5]
    p = write(tmp_path / "r.jsonl", rows, tail=json.dumps(row(code="z"))[:40])
    with pytest.warns(TornLineWarning, match=r"r\.jsonl:6"):
        got = load_rows(p)
    assert [r["key"] for r in got] == [r["key"] for r in rows]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(load_rows(write(tmp_path / "ok.jsonl", rows))) == 5


@pytest.mark.parametrize("bad, what", [
    ("{not json", "not a JSON row"),
    ('{"key": "0000000000000000", "key": "0000000000000001"}', "not a JSON row"),
    ("[1, 2]", "row: expected an object"),
    ('{"a": NaN}', "not a JSON row"),
    ("[" * 100000 + "]" * 100000, "not a JSON row"),
])
def test_corrupt_middle_line_is_a_typed_error(tmp_path: Path, bad: str, what: str) -> None:
    rows = grid()[:3]
    text = json.dumps(rows[0]) + "\n" + bad + "\n" + json.dumps(rows[1]) + "\n"
    (tmp_path / "r.jsonl").write_text(text)
    with pytest.raises(ResultsError, match=rf"r\.jsonl:2: .*{what}") as exc:
        load_rows(tmp_path / "r.jsonl")
    assert isinstance(exc.value, InputError)


@pytest.mark.parametrize("field, value, what", [
    (("key",), "XYZ", "key"), (("config", "bits"), True, "config.bits"),
    (("config", "bits"), "RAW1e999", "config.bits"),
    (("cost", "put_gbps"), "RAW-1e999", "cost.put_gbps: -inf is not finite"),
    (("config", "tier"), "", "config.tier"),
    (("config", "seed"), "0", "config.seed"), (("config",), None, "config"),
    (("reliability", "rates", "sdc", "n"), -1, "reliability.rates.sdc.n"),
    (("reliability", "rates", "due", "hi"), 1e-9, "reliability.rates.due"),
    (("reliability", "rates", "sdc"), None, "reliability.rates.sdc"),
    (("quality", "windows"), 0, "quality.windows"), (("quality", "kl"), [], "quality.kl"),
    (("cost", "overhead"), "x", "cost.overhead"),
])
def test_hostile_fields_are_named(tmp_path: Path, field: tuple[str, ...], value: Any,
                                  what: str) -> None:
    r = row(due=3)
    d = r
    for k in field[:-1]:
        d = d[k]
    d[field[-1]] = value
    # A bad row is an error even as the last line: it parsed, so it is not torn.
    text = json.dumps(r).replace('"RAW1e999"', "1e999").replace('"RAW-1e999"', "-1e999")
    (tmp_path / "r.jsonl").write_text(json.dumps(row(code="ok")) + "\n" + text + "\n")
    with pytest.raises(ResultsError, match=rf"r\.jsonl:2: bad row: {what}"):
        load_rows(tmp_path / "r.jsonl")


def test_missing_file_and_duplicate_keys(tmp_path: Path) -> None:
    with pytest.raises(ResultsError, match="no results file"):
        load_rows(tmp_path / "nope.jsonl")
    a = row()
    b = json.loads(json.dumps(a))
    b["cost"]["overhead"] = 9.0
    with pytest.warns(UserWarning, match="appears twice"):
        got = load_rows(write(tmp_path / "r.jsonl", [a, b]))
    assert len(got) == 1 and got[0]["cost"]["overhead"] == 9.0


# -- the report -----------------------------------------------------------------------------------
def _check_figures(paths: list[Path]) -> None:
    for p in paths:
        head = p.read_bytes()[:400]
        if p.suffix == ".png":
            assert head.startswith(b"\x89PNG\r\n\x1a\n")
        else:
            assert head.startswith(b"<?xml") and b"<svg" in p.read_bytes()


def test_write_report_files_and_pareto_listing(tmp_path: Path) -> None:
    rows = grid()
    rep = write_report(rows, tmp_path / "out")
    names = sorted(p.name for p in rep.figures)
    assert names == ["pareto.png", "pareto.svg", "reliability.png", "reliability.svg"]
    assert all(p.exists() and p.stat().st_size > 1000 for p in rep.figures)
    _check_figures(rep.figures)
    md = rep.markdown.read_text()
    assert "4-bit (Q4_1)" in md and "![pareto](pareto.png)" in md
    front = pareto(rows)
    section = md.split("## Pareto-optimal settings")[1].split("## All settings")[0]
    for tier in ("dram", "nvme"):
        part = section.split(f"### {tier}")[1].split("###")[0]
        listed = {ln.split("**")[1] for ln in part.splitlines() if ln.startswith("- **")}
        assert listed == {p["label"] for p in front if p["tier"] == tier}
    assert "shardrs" not in section and "shardrs(k=16,m=2)" in md   # dominated by rs223


def test_report_with_missing_metrics_and_hostile_text(tmp_path: Path) -> None:
    rows = [row(code="a$b\\frac{|", kl=None), row(code="none", kl=None, overhead=0.1),
            row("cxl", reliability=False, cost=False)]
    rep = write_report(rows, tmp_path / "out", formats=["png"])
    assert [p.name for p in rep.figures] == ["pareto.png", "reliability.png"]
    _check_figures(rep.figures)
    md = rep.markdown.read_text()
    assert "Not measured" in md and "a$b\\\\frac{\\|" in md
    assert "no reliability measured" in rep.summary


def test_planned_and_raw_cells() -> None:
    planned = row(code="x", overhead=0.2, kl=0.001, placement={"objective": "cost"})
    planned["config"]["bits"] = planned["config"]["code"] = None
    raw = row(bits=16, code="raw", overhead=0.0, kl=None, sdc=7)
    raw["cost"]["put_gbps"] = raw["cost"]["get_gbps"] = None
    rows = [planned, raw, row(bits=16, code="none", overhead=0.01, kl=0.0, due=9)]
    sets = pooled(rows)
    assert (sets[0].bits, sets[0].code) == (None, "planned") and sets[1].put_gbps is None
    assert next(p["label"] for p in pareto(rows)).startswith("planned")
    text = summary(rows)
    assert "raw storage, 16 bits (no checksum; DUE = the medium reported the loss): SDC " \
           "0.07 [" in text
    # raw storage's SDC is not rkv's: the verdict counts rkv's settings only; raw's is
    # stated beside it, as measured.
    lines = text.splitlines()
    assert lines[-2].startswith("verdict: rkv returned no silently wrong KV in 200")
    assert lines[-1] == ("raw storage returned 7 silently wrong block(s) in 100 "
                         "fault-injected block reads")
    bad = row(placement=None)
    bad["config"]["bits"] = None
    with pytest.raises(ValueError, match=r"config\.bits"):
        check_row(bad)


def test_summary_says_what_to_use() -> None:
    text = summary(grid())
    assert "nvme (nvme-tlc; block rates at faults x1000):\n  cheapest with no SDC seen and " \
           "KL < 0.01: 4 bits + none" in text
    assert "no DUE seen): 4 bits + rs(255,223)" in text
    assert "4-bit (Q4_1)" in text and "would" not in text   # no raw cell: nothing said of raw
    assert text.splitlines()[-1].startswith("verdict: rkv returned 4 silently wrong block(s)")


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = write(tmp_path / "res.jsonl", grid(), tail='{"key": "ab')
    assert main(["report", str(p), "--format", "svg"]) == 0
    cap = capsys.readouterr()
    assert "verdict:" in cap.out and "torn last line" in cap.err
    assert (tmp_path / "res-report" / "report.md").exists()
    assert (tmp_path / "res-report" / "pareto.svg").exists()
    ok = write(tmp_path / "ok.jsonl", grid()[:4])
    for args, msg in (([str(tmp_path / "missing.jsonl")], "no results file"),
                      ([str(ok), "--format", "gif"], "figure formats"),
                      ([str(tmp_path)], "is a directory")):
        assert main(["report", *args]) == 2
        err = capsys.readouterr().err
        assert msg in err and err.count("\n") == 1
    (tmp_path / "bad.jsonl").write_text("{}\n{}\n")
    assert main(["report", str(tmp_path / "bad.jsonl")]) == 2
    assert "bad.jsonl:1: not a sweep row (missing key" in capsys.readouterr().err


# -- without matplotlib (the plots extra) ---------------------------------------------------------
# The child sees an install without matplotlib: None in sys.modules makes its import fail.
NO_MATPLOTLIB = """\
import sys
sys.modules["matplotlib"] = None
from rkv.cli import main
sys.exit(main(sys.argv[1:]))
"""
HINT = "rkv: warning: figures not drawn: matplotlib is not installed (pip install 'rkv[plots]')"


def _rkv_without_matplotlib(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", NO_MATPLOTLIB, *args], capture_output=True,
                          text=True, timeout=600, check=False)


def _only_markdown(out: Path) -> None:
    assert sorted(f.name for f in out.iterdir()) == ["report.md"]
    md = (out / "report.md").read_text()
    assert "## Pareto-optimal settings" in md and "pip install 'rkv[plots]'" in md
    assert "![" not in md


def test_report_without_matplotlib_writes_the_markdown_and_says_how(tmp_path: Path) -> None:
    p = write(tmp_path / "res.jsonl", grid())
    got = _rkv_without_matplotlib("report", str(p))
    assert got.returncode == 0, got.stderr[-2000:]
    assert got.stderr.splitlines() == [HINT]            # one line, no traceback
    assert "verdict:" in got.stdout and "figure:" not in got.stdout
    _only_markdown(tmp_path / "res-report")


def test_sweep_without_matplotlib_writes_the_markdown_and_says_how(tmp_path: Path) -> None:
    f = tmp_path / "s.toml"
    f.write_text('[sweep]\nname = "nomatplotlib"\nmetrics = ["cost"]\nresults = "r.jsonl"\n'
                 '[axes]\ntier = ["dram"]\ncode = ["none"]\n[cost]\nchunks = 1\nrepeats = 1\n')
    got = _rkv_without_matplotlib("sweep", str(f), "--executor", "serial", "-q")
    assert got.returncode == 0, got.stderr[-2000:]
    hint = [ln for ln in got.stderr.splitlines() if "rkv[plots]" in ln]
    assert hint == [f"{HINT}; then rkv report {tmp_path / 'r.jsonl'} --out "
                    f"{tmp_path / 'report'} draws them"]
    assert "Traceback" not in got.stderr and "figure:" not in got.stdout
    _only_markdown(tmp_path / "report")
