from __future__ import annotations

import io
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from rkvtest import SMALL, local_config, one_line_error, random_kv

from rkv import (
    ChecksumError,
    ConfigError,
    Engine,
    InputError,
    RkvError,
    StoreClosedError,
    TierFullError,
)
from rkv.cli import main
from rkv.format.keys import as_token_array, block_key, chunk_keys


def make_store(path: Path) -> list[int]:
    t = list(range(40))
    with Engine.open(path, local_config(16)) as e:
        e.put(t, random_kv(SMALL, 40), model=SMALL)
    return t


def test_info(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_store(tmp_path / "s")
    assert main(["info", str(tmp_path / "s")]) == 0
    out = capsys.readouterr().out
    assert "chunks       3" in out and "dram" in out and SMALL.fingerprint().hex() in out
    assert main(["info", "--json", str(tmp_path / "s")]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["chunks"] == 3 and data["tiers"]["dram"]["blocks"] == 9


def test_verify_clean_and_corrupt(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    t = make_store(tmp_path / "s")
    assert main(["verify", "--quiet", str(tmp_path / "s")]) == 0
    assert "OK" in capsys.readouterr().out
    with Engine.open(tmp_path / "s") as e:
        key = chunk_keys(as_token_array(t), SMALL.fingerprint(), 16)[2]
        rec = bytearray(e.tiers["dram"].get(block_key(key, 0)) or b"")
        from rkv.format.record import decode_record

        rec[decode_record(rec).header_bytes + 5] ^= 1
        e.tiers["dram"].put(block_key(key, 0), rec)
    assert main(["verify", "--json", str(tmp_path / "s")]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["uncorrectable"] == 1 and not data["clean"]
    assert "ChecksumError" in data["problems"][0]["error"]
    assert {"unreachable", "reclaimed", "unreadable_chunks", "usage_fixed"} <= data.keys()


def test_not_a_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", str(tmp_path / "nothing")]) == 2
    assert "not an rkv store" in capsys.readouterr().err
    assert not (tmp_path / "nothing").exists()


def test_demo_runs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--prompts", "3"]) == 0
    out = capsys.readouterr().out
    assert "every reload was byte-exact and verified" in out
    assert "prefix dedup saved" in out



@pytest.mark.parametrize("cmd", [["info"], ["info", "--json"], ["verify", "--quiet"],
                                 ["verify", "--repair", "--json"], ["destroy", "--yes"]])
def test_not_a_store_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                 cmd: list[str]) -> None:
    for path in (tmp_path / "nothing", tmp_path / "file", tmp_path / "dir"):
        if path.name == "file":
            path.write_text("x")
        elif path.name == "dir":
            path.mkdir()
            (path / "keep").write_text("x")
        assert main([*cmd, str(path)]) == 2
        assert "not an rkv store" in one_line_error(capsys)
    assert not (tmp_path / "nothing").exists() and (tmp_path / "dir" / "keep").exists()


@pytest.mark.parametrize("text", [b"trials = [1\n", b"\xff\xfe=", b"trials = 'x'\n",
                                  b"bogus = 1\n", b"fault_model = {preset = 'nope'}\n", None])
def test_bad_campaign_config_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         text: bytes | None) -> None:
    cfg = tmp_path / "campaign.toml"
    if text is not None:
        cfg.write_bytes(text)
    assert main(["campaign", "--config", str(cfg), "--quiet"]) == 2
    one_line_error(capsys)


def test_campaign_tilt(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["campaign", "--fault-model", "raw-ber", "--param", "ber=4e-7", "--protection",
            "rs(255,239)", "--trials", "2", "--blocks", "4", "--chunk-tokens", "64",
            "--kv-heads", "1", "--no-raw", "--quiet", "--tilt"]
    assert main([*argv, "auto"]) == 0
    out = capsys.readouterr().out
    assert "importance sampling" in out and "rel.err" in out
    assert main([*argv, "lots"]) == 2
    one_line_error(capsys)


def test_campaign_leads_with_the_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["campaign", "--fault-model", "raw-ber", "--param", "ber=4e-7", "--protection",
            "rs(255,239)", "--trials", "2", "--blocks", "4", "--chunk-tokens", "64",
            "--kv-heads", "1", "--quiet"]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("rkv: 0 silent corruptions")
    assert lines[1].startswith("raw storage")          # raw storage under the same faults
    assert any(line.startswith("fault model: raw-ber") for line in lines[:5])
    assert main([*argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"].startswith("rkv: 0 silent corruptions") and "raw" in doc


@pytest.mark.parametrize(("exc", "code"), [
    (ChecksumError("block 3 failed\nits checksum"), 1),
    (StoreClosedError("closed"), 2),
    (TierFullError("dram is full"), 2),
    (ConfigError("bad config"), 2),
    (InputError("bad input"), 2),
    (RkvError("something"), 2),
    (PermissionError(13, "Permission denied"), 2),
    (KeyboardInterrupt(), 130),
])
def test_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                    monkeypatch: pytest.MonkeyPatch, exc: BaseException, code: int) -> None:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise exc

    monkeypatch.setattr(Engine, "open", fail)
    assert main(["info", str(tmp_path)]) == code
    if code == 130:
        assert capsys.readouterr().err == "rkv: interrupted\n"
    else:
        one_line_error(capsys)


def test_usage_error_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info"]) == 2
    assert "Missing argument 'PATH'" in one_line_error(capsys)


def test_info_and_verify_open_read_only(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[dict[str, Any]] = []

    def fake_open(path: Any, config: Any = None, **kwargs: Any) -> Any:
        seen.append(kwargs)
        raise StoreClosedError("stop here")

    monkeypatch.setattr(Engine, "open", fake_open)
    for cmd in (["info"], ["verify", "--quiet"], ["verify", "--repair", "--quiet"]):
        assert main([*cmd, str(tmp_path)]) == 2
        one_line_error(capsys)
    assert seen == [{"create": False, "readonly": True}, {"create": False, "readonly": True},
                    {"create": False, "readonly": False}]


@dataclass
class FakeReport:
    chunks: int = 3
    blocks: int = 9
    ok: int = 9
    corrected: int = 0
    uncorrectable: int = 0
    missing: int = 0
    orphans: int = 0
    repaired: int = 0
    unreachable: int = 0
    reclaimed: int = 0
    unreadable_chunks: int = 0
    usage_fixed: int = 0
    clean: bool = True
    problems: list[tuple[str, int, str, str]] = field(default_factory=list)


class FakeEngine:
    def __init__(self, report: FakeReport) -> None:
        self.report = report

    def __enter__(self) -> FakeEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def verify(self, **kwargs: Any) -> FakeReport:
        return self.report


@pytest.mark.parametrize(("report", "code", "text"), [
    (FakeReport(reclaimed=4, usage_fixed=1), 0, "4 reclaimed; 1 usage fixed"),
    (FakeReport(unreachable=2, unreadable_chunks=1, clean=False), 1,
     "2 unreachable; 1 unreadable chunks"),
])
def test_verify_reports_new_counts(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                   monkeypatch: pytest.MonkeyPatch, report: FakeReport,
                                   code: int, text: str) -> None:
    monkeypatch.setattr(Engine, "open", lambda *a, **k: FakeEngine(report))
    assert main(["verify", "--quiet", str(tmp_path)]) == code
    out = capsys.readouterr().out
    assert text in out and ("OK" if code == 0 else "CORRUPT") in out
    assert main(["verify", "--json", str(tmp_path)]) == code
    data = json.loads(capsys.readouterr().out)
    for name in ("unreachable", "reclaimed", "unreadable_chunks", "usage_fixed"):
        assert data[name] == getattr(report, name)


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_destroy(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                 monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "s"
    make_store(path)
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))   # not a terminal: never asks
    assert main(["destroy", str(path)]) == 2
    assert "--yes" in one_line_error(capsys) and path.exists()
    monkeypatch.setattr(sys, "stdin", Tty("n\n"))
    assert main(["destroy", str(path)]) == 2
    assert "not destroyed" in one_line_error(capsys) and path.exists()
    monkeypatch.setattr(sys, "stdin", Tty("y\n"))
    assert main(["destroy", str(path)]) == 0 and not path.exists()
    make_store(path)
    assert main(["destroy", "--yes", str(path)]) == 0 and not path.exists()
    assert main(["info", str(path)]) == 2
    one_line_error(capsys)


def test_campaign_ber_multiplier_and_quality_text_checked_early(
        capsys: pytest.CaptureFixture[str]) -> None:
    """--ber-multiplier reaches the campaign's config (and a bad one is exit 2); a bad
    `rkv quality --text` is refused before the model loads."""
    assert main(["campaign", "--trials", "2", "--blocks", "1", "--ber-multiplier", "10",
                 "--json", "--no-raw", "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out)["config"]["ber_multiplier"] == 10.0
    assert main(["campaign", "--trials", "2", "--ber-multiplier", "-1", "--quiet"]) == 2
    assert "ber_multiplier" in capsys.readouterr().err
    assert main(["quality", "--text", "novels", "--quiet"]) == 2
    assert "--text" in capsys.readouterr().err
