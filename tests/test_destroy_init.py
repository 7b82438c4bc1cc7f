"""``rkv destroy`` and ``Engine.destroy`` delete only rkv stores; a failed ``rkv init`` leaves
nothing behind; ``rkv init`` refuses what ``rkv plan`` refuses.

A directory is an rkv store when it carries the marker written at creation
(``rkv-store.json``) or, for stores made before markers, an index with rkv's format entry.
Anything else (a directory with some other ``index/data.mdb``, a foreign LMDB environment,
a plain directory) is refused with a typed error (exit 2) and nothing in it is touched; a
real store whose index is damaged is still destroyed, memory tiers included, and a damaged
copy never takes its original's memory tiers with it. Memory tiers live in a per-test
directory here (``rkv.store.paths.memory_dir`` patched), so nothing touches /dev/shm.
"""

from __future__ import annotations

import io
import json
import shutil
import sys
from pathlib import Path

import lmdb
import pytest
import tomli_w
from rkvtest import SMALL, local_config, one_line_error, random_kv

from rkv import Engine, EngineConfig, StoreError, TierConfig
from rkv.cli import main
from rkv.store.paths import MARKER, check_store


@pytest.fixture
def shm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private stand-in for /dev/shm: memory tiers without a path live here."""
    d = tmp_path / "shm"
    d.mkdir()
    monkeypatch.setattr("rkv.store.paths.memory_dir", lambda: d)
    return d



def _default_store(path: Path) -> str:
    """A store with the default tiers (dram and cxl in the memory directory); its id."""
    with Engine.open(path) as e:
        e.put(list(range(40)), random_kv(SMALL, 40), model=SMALL)
        return e.identity.id


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# -- not a store: refused, nothing deleted -------------------------------------------------
def _not_stores(tmp_path: Path) -> dict[str, Path]:
    garbage = tmp_path / "garbage"                       # some other index/data.mdb
    (garbage / "index").mkdir(parents=True)
    (garbage / "index" / "data.mdb").write_bytes(b"not lmdb at all\n" * 600)
    foreign = tmp_path / "foreign"                       # another program's LMDB
    (foreign / "index").mkdir(parents=True)
    env = lmdb.open(str(foreign / "index"), max_dbs=4, map_size=1 << 20)
    with env.begin(write=True) as txn:
        txn.put(b"format", b"3")                         # not rkv's sealed entry
    env.close()
    plain = tmp_path / "plain"                           # no index at all
    plain.mkdir()
    markerish = tmp_path / "markerish"                   # a marker that is not one
    (markerish / "index").mkdir(parents=True)
    (markerish / MARKER).write_text('{"format": "something-else", "id": "x", "home": ""}')
    for d in (garbage, foreign, plain, markerish):
        (d / "precious.txt").write_text("keep me\n")
    return {"garbage": garbage, "foreign": foreign, "plain": plain, "markerish": markerish}


@pytest.mark.parametrize("kind", ["garbage", "foreign", "plain", "markerish"])
def test_destroy_refuses_what_is_not_a_store(tmp_path: Path, kind: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    d = _not_stores(tmp_path)[kind]
    before = _files(d)
    assert main(["destroy", "--yes", str(d)]) == 2
    msg = one_line_error(capsys)
    assert "nothing was destroyed" in msg, msg
    assert _files(d) == before
    with pytest.raises(StoreError, match="nothing was destroyed"):
        Engine.destroy(d)
    assert _files(d) == before and (d / "precious.txt").read_text() == "keep me\n"


def test_destroy_refuses_a_file_and_passes_a_missing_path(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    assert main(["destroy", "--yes", str(f)]) == 2
    assert "not a directory" in one_line_error(capsys) and f.read_text() == "x"
    with pytest.raises(StoreError):
        Engine.destroy(f)
    Engine.destroy(tmp_path / "missing")            # already gone: nothing to do
    assert main(["destroy", "--yes", str(tmp_path / "missing")]) == 2
    assert "does not exist" in one_line_error(capsys)


def test_destroy_asks_only_about_a_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    d = _not_stores(tmp_path)["foreign"]

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stdin", Tty("y\n"))
    assert main(["destroy", str(d)]) == 2            # refused before any question
    assert "not an rkv store" in one_line_error(capsys)
    assert (d / "precious.txt").exists()


# -- real stores: destroyed, damaged or not --------------------------------------------------
def test_new_store_carries_its_marker(tmp_path: Path, shm: Path) -> None:
    path = tmp_path / "s"
    sid = _default_store(path)
    doc = json.loads((path / MARKER).read_text())
    assert doc == {"format": "rkv-store", "id": sid, "home": str(path.resolve())}
    assert check_store(path) == {"id": sid, "home": str(path.resolve())}
    assert (shm / f"rkv-{sid}" / "dram").is_dir()
    Engine.destroy(path)
    assert not path.exists() and list(shm.iterdir()) == []


@pytest.mark.parametrize("damage", ["garbage", "truncated", "missing"])
def test_a_damaged_store_is_still_destroyed(tmp_path: Path, shm: Path, damage: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s"
    sid = _default_store(path)
    data = path / "index" / "data.mdb"
    if damage == "garbage":                  # same size, meta pages overwritten
        with data.open("r+b") as f:
            f.write(b"\xa5" * 16384)
    elif damage == "truncated":
        with data.open("r+b") as f:
            f.truncate(100)
    else:
        shutil.rmtree(path / "index")
    assert main(["destroy", "--yes", str(path)]) == 0, capsys.readouterr().err
    assert not path.exists()
    assert not (shm / f"rkv-{sid}").exists()     # its memory tiers went too


def test_a_store_from_before_markers_is_recognised_by_its_index(tmp_path: Path,
                                                                shm: Path) -> None:
    path = tmp_path / "old"
    sid = _default_store(path)
    (path / MARKER).unlink()
    assert check_store(path) is None              # a store, known by its index
    Engine.destroy(path)
    assert not path.exists() and not (shm / f"rkv-{sid}").exists()


def test_a_damaged_copy_leaves_its_originals_memory_tiers(tmp_path: Path, shm: Path) -> None:
    orig, copy = tmp_path / "orig", tmp_path / "copy"
    sid = _default_store(orig)
    shutil.copytree(orig, copy)
    with (copy / "index" / "data.mdb").open("r+b") as f:
        f.write(b"\xa5" * 16384)
    Engine.destroy(copy)               # its marker names the original's id and home
    assert not copy.exists()
    assert (shm / f"rkv-{sid}" / "dram").is_dir()
    with Engine.open(orig, readonly=True) as e:
        assert e.get(list(range(40)), model=SMALL).n_tokens == 40
    Engine.destroy(orig)
    assert list(shm.iterdir()) == []


def test_an_outside_tier_directory_keeps_what_is_not_the_tiers(tmp_path: Path,
                                                               shm: Path) -> None:
    outside = tmp_path / "mnt" / "nvme"
    cfg = EngineConfig(chunk_tokens=16, tiers=(
        TierConfig("nvme", path=str(outside), capacity_bytes=1 << 30),))
    path = tmp_path / "s"
    with Engine.open(path, cfg) as e:
        e.put(list(range(40)), random_kv(SMALL, 40), model=SMALL)
    (outside / "notes.txt").write_text("mine\n")
    Engine.destroy(path)
    assert not path.exists()
    assert sorted(p.name for p in outside.iterdir()) == ["notes.txt"]
    (outside / "notes.txt").unlink()
    with Engine.open(path, cfg):
        pass
    Engine.destroy(path)
    assert not outside.exists()                   # only the tier's files: the directory went


# -- a failed init leaves nothing ------------------------------------------------------------
def _failing_config(tmp_path: Path) -> Path:
    """dram (in the memory directory) is made, then nvme fails: its path is under a file."""
    (tmp_path / "afile").write_text("x")
    cfg = tmp_path / "fail.toml"
    # Each tier names its fault model: one left out is warned about, a second stderr line.
    fm = 'fault_model = "nvme-tlc"\n'
    cfg.write_text('[[tiers]]\nname = "dram"\nmedium = "memory"\ncapacity_bytes = 1048576\n'
                   'fault_model = "dram-ddr5"\n'
                   f'[[tiers]]\nname = "nvme"\npath = "{tmp_path / "afile" / "nvme"}"\n{fm}'
                   f'capacity_bytes = 1048576\n[[tiers]]\nname = "ssd"\n{fm}'
                   f'path = "{tmp_path / "ssd" / "deep"}"\ncapacity_bytes = 1048576\n')
    return cfg


def test_a_failed_init_leaves_nothing(tmp_path: Path, shm: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _failing_config(tmp_path)
    # ssd comes after the failing tier: reorder so that it is made before the failure too
    text = cfg.read_text().split("[[tiers]]")
    cfg.write_text("[[tiers]]".join([text[0], text[1], text[3], text[2]]))
    root = tmp_path / "new" / "parent" / "store"
    assert main(["init", str(root), "--config", str(cfg)]) == 2
    assert "Not a directory" in one_line_error(capsys)
    assert not (tmp_path / "new").exists()           # no store, no parents
    assert not (tmp_path / "ssd").exists()           # no tier directory outside it
    assert list(shm.iterdir()) == []                 # no rkv-<id> memory directory


def test_a_failed_init_into_an_empty_directory_leaves_it_empty(
        tmp_path: Path, shm: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _failing_config(tmp_path)
    root = tmp_path / "empty"
    root.mkdir()
    assert main(["init", str(root), "--config", str(cfg)]) == 2
    one_line_error(capsys)
    assert root.is_dir() and list(root.iterdir()) == []
    assert list(shm.iterdir()) == []


def test_a_failed_init_keeps_what_existed(tmp_path: Path, shm: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _failing_config(tmp_path)
    (tmp_path / "ssd").mkdir()
    (tmp_path / "ssd" / "mine.txt").write_text("mine\n")
    text = cfg.read_text().split("[[tiers]]")
    cfg.write_text("[[tiers]]".join([text[0], text[1], text[3], text[2]]))
    assert main(["init", str(tmp_path / "s"), "--config", str(cfg)]) == 2
    one_line_error(capsys)
    assert not (tmp_path / "s").exists()
    assert (tmp_path / "ssd" / "mine.txt").read_text() == "mine\n"
    assert not (tmp_path / "ssd" / "deep").exists()  # what init made in it went


# -- init refuses what plan refuses ----------------------------------------------------------
def _placement_config(tmp_path: Path, profile: Path | str) -> Path:
    cfg = tmp_path / "placed.toml"
    cfg.write_text(f'[placement]\nprofile = "{profile}"\n')
    return cfg


def _bad_profiles(tmp_path: Path) -> dict[str, Path]:
    out = {"passwd": tmp_path / "passwd", "garbage": tmp_path / "garbage.json",
           "nan": tmp_path / "nan.json", "deep": tmp_path / "deep.json",
           "negative": tmp_path / "negative.json"}
    out["passwd"].write_text("root:x:0:0:root:/root:/bin/bash\n")
    out["garbage"].write_bytes(b"\x00\x01\xffgarbage")
    out["nan"].write_text('{"model": "m", "kl": {"0:k:8": NaN}}')
    out["deep"].write_text("[" * 100_000 + "]" * 100_000)
    out["negative"].write_text('{"model": "m", "kl": {"0:k:8": -1.0}}')
    return out


@pytest.mark.parametrize("kind", ["passwd", "garbage", "nan", "deep", "negative"])
def test_init_refuses_a_bad_placement_profile(tmp_path: Path, kind: str, shm: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _placement_config(tmp_path, _bad_profiles(tmp_path)[kind])
    assert main(["plan", "--config", str(cfg)]) == 2
    one_line_error(capsys)
    root = tmp_path / "s"
    assert main(["init", str(root), "--config", str(cfg)]) == 2
    assert "quality profile" in one_line_error(capsys)
    assert not root.exists() and list(shm.iterdir()) == []


def test_init_refuses_an_unknown_fault_model(tmp_path: Path, shm: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "fm.toml"
    cfg.write_text('[[tiers]]\nname = "a"\nfault_model = "bogus"\n')
    assert main(["plan", "--config", str(cfg)]) == 2
    one_line_error(capsys)
    assert main(["init", str(tmp_path / "s"), "--config", str(cfg)]) == 2
    assert "fault_model 'bogus'" in one_line_error(capsys)
    assert not (tmp_path / "s").exists()


def test_init_accepts_a_good_profile(tmp_path: Path) -> None:
    d = local_config(16).to_dict()
    d["placement"] = {"profile": "smollm2-135m"}
    cfg = tmp_path / "good.toml"
    cfg.write_text(tomli_w.dumps(d))
    assert main(["init", str(tmp_path / "s"), "--config", str(cfg)]) == 0
    assert check_store(tmp_path / "s") is not None
    Engine.destroy(tmp_path / "s")
    assert not (tmp_path / "s").exists()


def test_a_writable_open_gives_a_copy_its_own_marker(tmp_path: Path, shm: Path) -> None:
    """A copy takes a new id at its first writable open: its marker follows, so destroying
    the copy later (even damaged) can only ever name the copy's own memory tiers."""
    orig, copy = tmp_path / "orig", tmp_path / "copy"
    sid = _default_store(orig)
    shutil.copytree(orig, copy)
    with Engine.open(copy) as e:
        new = e.identity.id
    assert new != sid
    assert json.loads((copy / MARKER).read_text())["id"] == new
    assert json.loads((copy / MARKER).read_text())["home"] == str(copy.resolve())
    (orig / MARKER).unlink()                     # a store from before markers gets one
    with Engine.open(orig):
        pass
    assert json.loads((orig / MARKER).read_text())["id"] == sid


def test_open_without_create_refuses_a_foreign_index(tmp_path: Path) -> None:
    foreign = _not_stores(tmp_path)["foreign"]
    before = _files(foreign)
    for readonly in (False, True):
        with pytest.raises(StoreError, match="not an rkv store"):
            Engine.open(foreign, create=False, readonly=readonly)
    assert not (foreign / MARKER).exists()
    assert [f for f in _files(foreign) if not f.startswith("index/")] == \
        [f for f in before if not f.startswith("index/")]
