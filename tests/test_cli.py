from __future__ import annotations

import json
from pathlib import Path

import pytest
from rkvtest import SMALL, local_config, random_kv

from rkv import Engine
from rkv.cli import main
from rkv.keys import as_token_array, block_key, chunk_keys


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
        from rkv.record import decode_record

        rec[decode_record(rec).header_bytes + 5] ^= 1
        e.tiers["dram"].put(block_key(key, 0), rec)
    assert main(["verify", "--json", str(tmp_path / "s")]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["uncorrectable"] == 1 and not data["clean"]
    assert "ChecksumError" in data["problems"][0]["error"]


def test_not_a_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", str(tmp_path / "nothing")]) == 2
    assert "not an rkv store" in capsys.readouterr().err
    assert not (tmp_path / "nothing").exists()


def test_demo_runs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--prompts", "3"]) == 0
    out = capsys.readouterr().out
    assert "every reload was byte-exact and verified" in out
    assert "prefix dedup saved" in out
