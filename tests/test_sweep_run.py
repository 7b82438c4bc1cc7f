"""Running sweeps: crash-safe results, resume after a killed sweep (only the missing cells
run, the others' rows unchanged), the same rows on the serial, process and Ray executors,
and the command line. Cells are cheap: raw-BER faults on 32-token blocks, reliability and
cost only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rkv.cli import main
from rkv.eval.sweep.results import ResultsError, ResultsFile, read_rows
from rkv.eval.sweep.run import run_sweep
from rkv.eval.sweep.spec import Sweep, parse_sweep

CHEAP: dict[str, Any] = {
    "sweep": {"name": "cheap", "metrics": ["reliability", "cost"], "seeds": [0, 1]},
    "axes": {"preset": ["raw-ber"], "bits": [16, 4], "code": ["none", "crc32c"],
             "layout": [{"chunk_tokens": 32}]},
    "params": {"raw-ber": {"ber": [1e-6, 1e-5]}},
    "reliability": {"trials": 2, "blocks": 2},
    "cost": {"chunks": 1, "repeats": 1},
}
#: What is measured rather than computed: excluded when rows are compared.
MEASURED = ("timings", "version")


def cheap(tmp_path: Path, **over: Any) -> Sweep:
    data = {**CHEAP, **over, "sweep": {**CHEAP["sweep"], **over.get("sweep", {}),
                                       "results": str(tmp_path / "r.jsonl")}}
    return parse_sweep(data)


def comparable(row: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in row.items() if k not in MEASURED}
    if out.get("cost"):
        out["cost"] = {k: v for k, v in out["cost"].items() if not k.endswith("_gbps")}
    return out


class Killed(Exception):
    pass


def kill_after(n: int) -> Any:
    seen = []

    def hook(row: dict[str, Any]) -> None:
        seen.append(row["key"])
        if len(seen) == n:
            raise Killed

    return hook


# -- results file ----------------------------------------------------------------------------
def row(key: str) -> dict[str, Any]:
    return {"key": key, "sweep": "s", "config": {}, "version": "v", "timings": {},
            "reliability": None, "quality": None, "cost": None}


def test_append_and_read(tmp_path: Path) -> None:
    rf = ResultsFile(tmp_path / "r.jsonl")
    rf.append(row("a"))
    rf.append(row("b"))
    rf.append({**row("a"), "version": "w"})           # a key seen twice keeps its last row
    assert [r["key"] for r in read_rows(rf.path)] == ["a", "b"]
    assert ResultsFile(rf.path).rows["a"]["version"] == "w"


@pytest.mark.parametrize("tail", [b'{"key": "c", "swe', b'{"key": "c"}', b"\x00\x00\x00",
                                  b'{"key": "c", "swe\n'])
def test_a_torn_last_line_is_dropped(tmp_path: Path, tail: bytes) -> None:
    p = tmp_path / "r.jsonl"
    rf = ResultsFile(p)
    rf.append(row("a"))
    rf.append(row("b"))
    good = p.read_bytes()
    with open(p, "ab") as fh:
        fh.write(tail)
    assert [r["key"] for r in read_rows(p)] == ["a", "b"]
    assert p.read_bytes() == good + tail             # readers leave the file alone
    again = ResultsFile(p)                           # the runner truncates the torn line
    assert again.torn and list(again.rows) == ["a", "b"] and p.read_bytes() == good
    again.append(row("c"))
    assert [r["key"] for r in read_rows(p)] == ["a", "b", "c"]


@pytest.mark.parametrize("bad", [b"not json", b'{"key": "x"}', b"[1, 2]"])
def test_a_corrupt_line_elsewhere_is_an_error_naming_it(tmp_path: Path, bad: bytes) -> None:
    p = tmp_path / "r.jsonl"
    lines = [json.dumps(row("a")).encode(), bad, json.dumps(row("b")).encode()]
    p.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(ResultsError, match=r"r\.jsonl:2: "):
        ResultsFile(p)


# -- resume ----------------------------------------------------------------------------------
def test_resume_after_a_killed_sweep_runs_only_the_missing_cells(tmp_path: Path) -> None:
    sweep = cheap(tmp_path)
    n = len(sweep.cells)
    assert n == 16
    with pytest.raises(Killed):
        run_sweep(sweep, executor="serial", progress=False, on_row=kill_after(5))
    first = {r["key"]: r for r in read_rows(sweep.results)}
    assert len(first) == 5
    # ... and the run was killed while appending its 6th row: a torn last line.
    with open(sweep.results, "ab") as fh:
        fh.write(json.dumps(row("f" * 16))[:40].encode())
    resumed = run_sweep(sweep, executor="serial", progress=False)
    assert resumed.torn and resumed.skipped == 5 and len(resumed.ran) == n - 5
    assert set(resumed.ran).isdisjoint(first)
    assert len(resumed.rows) == n == len(read_rows(sweep.results))
    assert [r["key"] for r in resumed.rows] == sweep.cell_keys()
    for key, r in first.items():                     # the rows before the kill are kept
        assert ResultsFile(sweep.results).rows[key] == r
    # An uninterrupted sweep gives the same rows (same seeds) for every cell.
    fresh = run_sweep(sweep, executor="serial", progress=False,
                      results=tmp_path / "fresh.jsonl")
    assert [comparable(r) for r in fresh.rows] == [comparable(r) for r in resumed.rows]
    # Nothing left to do; a new axis value runs only its new cells.
    assert run_sweep(sweep, executor="serial", progress=False).ran == []
    wider = cheap(tmp_path, axes={**CHEAP["axes"], "code": ["none", "crc32c", "xxh3"]})
    more = run_sweep(wider, executor="serial", progress=False)
    assert more.skipped == n and len(more.ran) == n // 2
    assert all(ResultsFile(sweep.results).rows[k]["config"]["code"] == "xxh3"
               for k in more.ran)


def test_a_sweep_killed_on_the_process_pool_resumes(tmp_path: Path) -> None:
    """Killed on the pool (its workers terminated, not drained), resumed serially: the
    missing cells run and the rows are those of an uninterrupted serial sweep."""
    sweep = cheap(tmp_path)
    with pytest.raises(Killed):
        run_sweep(sweep, executor="process", workers=2, progress=False, on_row=kill_after(3))
    done = len(read_rows(sweep.results))
    assert done == 3
    resumed = run_sweep(sweep, executor="serial", progress=False)
    assert len(resumed.ran) == len(sweep.cells) - 3 and resumed.skipped == 3
    fresh = run_sweep(sweep, executor="serial", progress=False, results=tmp_path / "f.jsonl")
    assert [comparable(r) for r in resumed.rows] == [comparable(r) for r in fresh.rows]


def test_rows_carry_config_version_and_timings(tmp_path: Path) -> None:
    sweep = cheap(tmp_path, sweep={**CHEAP["sweep"], "seeds": [3]},
                  axes={**CHEAP["axes"], "bits": [4], "code": ["crc32c"]},
                  params={"raw-ber": {"ber": 1e-3}})
    (r,) = run_sweep(sweep, executor="serial", progress=False).rows
    assert r["sweep"] == "cheap" and r["config"] == sweep.cells[0]
    assert r["config"]["seed"] == 3 and r["version"].startswith("0.1.0")
    assert set(r["timings"]) == {"reliability_s", "quality_s", "cost_s", "total_s"}
    rel = r["reliability"]
    assert rel["blocks"] == 4 and rel["trials"] == 2
    assert sum(v["n"] for v in rel["rates"].values()) == 4
    assert all(v["lo"] <= v["rate"] <= v["hi"] for v in rel["rates"].values())
    assert rel["rates"]["due"]["n"] == 4                # crc32c detects, cannot correct
    assert 0 < rel["analytic"]["p_due"] <= 1
    cost = r["cost"]
    assert cost["raw_bytes_per_token"] == 23040
    assert 0.25 < cost["bytes_per_token"] / 23040 < 0.6     # 4 bits + scales + framing
    assert cost["overhead"] == pytest.approx(cost["bytes_per_token"] / 23040 - 1)
    assert cost["put_gbps"] > 0 and cost["get_gbps"] > 0 and r["quality"] is None


def test_a_failing_cell_does_not_stop_the_others(tmp_path: Path, monkeypatch: Any) -> None:
    import rkv.eval.sweep.run as run_mod

    real = run_mod.run_cell

    def flaky(cfg: Any) -> Any:
        if cfg["seed"] == 1 and cfg["bits"] == 4:
            raise RuntimeError("boom")
        return real(cfg)

    monkeypatch.setattr(run_mod, "run_cell", flaky)
    sweep = cheap(tmp_path)
    res = run_sweep(sweep, executor="serial", progress=False)
    assert len(res.failed) == 4 and len(res.ran) == 12
    assert "boom" in next(iter(res.failed.values()))


# -- executors -------------------------------------------------------------------------------
def test_serial_and_process_give_the_same_rows(tmp_path: Path) -> None:
    sweep = cheap(tmp_path)
    rows = {}
    for name in ("serial", "process"):
        res = run_sweep(sweep, executor=name, workers=2, progress=False,
                        results=tmp_path / f"{name}.jsonl")
        assert res.executor == name and len(res.ran) == len(sweep.cells)
        rows[name] = [comparable(r) for r in res.rows]
    assert rows["serial"] == rows["process"]
    assert len({json.dumps(r, sort_keys=True) for r in rows["serial"]}) == len(sweep.cells)


def test_ray_gives_the_serial_rows(tmp_path: Path) -> None:
    """A real local Ray (num_cpus=2): its workers import rkv and run the cells as tasks."""
    pytest.importorskip("ray")
    import ray

    from rkv.eval.sweep.executors import RayExecutor

    sweep = cheap(tmp_path, params={"raw-ber": {"ber": 1e-5}})
    serial = run_sweep(sweep, executor="serial", progress=False,
                       results=tmp_path / "serial.jsonl")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        assert ray.is_initialized()
        with RayExecutor(2) as ex:
            assert ex.workers == 2
            res = run_sweep(sweep, executor=ex, progress=False, results=tmp_path / "ray.jsonl")
        assert res.executor == "ray" and len(res.ran) == len(sweep.cells) == 8
    finally:
        ray.shutdown()
    assert [comparable(r) for r in res.rows] == [comparable(r) for r in serial.rows]


# -- command line ----------------------------------------------------------------------------
def test_cli(tmp_path: Path, capsys: Any) -> None:
    f = tmp_path / "s.toml"
    f.write_text('[sweep]\nname = "c"\nmetrics = ["reliability", "cost"]\nresults = "r.jsonl"\n'
                 '[axes]\npreset = ["raw-ber"]\ncode = ["none", "crc32c"]\n'
                 'layout = [{chunk_tokens = 32}]\n'
                 '[reliability]\ntrials = 1\nblocks = 1\n[cost]\nchunks = 1\nrepeats = 1\n')
    assert main(["sweep", str(f), "--executor", "serial", "--no-report", "--quiet"]) == 0
    assert len(read_rows(tmp_path / "r.jsonl")) == 2
    assert main(["sweep", str(f), "--list"]) == 0
    out = capsys.readouterr().out
    assert out.count("done") == 2
    f.write_text('[axes]\nbitz = [4]\n')
    assert main(["sweep", str(f)]) == 2
    assert "axes: unknown key(s) bitz" in capsys.readouterr().err
    assert main(["sweep", str(f), "--executor", "process", "--ray-address", "auto"]) == 2


def test_conditional_rates_keep_their_interval(tmp_path: Path) -> None:
    """Under conditional sampling every block meets a fault; with a checksum only every one
    is a DUE (k = n), and the scaled interval still holds its rate."""
    sweep = cheap(tmp_path, sweep={"seeds": [0]},
                  axes={**CHEAP["axes"], "bits": [16], "code": ["none"]},
                  params={"raw-ber": {"ber": 1e-9}},
                  reliability={"trials": 3, "blocks": 2, "sampling": "conditional"})
    (r,) = run_sweep(sweep, executor="serial", progress=False).rows
    rel = r["reliability"]
    assert rel["sampling"] == "conditional" and rel["rates"]["due"]["n"] == 6
    assert 0 < rel["p_any_error"] < 1e-3
    assert rel["rates"]["due"]["rate"] == pytest.approx(rel["p_any_error"])
    assert all(v["lo"] <= v["rate"] <= v["hi"] for v in rel["rates"].values())
