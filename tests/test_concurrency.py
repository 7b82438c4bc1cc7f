"""Several processes on one store: readers while writers write, no lost update, no torn record."""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from rkvtest import SMALL, local_config

from rkv import Engine, StoreClosedError
from rkv.eval.demo import synthetic_kv

N_SEQS = 24


def seq(i: int) -> np.ndarray:
    """Sequences that share prefixes: every fourth one branches off a common base."""
    rng = np.random.default_rng(i)
    base = np.arange(64) % 7
    return np.concatenate([base[: 16 * (i % 4)], rng.integers(0, 500, 40)])


def writer(path: str, order: list[int], q: mp.Queue) -> None:  # type: ignore[type-arg]
    try:
        with Engine.open(path) as e:
            for i in order:
                s = seq(i)
                e.put(s, synthetic_kv(SMALL, s), model=SMALL)
        q.put(("ok", os.getpid()))
    except BaseException as exc:  # pragma: no cover - reported to the parent
        q.put(("error", repr(exc)))


def reader(path: str, rounds: int, q: mp.Queue) -> None:  # type: ignore[type-arg]
    try:
        seen = 0
        with Engine.open(path) as e:
            for r in range(rounds):
                s = seq(r % N_SEQS)
                got = e.get(s, model=SMALL)
                bad = [b for b in got.blocks if b.status not in ("ok", "missing")]
                if bad:
                    q.put(("error", f"blocks {bad}"))
                    return
                want = synthetic_kv(SMALL, s[: got.n_tokens])
                if got.n_tokens and not np.array_equal(got.kv, want):
                    q.put(("error", f"wrong KV for sequence {r % N_SEQS}"))
                    return
                seen += got.n_tokens > 0
        q.put(("ok", seen))
    except BaseException as exc:  # pragma: no cover
        q.put(("error", repr(exc)))


def test_readers_and_writers_in_parallel(tmp_path: Path) -> None:
    path = str(tmp_path / "store")
    # Small upper tiers so writers also demote while readers read.
    with Engine.open(path, local_config(16, caps=(200_000, 300_000, 1 << 30))):
        pass
    ctx = mp.get_context("spawn")
    q: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    order = list(range(N_SEQS))
    procs = [
        ctx.Process(target=writer, args=(path, order, q)),
        ctx.Process(target=writer, args=(path, order[::-1], q)),
        ctx.Process(target=reader, args=(path, 150, q)),
        ctx.Process(target=reader, args=(path, 150, q)),
    ]
    for p in procs:
        p.start()
    results = [q.get(timeout=240) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert all(kind == "ok" for kind, _ in results), results
    with Engine.open(path) as e:
        for i in range(N_SEQS):
            s = seq(i)
            got = e.get(s, model=SMALL)
            assert got.n_tokens == len(s) and np.array_equal(got.kv, synthetic_kv(SMALL, s))
        rep = e.verify()
        assert rep.clean and rep.orphans == 0
        # No lost update: every chunk was counted once, and the shared ones have their kids.
        st = e.stats()
        expected = {tuple(seq(i)[: min(c + 16, len(seq(i)))].tolist())
                    for i in range(N_SEQS) for c in range(0, len(seq(i)), 16)}
        assert st["chunks"] == len(expected)
        for name, t in st["tiers"].items():
            assert t["records"] == t["blocks"], name     # usage accounting lost nothing
            stored = sum(len(e.tiers[name].get(k) or b"") for k in e.tiers[name].iter_keys())
            assert stored == t["bytes"], name


@pytest.mark.skipif(sys.platform == "win32", reason="fork")
def test_engine_is_not_usable_across_fork(tmp_path: Path) -> None:
    e = Engine.open(tmp_path / "s", local_config(16))
    ctx = mp.get_context("fork")
    q: mp.Queue = ctx.Queue()  # type: ignore[type-arg]

    def child() -> None:
        try:
            e.lookup([1, 2], model=SMALL)
            q.put("no error")
        except StoreClosedError:
            q.put("StoreClosedError")

    p = ctx.Process(target=child)
    p.start()
    assert q.get(timeout=30) == "StoreClosedError"
    p.join()
    e.close()
