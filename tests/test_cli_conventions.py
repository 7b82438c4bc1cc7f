"""The command line's conventions (docs/cli.md): every subcommand answers bad arguments with one
line on stderr and exit status 2, never a traceback; --version; defaults in --help; the
registry; ``rkv init`` and ``rkv faultmodels``; the real entry point in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import click
import pytest
from rkvtest import local_config

from rkv.cli import cli, main
from rkv.cli.commands import COMMANDS, SECTIONS
from rkv.store.config import EngineConfig

MISSING = "/nonexistent/rkv-cli-test"
#: Bad arguments for every subcommand: {command: [argv after the command, ...]}. ``T`` is
#: replaced by the test's tmp_path, ``F`` by a plain file in it. None of these may load a
#: model or run a campaign: the check must come first.
BAD: dict[str, list[list[str]]] = {
    "init": [["--no-such-option", "T/s"], [], ["T/s", "--config", MISSING],
             ["T/s", "--config", "T/bad.toml"], ["F"]],
    "info": [["--no-such-option", "T"], [MISSING], ["T/s", "extra"]],
    "verify": [["--repair=3", "T"], [MISSING]],
    "scrub": [["T", "--budget", "fast"], ["T", "--margin", "0"], [MISSING, "--once"]],
    "serve-metrics": [[MISSING], ["T", "--port", "x"], ["T", "--port", "70000"],
                      ["T", "--interval", "0"], ["T"]],
    "migrate": [[MISSING], ["--json", "T"]],
    "destroy": [["--yes", MISSING], ["--yes"]],
    "demo": [["--prompts", "x"], ["--prompts", "0"], ["--path", "F"]],
    "campaign": [["--trials", "x"], ["--protection", "rs(1"], ["--fault-model", "nope"],
                 ["--config", MISSING], ["--config", "T/bad.toml"], ["--param", "x"],
                 ["--rows", f"{MISSING}/rows.jsonl"], ["--scrub", "1"], ["--tier", "tape"],
                 ["--days", "1", "--scrub", "often"], ["--bits", "3"], ["--json", "--csv"],
                 ["--days", "1", "--csv"]],
    "validate": [["--trials", "0"], ["--json", f"{MISSING}/v.json"], ["--workers", "x"],
                 ["--csv=yes"]],
    "faultmodels": [["nope"], ["--json", "--csv"], ["raw-ber", "extra"]],
    "plan": [["--tokens", "x"], ["--tokens", "0"], ["--config", MISSING], ["--tier", "tape"],
             ["--model", MISSING], ["--config", "T/bad.toml"]],
    "quality": [["--ecc", "rs(1"], ["--ecc", "bch(m=99)"], ["--bits", "3"], ["--bits", "x"],
                ["--fault-model", "nope"], ["--fault-model", "raw-ber", "--param", "x"],
                ["--param", "ber=1"], ["--ber", "x"], ["--text", "novels"],
                ["--group", "0"]],
    "calibrate": [["--windows", "0"], ["--text", "novels"], ["--out", f"{MISSING}/p.json"],
                  ["--limit", "x"]],
    "sweep": [[MISSING + ".toml"], ["--executor", "cloud"], ["--workers", "0"],
              ["T/bad.toml"]],
    "report": [[MISSING + ".jsonl"], ["F", "--rate", "max"], ["T"]],
    "replay": [[MISSING + ".jsonl"], ["F", "--limit", "x"], ["F", "--format", "csv"],
               ["F", "--budget", "5%"], ["--moe", "synthetic:nope"],
               ["--moe", "synthetic:mixtral-8x7b:x"], []],
    "moe": [["nope"], ["trace", "--out", "T/t.jsonl", "--top-k", "x"],
            ["trace", "--text", MISSING, "--out", "T/t.jsonl"], ["trace"],
            ["run", "--tokens", "0"], ["run", "--budget", "lots"],
            ["run", "--policy", "nosuch"], ["run", "--bits", "5"],
            ["run", "--low-bit-on-miss"]],
}


def test_every_command_has_bad_cases() -> None:
    assert set(BAD) == set(COMMANDS)


def _cases() -> list[tuple[str, list[str]]]:
    return [(name, argv) for name, cases in BAD.items() for argv in cases]


@pytest.mark.parametrize(("name", "argv"), _cases(),
                         ids=[f"{n}:{' '.join(a) or '-'}" for n, a in _cases()])
def test_bad_arguments_are_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               name: str, argv: list[str]) -> None:
    (tmp_path / "bad.toml").write_text("chunk_tokens = [1\n")
    (tmp_path / "file").write_text("not a store\n")
    args = [a.replace("T", str(tmp_path), 1) if a.startswith("T") else a for a in argv]
    args = [str(tmp_path / "file") if a == "F" else a for a in args]
    code = main([name, *args])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rkv: error: "), err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"rkv {version('rkv')}"


@pytest.mark.parametrize(("argv", "shown"), [
    (["quality", "--help"], ["[default: rs(255,239)]", "[default: 16,8,4,2]"]),
    (["replay", "--help"], ["[default: mooncake]", "[default: 20.0]"]),
    (["campaign", "--help"], ["[default: auto]", "[default: 1e-09"]),
    (["moe", "run", "--help"], ["[default: 25%]", "compute threads [default: 1; x>=1]"]),
    (["--help"], ["[default: warning]", "Stores:", "faultmodels"]),
])
def test_help_shows_defaults(capsys: pytest.CaptureFixture[str], argv: list[str],
                             shown: list[str]) -> None:
    assert main(argv) == 0
    out = " ".join(capsys.readouterr().out.split())
    for text in shown:
        assert text in out, text


def _help_pages() -> list[list[str]]:
    """argv of every command's and subcommand's --help."""
    pages: list[list[str]] = []

    def walk(cmd: click.Command, path: list[str]) -> None:
        pages.append(path)
        if isinstance(cmd, click.Group):
            ctx = click.Context(cmd)
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                assert sub is not None
                walk(sub, [*path, name])

    for name in COMMANDS:
        cmd = cli.get_command(click.Context(cli), name)
        assert cmd is not None
        walk(cmd, [name])
    return pages


@pytest.mark.parametrize("argv", _help_pages(), ids=" ".join)
def test_no_flag_shows_a_bare_bool_default(capsys: pytest.CaptureFixture[str],
                                           argv: list[str]) -> None:
    """A flag's default reads as what happens: ``--raw/--no-raw  [default: raw]``, never
    ``--no-raw  [default: True]`` (read as "skipped by default")."""
    assert main([*argv, "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "[default: True]" not in out and "[default: False]" not in out, out


def test_no_command_prints_help_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "Usage: rkv" in capsys.readouterr().err


def test_registry_resolves_and_sections_list_every_command() -> None:
    ctx = click.Context(cli)
    for name, (_, short) in COMMANDS.items():
        cmd = cli.get_command(ctx, name)
        assert isinstance(cmd, click.Command) and cmd.name == name
        assert cmd.get_short_help_str(limit=200) == short
    assert sorted(n for _, names in SECTIONS for n in names) == sorted(COMMANDS)


def test_log_level_debug_logs_to_stderr(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    import logging

    before = (logging.getLogger("rkv").level, list(logging.getLogger().handlers))
    assert main(["--log-level", "debug", "info", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert "rkv: debug:" in err and err.strip().splitlines()[-1].startswith("rkv: error:")
    # main() leaves logging as it found it
    assert (logging.getLogger("rkv").level, list(logging.getLogger().handlers)) == before
    assert main(["--log-level", "loud", "info", "x"]) == 2
    assert "--log-level" in capsys.readouterr().err


# -- rkv init ----------------------------------------------------------------------------------
@pytest.fixture
def no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in list(os.environ):
        if var.startswith("RKV_"):
            monkeypatch.delenv(var)


def test_init_round_trip_and_refusals(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                      no_env: None) -> None:
    cfg = tmp_path / "engine.toml"
    cfg.write_text(local_config(32).to_toml())
    store = tmp_path / "s"
    try:
        assert main(["init", str(store), "--config", str(cfg)]) == 0
        out = capsys.readouterr().out
        assert "created" in out and "chunk_tokens 32" in out and "nvme: disk" in out
        assert main(["info", "--json", str(store)]) == 0
        info = json.loads(capsys.readouterr().out)
        assert info["chunk_tokens"] == 32 and set(info["tiers"]) == {"dram", "cxl", "nvme"}
        # the same config again: fine, nothing changes
        assert main(["init", str(store), "--config", str(cfg), "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert doc["created"] is False and doc["config"]["chunk_tokens"] == 32
        # another config: refused, one line
        other = tmp_path / "other.toml"
        other.write_text(local_config(64).to_toml())
        assert main(["init", str(store), "--config", str(other)]) == 2
        err = capsys.readouterr().err
        assert "another config" in err and "chunk_tokens" in err and err.count("\n") == 1
        assert EngineConfig.from_dict(doc["config"]).chunk_tokens == 32
    finally:
        main(["destroy", "--yes", str(store)])
    # a directory with other files in it is not made a store
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "keep").write_text("x")
    assert main(["init", str(junk), "--config", str(cfg)]) == 2
    assert "not an rkv store" in capsys.readouterr().err and not (junk / "index").exists()


# -- rkv faultmodels ---------------------------------------------------------------------------
def test_faultmodels_lists_presets(capsys: pytest.CaptureFixture[str]) -> None:
    import faultmodels

    assert main(["faultmodels"]) == 0
    out = capsys.readouterr().out
    for name in faultmodels.list_presets():
        assert name in out
    assert "3D TLC NAND" in out and "pe_cycles=3000" in out
    assert main(["faultmodels", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == faultmodels.list_presets()
    nvme = next(r for r in rows if r["name"] == "nvme-tlc")
    assert nvme["model"] == "nand" and nvme["parameters"]["pe_cycles"] == 3000
    assert main(["faultmodels", "--csv"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "name,model,description,parameters" and len(lines) == len(rows) + 1


def test_faultmodels_one_preset_in_full(capsys: pytest.CaptureFixture[str]) -> None:
    import faultmodels

    assert main(["faultmodels", "nvme-tlc", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    full = faultmodels.get_model("nvme-tlc").params()
    assert doc["parameters"] == {k: v for k, v in full.items() if k not in ("model", "source")}
    assert "pe_cycles" in doc["set_by_preset"] and "Luo" in doc["source"]
    assert main(["faultmodels", "raw-ber"]) == 0
    out = capsys.readouterr().out
    assert "model raw-ber" in out and "per_hour" in out and "1e-06" in out


# -- the real entry point ----------------------------------------------------------------------
def _rkv() -> list[str]:
    script = Path(sys.executable).with_name("rkv")
    return [str(script)] if script.exists() else [sys.executable, "-m", "rkv.cli"]


def test_entry_point_version_and_help() -> None:
    r = subprocess.run([*_rkv(), "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == f"rkv {version('rkv')}"
    r = subprocess.run([*_rkv(), "-h"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "Usage: rkv" in r.stdout


def test_entry_point_errors_are_one_line(tmp_path: Path) -> None:
    for argv in (["info", str(tmp_path / "none")], ["campaign", "--trials", "x"],
                 ["quality", "--fault-model", "nope"]):
        r = subprocess.run([*_rkv(), *argv], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2, r.stderr
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
        assert r.stderr.startswith("rkv: error: ")


def test_entry_point_bash_completion() -> None:
    env = {**os.environ, "_RKV_COMPLETE": "bash_complete", "COMP_WORDS": "rkv fau",
           "COMP_CWORD": "1"}
    r = subprocess.run(_rkv(), capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0 and "faultmodels" in r.stdout


def test_campaign_help_defaults_match_the_config() -> None:
    from dataclasses import fields

    from rkv.cli.campaign import SHOWN_DEFAULTS
    from rkv.eval.faults.campaign import CampaignConfig

    defaults = {f.name: f.default for f in fields(CampaignConfig)}
    assert {k: defaults[k] for k in SHOWN_DEFAULTS} == SHOWN_DEFAULTS


def _all_commands() -> list[list[str]]:
    from rkv.cli.moe import SUBCOMMANDS

    return [[n] for n in COMMANDS if n != "moe"] + [["moe", n] for n in SUBCOMMANDS]


@pytest.mark.parametrize("argv", _all_commands(), ids=" ".join)
def test_every_command_has_help_with_defaults(capsys: pytest.CaptureFixture[str],
                                              argv: list[str]) -> None:
    assert main([*argv, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"Usage: rkv {' '.join(argv)} ")
    if argv[-1] not in ("init", "info", "verify", "migrate", "destroy", "faultmodels"):
        assert "[default: " in out               # (those have only flags and paths)


def test_internal_error_is_one_line_exit_70(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from rkv.store.engine import Engine

    def broken(*args: object, **kwargs: object) -> None:
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(Engine, "open", broken)
    assert main(["info", str(tmp_path)]) == 70
    err = capsys.readouterr().err
    assert err == ("rkv: error: internal error: ZeroDivisionError: a bug (run with --log-level "
                   "debug for the traceback)\n")
    assert main(["--log-level", "debug", "info", str(tmp_path)]) == 70
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().splitlines()[-1].startswith("rkv: error:")


def test_completion_of_preset_names() -> None:
    env = {**os.environ, "_RKV_COMPLETE": "bash_complete",
           "COMP_WORDS": "rkv campaign --fault-model nv", "COMP_CWORD": "3"}
    r = subprocess.run(_rkv(), capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0 and r.stdout.split() == ["plain,nvme-tlc"]


def test_campaign_csv_has_both_storages(capsys: pytest.CaptureFixture[str]) -> None:
    import csv
    import io

    assert main(["campaign", "--fault-model", "raw-ber", "--param", "ber=1e-4", "--protection",
                 "rs(255,239)", "--trials", "2", "--blocks", "2", "--chunk-tokens", "16",
                 "--kv-heads", "1", "--head-dim", "8", "--csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert {r["storage"] for r in rows} == {"rs(255,239)", "raw"}
    assert {r["outcome"] for r in rows} >= {"due", "sdc"}
    assert sum(int(r["count"]) for r in rows if r["storage"] == "raw") == 4   # 2 x 2 blocks
