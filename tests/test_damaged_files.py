"""Damaged, truncated and vanished LMDB files, deterministically, each in a subprocess.

A file cut short under LMDB's map used to end the process with SIGBUS (open, get, verify,
destroy); a failed lookup poisoned the rest of a get (``MDB_BAD_TXN``); damage to one tier's
meta pages while the store was open closed the whole engine. Every case runs in a child
process (``run_child``), so a signal is a test failure with its exit status, not a dead
test runner.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rkvtest import SMALL, random_kv

from rkv import Engine, EngineConfig, TierConfig
from rkv.errors import CorruptStoreError
from rkv.format.keys import as_token_array, block_key, chunk_keys  # noqa: F401 (the children's)
from rkv.tiers.lmdbfile import check_path, read_meta

ROOT = Path(__file__).resolve().parents[1]
CHUNK = 16
TOKENS = np.arange(4 * CHUNK)


def config(dram_chunks: int = 2) -> EngineConfig:
    """dram takes the first ``dram_chunks`` chunks of a put, nvme the rest."""
    return EngineConfig(chunk_tokens=CHUNK, promote="never", tiers=(
        TierConfig("dram", medium="memory", path="t/dram",
                   capacity_bytes=dram_chunks * 2685),
        TierConfig("nvme", medium="disk", path="t/nvme", capacity_bytes=1 << 30)))


def build(path: Path) -> None:
    with Engine.open(path, config()) as e:
        r = e.put(TOKENS, random_kv(SMALL, len(TOKENS)), model=SMALL)
        assert r.tiers == {"dram": 2, "nvme": 2}, r


def run_child(body: str, **args: Any) -> dict[str, Any]:
    """Run ``body`` (it sets ``out``, a dict) in a fresh interpreter; a signal fails."""
    prog = textwrap.dedent("""
        import json, os, sys
        sys.path[:0] = [{tests!r}, {root!r}]
        import numpy as np
        from rkvtest import SMALL, random_kv
        from test_damaged_files import *
        args = json.loads(sys.argv[1])
        out = {{}}
    """).format(tests=str(ROOT / "tests"), root=str(ROOT)) + textwrap.dedent(body) + \
        "\nprint('RESULT ' + json.dumps(out))\n"
    proc = subprocess.run([sys.executable, "-c", prog, json.dumps(args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, (f"child exited with {proc.returncode} "
                                  f"(a signal is negative):\n{proc.stderr[-3000:]}")
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])  # type: ignore[no-any-return]


def leaf_pages_holding(data_file: Path, keys: list[bytes], psize: int = 4096) -> set[int]:
    """Pages of an LMDB file whose bytes contain any of ``keys`` (their leaf nodes)."""
    raw = data_file.read_bytes()
    pages = set()
    for k in keys:
        at = raw.find(k)
        while at >= 0:
            pages.add(at // psize)
            at = raw.find(k, at + 1)
    return pages - {0, 1}


def spoil_page_type(data_file: Path, page: int, psize: int = 4096) -> None:
    """Overwrite a page's flags (bytes 10-11 of its header): LMDB then reports
    ``MDB_CORRUPTED`` ("located page was wrong type") for any lookup through it."""
    with open(data_file, "r+b") as f:
        f.seek(page * psize + 10)
        f.write(b"\xff\x7f")


# -- the meta check itself ----------------------------------------------------------------------
def test_meta_of_a_healthy_file_and_of_cut_ones(tmp_path: Path) -> None:
    build(tmp_path / "s")
    f = tmp_path / "s" / "t" / "nvme" / "data.mdb"
    meta = check_path(f, "nvme", writable=False)
    assert meta is not None and meta.psize == 4096
    pristine = f.read_bytes()
    assert meta.needed_bytes <= len(pristine)
    # Read-only: a file missing pages in use is damaged (the whole file is verified).
    for cut in (meta.needed_bytes - 4096, len(pristine) // 2, 8192, 4096, 100):
        os.truncate(f, cut)
        with pytest.raises(CorruptStoreError, match=r"cut short|too short|shorter"):
            check_path(f, "nvme", writable=False)
        f.write_bytes(pristine)
    # Writable: a short file is covered (zeros up to its last page), so no page of the
    # map lies past its end; what was lost reads as damaged pages.
    os.truncate(f, len(pristine) // 2)
    assert check_path(f, "nvme", writable=True) == meta
    assert f.stat().st_size == meta.needed_bytes
    assert f.read_bytes()[: len(pristine) // 2] == pristine[: len(pristine) // 2]
    os.truncate(f, 0)
    assert check_path(f, "nvme", writable=True) is None   # empty: LMDB makes a new one


def test_a_healthy_short_file_passes_read_only(tmp_path: Path) -> None:
    """A file may end before its committed last page where those pages are free (LMDB
    counts pages it allocated and never wrote, or freed at the end). Read-only, the
    verifier accepts such a file; one page more cut (in use) is damage."""
    import lmdb
    import lmdb.verify

    env = lmdb.open(str(tmp_path / "e"), map_size=1 << 30)
    for op in (("put", b"a", b"x" * 100), ("put", b"big", os.urandom(100_000)),
               ("delete", b"big"), ("put", b"b", b"y"), ("put", b"c", b"y")):
        with env.begin(write=True) as txn:
            getattr(txn, op[0])(*op[1:])
    env.close()
    f = tmp_path / "e" / "data.mdb"
    meta = check_path(f, "e", writable=False)
    assert meta is not None
    pristine = f.read_bytes()

    def cut(pages: int) -> None:
        f.write_bytes(pristine[: meta.needed_bytes - 4096 * pages])

    tail = 0          # the free pages at the end (the big value's, freed)
    while not lmdb.verify.verify(str(f), subdir=False):
        tail += 1
        cut(tail)
    assert tail >= 2, "the layout this test relies on: free pages at the end"
    cut(tail - 1)                                            # only free pages missing
    assert check_path(f, "e", writable=False) == meta
    cut(tail)                                                # a page in use missing
    with pytest.raises(CorruptStoreError, match="cut short"):
        check_path(f, "e", writable=False)


def test_meta_damage_is_refused(tmp_path: Path) -> None:
    build(tmp_path / "s")
    f = tmp_path / "s" / "t" / "nvme" / "data.mdb"
    pristine = f.read_bytes()
    fd = os.open(f, os.O_RDONLY)
    try:
        good = read_meta(fd, len(pristine), "nvme")
    finally:
        os.close(fd)
    # Each field of the committed meta page: magic, version, map size, a root, last page.
    committed = 0 if good.txnid % 2 == 0 else 4096
    for off, value in ((16, 0), (20, 7), (32, 1 << 60), (16 + 24 + 40, 1 << 40),
                       (16 + 24 + 96, 1 << 40)):
        raw = bytearray(pristine)
        raw[committed + off:committed + off + 8] = value.to_bytes(8, "little")
        f.write_bytes(bytes(raw))
        with pytest.raises(CorruptStoreError):
            check_path(f, "nvme", writable=True)


# -- at open: every file cut short ---------------------------------------------------------------
@pytest.mark.parametrize("which", ["index", "t/dram", "t/nvme"])
def test_a_truncated_file_is_typed_at_open_and_destroy_works(tmp_path: Path, which: str
                                                           ) -> None:
    out = run_child("""
        from pathlib import Path
        from rkv import Engine
        from rkv.errors import CorruptStoreError
        p = Path(args["path"])
        build(p)
        f = p / args["which"] / "data.mdb"
        os.truncate(f, f.stat().st_size // 2)
        try:
            with Engine.open(p, config()) as e:
                g = e.get(TOKENS, model=SMALL)
                out["tokens"] = g.n_tokens
                out["counts"] = g.counts
                rep = e.verify()
                out["damaged"] = rep.damaged_tiers
                out["exact"] = bool(np.array_equal(
                    g.kv, random_kv(SMALL, len(TOKENS))[:, :, :g.n_tokens]))
        except CorruptStoreError as exc:
            out["open"] = "CorruptStoreError"
        Engine.destroy(p)
        out["gone"] = not p.exists()
    """, path=str(tmp_path / "s"), which=which)
    assert out["gone"]
    if which == "index":
        assert out["open"] == "CorruptStoreError"
        return
    tier = which.split("/")[1]
    # The cut tier is covered (its lost pages read as damaged pages), found damaged by the
    # structural check, and its lost blocks are misses; dram holds chunks 0-1, nvme 2-3.
    assert out["damaged"] == [tier] and out["exact"]
    assert out["tokens"] == (0 if tier == "dram" else 2 * CHUNK)


# -- while open -----------------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["truncate", "meta", "vanish"])
def test_damage_to_one_tier_while_open_leaves_the_others_serving(tmp_path: Path, how: str
                                                               ) -> None:
    out = run_child("""
        from pathlib import Path
        from rkv import Engine
        p = Path(args["path"])
        build(p)
        want = random_kv(SMALL, len(TOKENS))
        with Engine.open(p, config()) as e:
            assert e.get(TOKENS, model=SMALL).n_tokens == len(TOKENS)
            f = p / "t" / "nvme" / "data.mdb"
            if args["how"] == "truncate":
                os.truncate(f, 8192)
            elif args["how"] == "meta":
                with open(f, "r+b") as fh:
                    fh.write(os.urandom(8192))
            else:
                f.unlink()
            g = e.get(TOKENS, model=SMALL)
            out["tokens"] = g.n_tokens
            out["exact"] = bool(np.array_equal(g.kv, want[:, :, :g.n_tokens]))
            more = np.arange(1000, 1000 + CHUNK)
            r = e.put(more, random_kv(SMALL, CHUNK, seed=5), model=SMALL)
            out["nvme_state"] = e.stats()["tiers"]["nvme"]["state"]
            out["put_tiers"] = r.tiers
            got = e.get(more, model=SMALL)
            out["put_back"] = got.n_tokens
            out["damaged"] = e.verify().damaged_tiers
    """, path=str(tmp_path / "s"), how=how)
    assert out["tokens"] == 2 * CHUNK and out["exact"]
    assert out["nvme_state"] == "damaged"
    assert out["damaged"] == ["nvme"]
    # The new chunk went where it could (dram evicts for it), and reads back.
    assert out["put_tiers"] == {"dram": 1} and out["put_back"] == CHUNK


def test_a_failed_lookup_does_not_poison_the_rest_of_a_get(tmp_path: Path) -> None:
    """The leaf pages of nvme's records for chunks 2-3 are damaged (their page type): the
    lookups there fail in LMDB, which makes that snapshot unusable; the get still returns the
    two verified chunks in dram and a status for every failed block."""
    out = run_child("""
        from pathlib import Path
        from rkv import Engine
        p = Path(args["path"])
        build(p)
        keys = chunk_keys(as_token_array(TOKENS), SMALL.fingerprint(), CHUNK)
        with Engine.open(p, config()) as e:
            assert e.get(TOKENS, model=SMALL).n_tokens == len(TOKENS)
            f = p / "t" / "nvme" / "data.mdb"
            bkeys = [block_key(k, layer) for k in keys[2:] for layer in range(SMALL.n_layers)]
            pages = leaf_pages_holding(f, bkeys)
            out["pages"] = sorted(pages)
            for page in pages:
                spoil_page_type(f, page)
            g = e.get(TOKENS, model=SMALL)
            out["tokens"] = g.n_tokens
            out["counts"] = g.counts
            out["errors"] = sorted({type(b.error).__name__ for b in g.blocks if b.error})
            many = e.get_many([TOKENS, TOKENS[:2 * CHUNK]], model=SMALL)
            out["many"] = [r.n_tokens for r in many]
    """, path=str(tmp_path / "s"))
    assert out["pages"], "the records' leaf pages were found"
    assert out["tokens"] == 2 * CHUNK
    assert out["counts"]["uncorrectable"] >= 1
    assert out["errors"] == ["CorruptStoreError"]
    assert out["many"] == [2 * CHUNK, 2 * CHUNK]


def test_a_damaged_index_entry_page_ends_the_prefix_not_the_get(tmp_path: Path) -> None:
    """The index page holding a chunk entry is damaged while open: lookups and gets report
    the prefix before it (or a typed error), never MDB_BAD_TXN as a StoreError."""
    out = run_child("""
        from pathlib import Path
        from rkv import Engine
        from rkv.errors import RkvError, CorruptStoreError, StoreError
        p = Path(args["path"])
        build(p)
        keys = chunk_keys(as_token_array(TOKENS), SMALL.fingerprint(), CHUNK)
        with Engine.open(p, config()) as e:
            f = p / "index" / "data.mdb"
            for page in leaf_pages_holding(f, [keys[3]]):
                spoil_page_type(f, page)
            res = []
            for fn in (e.lookup, e.get):
                try:
                    r = fn(TOKENS, model=SMALL)
                    res.append(r if isinstance(r, int) else r.n_tokens)
                except CorruptStoreError:
                    res.append("CorruptStoreError")
                except RkvError as exc:
                    res.append(type(exc).__name__)
            out["res"] = res
    """, path=str(tmp_path / "s"))
    assert all(r == "CorruptStoreError" or isinstance(r, int) for r in out["res"]), out


def test_a_tier_path_that_became_a_file_is_a_stand_in(tmp_path: Path) -> None:
    """The docs promise a stand-in for a tier that cannot be opened: a memory tier's directory
    replaced by a file (a tmpfs cleaner, an operator's mistake) used to make the store
    unopenable."""
    import shutil

    build(tmp_path / "s")
    d = tmp_path / "s" / "t" / "dram"
    shutil.rmtree(d)
    d.write_bytes(b"not a directory")
    with Engine.open(tmp_path / "s", config()) as e:
        assert e.stats()["tiers"]["dram"]["state"] == "damaged"
        assert e.get(TOKENS, model=SMALL).n_tokens == 0      # chunks 0-1 lived in dram
        r = e.put(np.arange(500, 500 + CHUNK), random_kv(SMALL, CHUNK), model=SMALL)
        assert r.tiers == {"nvme": 1}
