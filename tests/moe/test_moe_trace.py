"""Routing traces (rkv.moe.trace) and ``rkv moe trace``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rkv.errors import InputError
from rkv.moe.trace import (
    MoETraceWriter,
    TokenRoute,
    TraceHeader,
    read_moe_trace,
    write_moe_trace,
)

HEADER = {"format": "rkv-moe-trace", "version": 1, "model": "tiny", "fingerprint": "ab12",
          "layers": 3, "experts": 4, "top_k": 2, "expert_bytes": 100}
TOKENS = [[[0, 1], [2, 3], [3, 0]], [[1, 2], [0, 3], [2, 1]]]
SCORES = [[[0.5, 0.25], [1.0, -2.0], [3.0, 2.0]], [[0.0, -0.5], [7.0, 1.0], [1.0, 0.5]]]


def lines(path: Path, *objs: Any) -> Path:
    path.write_text("".join((o if isinstance(o, str) else json.dumps(o)) + "\n"
                            for o in objs), encoding="utf-8")
    return path


def read_all(path: Path) -> tuple[TraceHeader, list[TokenRoute]]:
    h, it = read_moe_trace(path)
    return h, list(it)


def test_round_trip(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    with MoETraceWriter(p, HEADER) as w:
        assert not p.exists()                       # written atomically on close
        w.write(TOKENS[0], SCORES[0])
        w.write(TOKENS[1], hints=[[], [0, 1, 2], [3]])
    assert p.read_text().splitlines()[0] == json.dumps(HEADER, separators=(",", ":"))
    h, routes = read_all(p)
    assert h.to_json() == HEADER
    assert [r.t for r in routes] == [0, 1]
    assert routes[0].layers == ((0, 1), (2, 3), (3, 0))
    assert routes[0].scores == ((0.5, 0.25), (1.0, -2.0), (3.0, 2.0))
    assert routes[1].scores is None
    assert routes[0].hints is None and routes[1].hints == ((), (0, 1, 2), (3,))
    q = tmp_path / "q.jsonl"
    assert write_moe_trace(q, h, routes) == 2
    assert read_all(q) == (h, routes)
    assert list(tmp_path.glob("*.tmp")) == []


def test_writer_rejects_bad_tokens_and_leaves_no_file(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    with pytest.raises(InputError, match="out of range"), MoETraceWriter(p, HEADER) as w:
        w.write(TOKENS[0])
        w.write([[0, 4], [0, 1], [0, 1]])
    assert not p.exists() and list(tmp_path.iterdir()) == []
    with pytest.raises(InputError):
        MoETraceWriter(p, {**HEADER, "top_k": 9})
    with pytest.raises(InputError), MoETraceWriter(p, HEADER) as w:
        w.write(TOKENS[0], [[float("nan"), 0.0]] * 3)
    with pytest.raises(InputError):
        MoETraceWriter(tmp_path / "no" / "dir" / "t.jsonl", HEADER)


BAD_HEADERS: list[Any] = [
    {**HEADER, "format": "other"},
    {**HEADER, "version": 2},
    {**HEADER, "version": True},
    {**HEADER, "model": ""},
    {**HEADER, "model": 3},
    {**HEADER, "fingerprint": "XYZ"},
    {**HEADER, "fingerprint": ""},
    {**HEADER, "layers": 0},
    {**HEADER, "experts": -1},
    {**HEADER, "experts": 2.0},
    {**HEADER, "top_k": 5},
    {**HEADER, "top_k": True},
    {**HEADER, "expert_bytes": 0},
    {**HEADER, "extra": 1},
    {k: v for k, v in HEADER.items() if k != "top_k"},
    [HEADER],
    "not json",
    "",
    '{"format": "rkv-moe-trace", "format": "rkv-moe-trace"}',
]


@pytest.mark.parametrize("bad", BAD_HEADERS)
def test_bad_header(tmp_path: Path, bad: Any) -> None:
    p = lines(tmp_path / "t.jsonl", bad, {"t": 0, "layers": TOKENS[0]})
    with pytest.raises(InputError, match=r"t\.jsonl:1"):
        read_moe_trace(p)


BAD_TOKENS: list[Any] = [
    {"t": 1, "layers": TOKENS[0]},                       # t must count from 0
    {"t": -1, "layers": TOKENS[0]},
    {"t": "0", "layers": TOKENS[0]},
    {"t": False, "layers": TOKENS[0]},
    {"layers": TOKENS[0]},
    {"t": 0},
    {"t": 0, "layers": TOKENS[0][:2]},                   # wrong number of layer lists
    {"t": 0, "layers": [*TOKENS[0], [0, 1]]},
    {"t": 0, "layers": [[0], [1, 2], [2, 3]]},            # not top_k entries
    {"t": 0, "layers": [[0, 4], [1, 2], [2, 3]]},         # out of range
    {"t": 0, "layers": [[0, -1], [1, 2], [2, 3]]},
    {"t": 0, "layers": [[1, 1], [1, 2], [2, 3]]},         # repeated
    {"t": 0, "layers": [[0, 1.0], [1, 2], [2, 3]]},
    {"t": 0, "layers": [[0, True], [1, 2], [2, 3]]},
    {"t": 0, "layers": [[0, None], [1, 2], [2, 3]]},
    {"t": 0, "layers": "0,1"},
    {"t": 0, "layers": [0, 1, 2]},
    {"t": 0, "layers": TOKENS[0], "scores": SCORES[0][:2]},
    {"t": 0, "layers": TOKENS[0], "scores": [[1.0], [1.0, 2.0], [1.0, 2.0]]},
    {"t": 0, "layers": TOKENS[0], "scores": [["a", 1.0], [1.0, 2.0], [1.0, 2.0]]},
    {"t": 0, "layers": TOKENS[0], "scores": None},
    {"t": 0, "layers": TOKENS[0], "extra": 1},
    {"t": 0, "layers": TOKENS[0], "hints": [[], [1]]},    # hints: one list per layer
    {"t": 0, "layers": TOKENS[0], "hints": [[], [4], []]},
    {"t": 0, "layers": TOKENS[0], "hints": [[], [1, 1], []]},
    {"t": 0, "layers": TOKENS[0], "hints": [[], 1, []]},
    {"t": 0, "layers": TOKENS[0], "hints": None},
    '{"t": 0, "layers": [[0, 1], [2, 3], [3, 0]], "scores": [[NaN, 1], [1, 2], [1, 2]]}',
    '{"t": 0, "layers": [[0, 1], [2, 3], [3, 0]], "scores": [[1e999, 1], [1, 2], [1, 2]]}',
    '{"t": 0, "t": 0, "layers": [[0, 1], [2, 3], [3, 0]]}',
    '{"t": 0, "layers": [[0, 1], [2, 3], [3, 0]]',
    "[" * 100000,
    "",
    "   ",
    "[]",
    "null",
]


@pytest.mark.parametrize("bad", BAD_TOKENS)
def test_bad_token_line_names_file_and_line(tmp_path: Path, bad: Any) -> None:
    # the bad line is the third token (line 4): its right t is 2
    if isinstance(bad, dict) and bad.get("t") == 0 and bad["t"] is not False:
        bad = {**bad, "t": 2}
    elif isinstance(bad, str):
        bad = bad.replace('"t": 0', '"t": 2')
    p = lines(tmp_path / "t.jsonl", HEADER, {"t": 0, "layers": TOKENS[0]},
              {"t": 1, "layers": TOKENS[1]}, bad)
    _h, it = read_moe_trace(p)
    assert next(it).t == 0 and next(it).t == 1
    with pytest.raises(InputError, match=r"t\.jsonl:4"):
        next(it)


def test_file_level_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot open"):
        read_moe_trace(tmp_path / "missing.jsonl")
    with pytest.raises(InputError, match="cannot open"):
        read_moe_trace(tmp_path)
    (tmp_path / "empty.jsonl").write_bytes(b"")
    with pytest.raises(InputError, match="empty"):
        read_moe_trace(tmp_path / "empty.jsonl")
    p = tmp_path / "latin.jsonl"
    p.write_bytes(json.dumps(HEADER).encode() + b"\n\xff\xfe\n")
    _h, it = read_moe_trace(p)
    with pytest.raises(InputError, match=r"latin\.jsonl:2: not UTF-8"):
        list(it)
    p.write_bytes(b"\xff" + json.dumps(HEADER).encode() + b"\n")
    with pytest.raises(InputError, match=r"latin\.jsonl:1"):
        read_moe_trace(p)
    # a header with no tokens is a valid (empty) trace; a final line without newline is fine
    p.write_text(json.dumps(HEADER) + "\n" + json.dumps({"t": 0, "layers": TOKENS[0]}))
    assert [r.t for r in read_all(p)[1]] == [0]
    p.write_text(json.dumps(HEADER) + "\n")
    assert read_all(p)[1] == []


@given(garbage=st.lists(st.one_of(st.text(max_size=60), st.binary(max_size=60).map(
    lambda b: b.decode("latin-1"))), min_size=1, max_size=4))
def test_random_garbage_only_raises_input_error(tmp_path_factory: pytest.TempPathFactory,
                                                garbage: list[str]) -> None:
    p = tmp_path_factory.mktemp("g") / "g.jsonl"
    body = "\n".join(garbage).encode("utf-8", errors="surrogateescape")
    for head in (json.dumps(HEADER).encode() + b"\n", b""):
        p.write_bytes(head + body)
        try:
            _h, it = read_moe_trace(p)
            for _ in it:
                pass
        except InputError:
            pass


ROUTE = st.lists(st.permutations(range(4)).map(lambda x: x[:2]), min_size=3, max_size=3)


@given(routes=st.lists(ROUTE, max_size=5),
       scores=st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=2,
                       max_size=2))
def test_random_routes_round_trip(tmp_path_factory: pytest.TempPathFactory,
                                  routes: list[list[list[int]]], scores: list[float]) -> None:
    p = tmp_path_factory.mktemp("r") / "r.jsonl"
    with MoETraceWriter(p, HEADER) as w:
        for r in routes:
            w.write(r, [scores] * 3)
    h, got = read_all(p)
    assert h.to_json() == HEADER
    assert [[list(x) for x in g.layers] for g in got] == routes
    assert all(g.scores == (tuple(scores),) * 3 for g in got)


# -- the CLI -----------------------------------------------------------------------------
def test_cli_parses_moe_trace(capsys: pytest.CaptureFixture[str]) -> None:
    from rkv.cli import main
    from rkv.cli.moe import trace_cmd

    ctx = trace_cmd.make_context("trace", ["--experts", "8", "--top-k", "2", "--topics", "3",
                                           "--out", "x.jsonl"])
    p = ctx.params
    assert (p["experts"], p["top_k"], p["topics"], p["out"], p["text"]) == (8, 2, 3,
                                                                            "x.jsonl", None)
    assert main(["moe", "trace", "--text", __file__, "--topics", "2", "--out", "x"]) == 2
    assert "exclude each other" in capsys.readouterr().err


def test_cli_trace_end_to_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``rkv moe trace --text`` with a tiny model standing in for SmolLM2."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from test_moe_model import calib, tiny_model

    from rkv.cli import main
    from rkv.moe.model import MoEModel

    class Tok:
        def __call__(self, text: str) -> Any:
            return type("Enc", (), {"input_ids": [ord(c) % 97 for c in text]})()

    def fake_load(n_experts: int, top_k: int, provider: Any = None, cache_dir: Any = None,
                  **kw: Any) -> Any:
        moe = MoEModel.build(tiny_model(), n_experts, top_k, cache_dir=tmp_path / "cache",
                             calibration=calib(), name="tiny")
        return moe, Tok()

    monkeypatch.setattr("rkv.moe.model.load_moe_smollm2", fake_load)
    text = tmp_path / "in.txt"
    text.write_text("hello, mixture of experts " * 3)
    out = tmp_path / "trace.jsonl"
    assert main(["moe", "trace", "--experts", "4", "--top-k", "2", "--text", str(text),
                 "--window", "32", "--scores", "--hints", "--out", str(out), "--quiet"]) == 0
    h, routes = read_all(out)
    assert (h.model, h.layers, h.experts, h.top_k, h.expert_bytes) == ("tiny", 3, 4, 2,
                                                                        3 * 16 * 32 * 2)
    assert len(routes) == 78 and all(r.scores is not None for r in routes)
    assert all(r.hints is not None and r.hints[0] == () and len(r.hints[1]) == 2
               for r in routes)
    assert main(["moe", "trace", "--experts", "4", "--top-k", "5", "--text", str(text),
                 "--out", str(out)]) == 2
    assert main(["moe", "trace", "--text", str(tmp_path / "nope.txt"), "--out",
                 str(out)]) == 2
