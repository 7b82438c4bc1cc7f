"""A full disk: puts fail as TierFullError, nothing acknowledged is lost, deletes free space.

Two ways to fill a disk: a real 20 MiB tmpfs (needs ``mount``, as root in CI; skipped where
it is refused) and a file-size limit (``RLIMIT_FSIZE``, in a subprocess), which makes LMDB's
writes fail with ``EFBIG`` as a disk quota would.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from rkvtest import local_config, random_kv

from rkv import Engine, ModelSpec
from rkv.errors import TierFullError
from rkv.tiers.reserve import RESERVE_NAME

ROOT = Path(__file__).resolve().parents[1]
MODEL = ModelSpec("test/full", n_layers=4, n_kv_heads=4, head_dim=64, dtype="float16")
N = 512        # tokens per sequence: 2 chunks of 256, 512 KiB of KV


def seq(i: int) -> np.ndarray:
    return np.arange(i * 100_000, i * 100_000 + N)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=20m", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_a_full_disk_is_tier_full_and_deletes_free_space(small_disk: Path) -> None:
    with Engine.open(small_disk / "s", local_config(256)) as e:
        stored = []
        for i in range(100):
            try:
                e.put(seq(i), random_kv(MODEL, N, seed=i), model=MODEL)
            except TierFullError as exc:
                assert "disk is full" in str(exc)
                break
            stored.append(i)
        else:
            pytest.fail("20 MiB never filled")
        assert len(stored) >= 3
        # Everything acknowledged reads back exactly.
        for i in stored:
            got = e.get(seq(i), model=MODEL)
            assert got.n_tokens == N and np.array_equal(got.kv, random_kv(MODEL, N, seed=i))
        # Every delete works on the full disk (the index's reserve pays for the first).
        for i in stored[: len(stored) // 2]:
            assert e.delete(seq(i), model=MODEL) == 2
        # The freed pages take new puts again; the rest is intact.
        e.put(seq(1000), random_kv(MODEL, N, seed=1000), model=MODEL)
        assert e.get(seq(1000), model=MODEL).n_tokens == N
        for i in stored[len(stored) // 2:]:
            assert np.array_equal(e.get(seq(i), model=MODEL).kv, random_kv(MODEL, N, seed=i))
        assert e.clear() > 0
    with Engine.open(small_disk / "s") as e:
        assert e.stats()["chunks"] == 0


def test_clear_on_a_full_disk(small_disk: Path) -> None:
    with Engine.open(small_disk / "s", local_config(256)) as e:
        n = 0
        for i in range(100):
            try:
                e.put(seq(i), random_kv(MODEL, N, seed=i), model=MODEL)
                n += 1
            except TierFullError:
                break
        assert e.clear() == 2 * n
        assert e.verify().clean


def test_each_environment_keeps_a_reserve(tmp_path: Path) -> None:
    with Engine.open(tmp_path / "s", local_config(16)):
        pass
    for sub in ("index", "t/dram", "t/cxl", "t/nvme"):
        assert (tmp_path / "s" / sub / RESERVE_NAME).stat().st_size > 0


def test_a_file_size_limit_is_tier_full_not_an_io_error(tmp_path: Path) -> None:
    prog = textwrap.dedent(f"""
        import json, resource, signal, sys
        sys.path[:0] = [{str(ROOT / 'tests')!r}, {str(ROOT)!r}]
        import numpy as np
        from rkvtest import local_config, random_kv
        from test_full_disk import MODEL, N, seq
        from rkv import Engine
        from rkv.errors import RkvError
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)     # EFBIG instead of the signal
        e = Engine.open({str(tmp_path / 's')!r}, local_config(256))
        resource.setrlimit(resource.RLIMIT_FSIZE, (6 << 20, 6 << 20))
        out = {{"stored": []}}
        for i in range(40):
            try:
                e.put(seq(i), random_kv(MODEL, N, seed=i), model=MODEL)
                out["stored"].append(i)
            except RkvError as exc:
                out["error"] = type(exc).__name__
                break
        out["exact"] = all(bool(np.array_equal(e.get(seq(i), model=MODEL).kv,
                                               random_kv(MODEL, N, seed=i)))
                           for i in out["stored"])
        e.close()
        print(json.dumps(out))
    """)
    proc = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["error"] == "TierFullError" and out["stored"] and out["exact"]
