"""rkv.ui: tables in text, JSON, CSV and Markdown; progress on and off a terminal; byte sizes."""

from __future__ import annotations

import csv
import io
import json
import math
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rkv.errors import InputError
from rkv.store.results import human_bytes as results_human_bytes
from rkv.ui import Column, Progress, echo_table, human_bytes, render

ROWS = [{"outcome": "clean", "count": 0, "rate": 1.0, "ci": "[1, 1]"},
        {"outcome": "corrected", "count": 800, "rate": 1.83e-09, "ci": "[1.8e-09, 1.9e-09]"}]
COLS = [Column("outcome"), Column("count", align="right", fmt="{:,}"),
        Column("rate", "rate/block", "right", ".3g"), Column("ci", "95% CI", "right")]


def test_json_exact() -> None:
    assert json.loads(render(ROWS, COLS, fmt="json")) == ROWS
    assert render([{"a": 1, "b": "x"}], fmt="json") == '[\n  {\n    "a": 1,\n    "b": "x"\n  }\n]\n'


def test_json_non_finite_is_null() -> None:
    out = json.loads(render([{"h": math.inf, "n": math.nan, "v": [1.0, math.inf]}], fmt="json"))
    assert out == [{"h": None, "n": None, "v": [1.0, None]}]


def test_csv_exact() -> None:
    assert render(ROWS, COLS, fmt="csv") == (
        "outcome,count,rate,ci\n"
        "clean,0,1.0,\"[1, 1]\"\n"
        "corrected,800,1.83e-09,\"[1.8e-09, 1.9e-09]\"\n")
    assert render([{"a": None, "b": {"x": 1}}], fmt="csv") == 'a,b\n,"{""x"": 1}"\n'


def test_markdown_exact() -> None:
    assert render(ROWS, COLS, fmt="markdown") == (
        "| outcome | count | rate/block | 95% CI |\n"
        "|---|---:|---:|---:|\n"
        "| clean | 0 | 1 | [1, 1] |\n"
        "| corrected | 800 | 1.83e-09 | [1.8e-09, 1.9e-09] |\n")


def test_text_plain_exact() -> None:
    assert render(ROWS, COLS, title="campaign") == (
        "campaign\n"
        "outcome     count   rate/block               95% CI\n"
        "───────────────────────────────────────────────────\n"
        "clean           0            1               [1, 1]\n"
        "corrected     800     1.83e-09   [1.8e-09, 1.9e-09]\n")
    assert render(ROWS[:1], COLS, indent=2).splitlines()[0].startswith("  outcome")


def test_text_styled_has_ansi_plain_has_none() -> None:
    assert "\x1b[" in render(ROWS, COLS, plain=False)
    assert "\x1b[" not in render(ROWS, COLS)


def test_echo_off_a_terminal_is_plain() -> None:
    buf = io.StringIO()
    echo_table(ROWS, COLS, file=buf)
    assert buf.getvalue() == render(ROWS, COLS)
    buf = io.StringIO()
    echo_table(ROWS, COLS, fmt="csv", file=buf)
    assert buf.getvalue().startswith("outcome,count")


def test_wide_table_is_not_wrapped_off_a_terminal() -> None:
    row = {f"column_{i}": "x" * 30 for i in range(8)}
    lines = render([row]).splitlines()
    assert len(lines) == 3 and all(("x" * 30) in line for line in lines[2:])


def test_columns_inferred_and_missing_values() -> None:
    out = render([{"a": "x", "n": 3}, {"a": "longer", "m": 1.5}]).splitlines()
    assert out[0].split() == ["a", "n", "m"]
    assert out[2].split() == ["x", "3", "-"]
    assert out[3].split() == ["longer", "-", "1.5"]


def test_bad_format_is_an_input_error() -> None:
    with pytest.raises(InputError, match="output format must be one of"):
        render(ROWS, fmt="xml")


def test_callable_formatter_and_markup_is_literal() -> None:
    out = render([{"v": 2, "s": "[bold]x[/bold]"}],
                 [Column("v", fmt=lambda v: f"<{v}>"), Column("s")])
    assert "<2>" in out and "[bold]x[/bold]" in out


cells = st.text(st.characters(min_codepoint=32, max_codepoint=0x2FF, blacklist_characters="\x7f"),
                max_size=12)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(cells, st.integers(-10**9, 10**9)), min_size=1, max_size=6))
def test_csv_and_json_round_trip(data: list[tuple[str, int]]) -> None:
    rows = [{"name": s, "n": n} for s, n in data]
    back = list(csv.reader(io.StringIO(render(rows, fmt="csv"))))
    assert back[0] == ["name", "n"]
    assert back[1:] == [[s, str(n)] for s, n in data]
    assert json.loads(render(rows, fmt="json")) == rows
    text = render(rows)
    assert "\x1b" not in text
    assert all(str(n) in text for _, n in data)


# -- progress -------------------------------------------------------------------------------------
def test_plain_progress_lines_every_tenth() -> None:
    buf = io.StringIO()
    with Progress("campaign", 20, unit="trial", file=buf, min_gap_s=0, every_s=1e9) as p:
        for _ in range(20):
            p.update()
    lines = buf.getvalue().splitlines()
    assert len(lines) == 10
    assert lines[0].startswith("campaign: 2/20 trials (10%)") and "ETA" in lines[0]
    assert lines[-1].startswith("campaign: 20/20 trials (100%), done in")
    assert "\x1b" not in buf.getvalue()


def test_plain_progress_unknown_total() -> None:
    buf = io.StringIO()
    with Progress("sweep", None, unit="cell", file=buf, every_s=0) as p:
        p.update()
        p.update(2)
    lines = buf.getvalue().splitlines()
    assert lines[0].startswith("sweep: 1 cell,") and "elapsed" in lines[0]
    assert lines[-1].startswith("sweep: 3 cells, done in")


def test_progress_quiet_and_env_off(monkeypatch: pytest.MonkeyPatch) -> None:
    buf = io.StringIO()
    with Progress("x", 4, file=buf, quiet=True, min_gap_s=0) as p:
        p.update(4)
        p.write("hello")
    monkeypatch.setenv("RKV_PROGRESS", "off")
    with Progress("x", 4, file=buf, min_gap_s=0) as p:
        p.update(4)
    assert buf.getvalue() == ""


def test_progress_failed_run_has_no_done_line() -> None:
    buf = io.StringIO()
    with pytest.raises(RuntimeError), Progress("x", 4, file=buf, every_s=1e9) as p:
        p.update(1)
        raise RuntimeError("boom")
    assert "done" not in buf.getvalue() and buf.getvalue().startswith("x: 1/4")


def test_progress_from_pool_callbacks() -> None:
    buf = io.StringIO()
    with Progress("pool", 50, unit="task", file=buf, min_gap_s=0, every_s=1e9) as p, \
            ThreadPoolExecutor(4) as pool:
        for i in range(50):
            pool.submit(pow, i, 2).add_done_callback(lambda _f: p.update())
    assert p.n == 50
    assert buf.getvalue().splitlines()[-1].startswith("pool: 50/50 tasks (100%), done")


def test_progress_advance_to_and_total_later() -> None:
    buf = io.StringIO()
    with Progress("t", None, file=buf, min_gap_s=0, every_s=1e9) as p:
        p.advance_to(5, 10)
        p.set_total(10)
        p.advance_to(10)
    assert buf.getvalue().splitlines()[-1].startswith("t: 10/10 its (100%), done")


def test_progress_bar_on_a_terminal() -> None:
    buf = io.StringIO()
    with Progress("bar", 10, unit="trial", file=buf, tty=True) as p:
        for _ in range(10):
            p.update()
        p.write("a [message]")
    out = buf.getvalue()
    assert "10/10" in out and "ETA" in out and "a [message]" in out


# -- sizes ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(("n", "text"), [(0, "0 B"), (512, "512 B"), (1536, "1.5 KiB"),
                                         (196608, "192.0 KiB"), (2 << 30, "2.0 GiB"),
                                         (-2048, "-2.0 KiB")])
def test_human_bytes(n: int, text: str) -> None:
    assert human_bytes(n) == text
    assert results_human_bytes(n) == text


def test_progress_initial_counts_but_not_in_rate() -> None:
    buf = io.StringIO()
    with Progress("calibrate", 10, unit="layer", file=buf, min_gap_s=0, every_s=1e9,
                  initial=6) as p:
        assert p.n == 6
        p.update(2)
        p.update(2)
    lines = buf.getvalue().splitlines()
    assert lines[0].startswith("calibrate: 8/10 layers (80%)")
    assert lines[-1].startswith("calibrate: 10/10 layers (100%), done in")
    buf = io.StringIO()
    with Progress("calibrate", 10, file=buf, initial=10):
        pass                                       # all cached: one line says so
    assert buf.getvalue().startswith("calibrate: 10/10 its (100%), done in")
