"""``reads = "pread"``: records copied out of the data file, so a medium failure is a typed
MediumError with its ranges (decoded as erasures), never a SIGBUS."""

from __future__ import annotations

import errno
import mmap
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rkvtest import SMALL, local_config, random_kv

from rkv import ConfigError, Engine, MediumError, TierConfig
from rkv.format.keys import as_token_array, block_key, chunk_keys
from rkv.tiers import safe_read
from rkv.tiers.safe_read import PAGE, MapFile


def pread_engine(path: Path, ecc: str) -> Engine:
    cfg = local_config(16, repair=False)
    cfg = replace(cfg, tiers=tuple(replace(t, ecc=ecc, reads="pread") for t in cfg.tiers))
    return Engine.open(path, cfg)


def test_pread_round_trip(tmp_path: Path) -> None:
    with pread_engine(tmp_path / "s", "rs(255,239)") as e:
        kv = random_kv(SMALL, 48)
        e.put(list(range(48)), kv, model=SMALL)
        got = e.get(list(range(48)), model=SMALL)
        assert got.ok and np.array_equal(got.kv, kv)
        assert all(b.status == "ok" for b in got.blocks)


def test_reads_setting_is_validated() -> None:
    with pytest.raises(ConfigError, match="reads must be"):
        TierConfig("t", reads="mmapp")


def test_eio_pages_become_erasures_the_code_rebuilds(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The file read fails with EIO on one page of a block's record (as a read of a
    hardware-poisoned page does): the engine gets the failed range and RS rebuilds it (with
    interleave 128 a 4 KiB page puts 32 erasures, n - k, into each codeword)."""
    bad: set[int] = set()
    real = os.preadv

    def preadv(fd: int, bufs: list[Any], off: int) -> int:
        n = sum(memoryview(b).nbytes for b in bufs)
        first, last = off // PAGE, (off + n - 1) // PAGE
        if any(p in bad for p in range(first, last + 1)):
            raise OSError(errno.EIO, "Input/output error")
        return real(fd, bufs, off)

    model = replace(SMALL, head_dim=256)      # 32 KiB blocks: several pages each
    with pread_engine(tmp_path / "s", "rs(255,223,interleave=128)") as e:
        kv = random_kv(model, 16)
        e.put(list(range(16)), kv, model=model)
        key = block_key(chunk_keys(as_token_array(list(range(16))), model.fingerprint(),
                                   16)[0], 2)
        tier = e.tiers["dram"]
        with tier.env.read() as txn:  # type: ignore[attr-defined]
            view = txn.get(key, db=tier._blocks)  # type: ignore[attr-defined]
            addr = np.frombuffer(view, np.uint8).__array_interface__["data"][0]
            start = tier._file._locate(addr)  # type: ignore[attr-defined]
        bad.add(start // PAGE + 2)            # a page inside the payload
        monkeypatch.setattr(safe_read.os, "preadv", preadv)
        with pytest.raises(MediumError) as info:
            tier.get(key)
        (lo, n), = info.value.ranges
        assert n == PAGE and (start + lo) % PAGE == 0
        got = e.get(list(range(16)), model=model)
        assert got.ok and np.array_equal(got.kv, kv)
        assert got.blocks[2].status == "corrected" and got.blocks[2].corrected >= PAGE // 8
        bad.clear()


def test_a_short_file_is_a_lost_range_not_a_sigbus(tmp_path: Path) -> None:
    """A mapped file cut short under its map: touching the map past the end would raise
    SIGBUS; the pread path reports the missing tail as a lost range."""
    f = tmp_path / "data.mdb"
    payload = np.random.default_rng(0).integers(0, 256, 4 * PAGE, dtype=np.uint8)
    f.write_bytes(payload.tobytes())
    with open(f, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), 4 * PAGE, prot=mmap.PROT_READ)
    try:
        view = memoryview(mm)[PAGE + 100:3 * PAGE + 50]
        os.truncate(f, 2 * PAGE)
        mf = MapFile(f)
        try:
            with pytest.raises(MediumError) as info:
                mf.read(view, b"k")
        finally:
            mf.close()
        assert info.value.ranges == ((PAGE - 100, PAGE + 50),)
        data = np.frombuffer(info.value.data, np.uint8)     # type: ignore[arg-type]
        assert np.array_equal(data[:PAGE - 100], payload[PAGE + 100:2 * PAGE])
        assert not data[PAGE - 100:].any()
        view.release()
    finally:
        mm.close()
