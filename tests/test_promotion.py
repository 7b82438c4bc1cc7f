"""Background moves up the tiers: a long prefetch is cut into short mutations, and a read
never waits for a move (both held open with the mutation hooks, not timed)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
from rkvtest import SMALL, local_config, random_kv

from rkv import Engine
from rkv.store.promotion import BATCH

CHUNK = 16


def toks(n: int, seed: int) -> list[int]:
    return [int(x) for x in np.random.default_rng(seed).integers(0, 30000, n)]


def store_in_nvme(tmp_path: Path, n_chunks: int) -> tuple[Path, list[int], np.ndarray]:
    """A store whose one sequence sits in nvme (dram and cxl hold one chunk at most)."""
    path = tmp_path / "s"
    seq, kv = toks(n_chunks * CHUNK, 1), random_kv(SMALL, n_chunks * CHUNK, 1)
    with Engine.open(path, local_config(CHUNK, caps=(3000, 3000, 1 << 30), promote="never")) as e:
        e.put(seq, kv, model=SMALL)
    return path, seq, kv


def test_a_long_prefetch_is_cut_into_short_mutations(tmp_path: Path) -> None:
    n = 3 * BATCH + 1
    path, seq, kv = store_in_nvme(tmp_path, n)
    with Engine.open(path, local_config(CHUNK, promote="never")) as e:
        locks: list[str] = []
        e.hooks["locked"] = lambda: locks.append(threading.current_thread().name)
        res = e.prefetch(seq, model=SMALL, tier="dram").result(60)
        assert res.promoted >= n - 1 and res.failed == 0
        mine = [t for t in locks if t.startswith("rkv-promote")]
        assert len(mine) == -(-res.chunks // BATCH)     # one writer-lock turn per batch
        got = e.get(seq, model=SMALL)
        assert got.n_tokens == len(seq) and np.array_equal(got.kv, kv)
        assert e.verify().clean


def test_a_budgeted_prefetch_stays_one_mutation(tmp_path: Path) -> None:
    path, seq, _ = store_in_nvme(tmp_path, 2 * BATCH)
    with Engine.open(path, local_config(CHUNK, promote="never")) as e:
        locks: list[str] = []
        e.hooks["locked"] = lambda: locks.append(threading.current_thread().name)
        e.prefetch(seq, model=SMALL, tier="dram", budget=1 << 30).result(60)
        assert len([t for t in locks if t.startswith("rkv-promote")]) == 1


def test_a_read_never_waits_for_a_move(tmp_path: Path, monkeypatch: Any) -> None:
    import rkv.store.decisions

    monkeypatch.setattr(rkv.store.decisions, "_REPORTED", 1)   # every read asks for a flush
    path, seq, _ = store_in_nvme(tmp_path, 2)
    hot, hot_kv = toks(CHUNK, 7), random_kv(SMALL, CHUNK, 7)
    with Engine.open(path, local_config(CHUNK, promote="never")) as e:
        e.put(hot, hot_kv, model=SMALL)
        inside, release = threading.Event(), threading.Event()

        def hold() -> None:         # the move holds the writer lock until released
            if threading.current_thread().name.startswith("rkv-promote") and \
                    not release.is_set():
                inside.set()
                assert release.wait(60)

        e.hooks["locked"] = hold
        moving = e.prefetch(seq, model=SMALL, tier="dram")
        assert inside.wait(60)
        results: list[Any] = []
        reader = threading.Thread(target=lambda: results.append(e.get(hot, model=SMALL)))
        reader.start()
        reader.join(30)
        done_while_held = not reader.is_alive() and not release.is_set()
        release.set()
        reader.join(30)
        assert done_while_held, "the read waited for the move's writer lock"
        assert np.array_equal(results[0].kv, hot_kv)
        assert moving.result(60).failed == 0
        e.settle(60)
