"""Nothing acknowledged is lost: races held open with hooks, liveness, typed errors."""

from __future__ import annotations

import errno
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rkvtest import SMALL, HeldTier, local_config, random_kv

from rkv import (
    ConfigError,
    CorruptStoreError,
    Engine,
    EngineConfig,
    IntegrityError,
    ModelSpec,
    ReadOnlyStoreError,
    RkvError,
    StoreClosedError,
    StoreError,
    TierConfig,
    TierFullError,
)
from rkv.eval.demo import synthetic_kv
from rkv.format.keys import block_key

#: Bytes of one 16-token chunk of SMALL (3 layers) with no ECC, as the engine accounts it
#: (record format 2: each header copy carries the write time).
CHUNK = 2685


def toks(n: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(0, 30000, n).tolist()  # type: ignore[no-any-return]


def skv(t: list[int]) -> np.ndarray:
    return synthetic_kv(SMALL, np.asarray(t))


def exact(e: Engine, t: list[int]) -> bool:
    got = e.get(t, model=SMALL)
    return got.n_tokens == len(t) and np.array_equal(got.kv, skv(t))


def usage_matches_records(e: Engine) -> None:
    st = e.stats()
    for name, t in st["tiers"].items():
        assert t["records"] == t["blocks"], name
        tier = e.tiers[name]
        assert sum(len(tier.get(k) or b"") for k in tier.iter_keys()) == t["bytes"], name


class _Window:
    """Holds a race window open: the first thread to reach ``hook`` waits inside it until
    released; ``waiting`` tells when a second mutation is about to take the writer lock."""

    def __init__(self, e: Engine, hook: str) -> None:
        self.inside = threading.Event()
        self.release = threading.Event()
        self.waiting = threading.Event()
        self.owner: threading.Thread | None = None
        e.hooks[hook] = self._hold
        e.hooks["locking"] = self._locking

    def _hold(self) -> None:
        if self.owner is None:
            self.owner = threading.current_thread()
            self.inside.set()
            assert self.release.wait(30)

    def _locking(self) -> None:
        if self.owner is not None and threading.current_thread() is not self.owner:
            self.waiting.set()


def _race(e: Engine, first: Callable[[], Any], second: Callable[[], Any]) -> None:
    """Run ``first`` until it is between its index commit and its record deletions, then
    start ``second`` and let ``first`` finish once ``second`` is about to lock."""
    w = _Window(e, "committed")
    errors: list[BaseException] = []

    def run(fn: Callable[[], Any]) -> None:
        try:
            fn()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    a = threading.Thread(target=run, args=(first,))
    a.start()
    assert w.inside.wait(30)
    b = threading.Thread(target=run, args=(second,))
    b.start()
    assert w.waiting.wait(30)
    w.release.set()
    a.join(30)
    b.join(30)
    assert not a.is_alive() and not b.is_alive()
    assert not errors, errors
    e.hooks.clear()


@pytest.mark.parametrize("first", ["delete", "clear", "clear_model"])
def test_put_racing_a_deletion_survives(tmp_path: Path, first: str) -> None:
    t = toks(40)
    with Engine.open(tmp_path / "s", local_config(16)) as e:
        e.put(t, skv(t), model=SMALL)
        remove: dict[str, Callable[[], Any]] = {
            "delete": lambda: e.delete(t, model=SMALL),
            "clear": e.clear,
            "clear_model": lambda: e.clear(model=SMALL),
        }
        _race(e, remove[first], lambda: e.put(t, skv(t), model=SMALL))
        assert exact(e, t)
        assert e.verify().clean
        usage_matches_records(e)
        e.put(toks(64, seed=3), skv(toks(64, seed=3)), model=SMALL)
        assert exact(e, t)


def test_put_racing_an_eviction_survives(tmp_path: Path) -> None:
    """The evicting put frees a chunk; a put of that same chunk waits for its deletions."""
    cfg = local_config(16, caps=(1, 1, CHUNK * 7 // 2), on_full="evict")
    old, new = toks(16, seed=1), toks(48, seed=2)
    with Engine.open(tmp_path / "s", cfg) as e:
        e.put(old, skv(old), model=SMALL)
        _race(e, lambda: e.put(new, skv(new), model=SMALL),
              lambda: e.put(old, skv(old), model=SMALL))
        assert e.lookup(old, model=SMALL) in (0, 16)
        got = e.get(old, model=SMALL)
        assert all(b.status in ("ok", "corrected") for b in got.blocks)
        assert e.verify().clean
        usage_matches_records(e)


def test_index_never_lists_a_deleted_record_across_handles(tmp_path: Path) -> None:
    """Two engines on one store in one process share the writer lock."""
    t = toks(32)
    with Engine.open(tmp_path / "s", local_config(16)) as a, Engine.open(tmp_path / "s") as b:
        a.put(t, skv(t), model=SMALL)
        a.hooks.update(b.hooks)
        b.core.hooks = a.hooks
        b.core.mutator.hooks = a.hooks
        _race(a, lambda: a.delete(t, model=SMALL),
              lambda: b.put(t, skv(t), model=SMALL))
        assert exact(a, t) and exact(b, t)


# -- liveness -------------------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_last_tier_full_of_prefixes_still_evicts(tmp_path: Path) -> None:
    """The last tier holds only a prefix whose child sits in the upper tier (not a leaf)
    and the chunk being extended: eviction takes the prefix with its subtree instead of
    failing every put with TierFullError while nothing is pinned."""
    cfg = EngineConfig(chunk_tokens=16, on_full="evict", tiers=(
        TierConfig("dram", medium="memory", path="t/dram", capacity_bytes=CHUNK),
        TierConfig("nvme", medium="disk", path="t/nvme", capacity_bytes=2 * CHUNK),
    ))
    a, b, c = toks(16, seed=1), toks(16, seed=2), toks(16, seed=3)
    with Engine.open(tmp_path / "s", cfg) as e:
        for t in (a, b, c, a + toks(16, seed=4)):
            e.put(t, skv(t), model=SMALL)
        c1 = c + toks(16, seed=5)
        e.put(c1, skv(c1), model=SMALL)
        assert exact(e, c1)
        assert e.verify().clean
        usage_matches_records(e)


@pytest.mark.timeout(60)
def test_a_stale_policy_entry_cannot_wedge_a_put(tmp_path: Path) -> None:
    """A policy that names a chunk the index no longer has in that tier (changed behind its
    back) frees nothing: the entry is forgotten, the policies are rebuilt, puts go on."""
    cfg = local_config(16, caps=(CHUNK * 2, 1 << 30, 1 << 30), policy="lru")
    with Engine.open(tmp_path / "s", cfg) as e:
        t, u = toks(32), toks(32, seed=1)
        e.put(t, skv(t), model=SMALL)
        e.put(u, skv(u), model=SMALL)          # t is demoted to cxl
        e.pin(u, model=SMALL)                  # the only real dram chunks are pinned
        ix = e.core.index
        stale = list(e.core.decisions.policies["cxl"])
        for key in stale:                      # the dram policy believes t is still there
            e.core.decisions.policies["dram"].on_insert(
                e.core.decisions.policies["cxl"].item(key), 0.0)
        rebuilt = e.core.decisions.rebuilds
        for s in range(3):
            v = toks(32, seed=10 + s)
            e.put(v, skv(v), model=SMALL)
            assert exact(e, v)
        assert e.core.decisions.rebuilds > rebuilt
        assert exact(e, t) and exact(e, u)
        assert ix is e.core.index
        usage_matches_records(e)


def test_unmovable_damaged_record_is_dropped_not_wedged(tmp_path: Path) -> None:
    cfg = local_config(16, caps=(CHUNK * 2, 1 << 30, 1 << 30))
    with Engine.open(tmp_path / "s", cfg) as e:
        t = toks(32)
        e.put(t, skv(t), model=SMALL)
        with e.core.index.env.read() as txn:
            first = next(k for k, m in e.core.index.chunks(txn) if m and not m.parent)
        e.tiers["dram"].delete(block_key(first, 1))    # a record lost under the index
        for s in range(4):
            u = toks(32, seed=20 + s)
            e.put(u, skv(u), model=SMALL)
            assert exact(e, u)
        assert e.get(t, model=SMALL).n_tokens == 0      # reported, never wrong
        e.verify(repair=True)
        usage_matches_records(e)


# -- damage is contained -----------------------------------------------------------------------
def _corrupt_index_value(e: Engine, db: str, key: bytes, at: int = 3) -> None:
    ix = e.core.index

    def fn(txn: Any, pending: Any) -> None:
        d = getattr(ix, f"_{db}")
        v = bytearray(txn.get(key, db=d))
        v[at] ^= 0x01
        txn.put(key, bytes(v), db=d)

    e.core.mutate(fn)


def test_one_changed_character_in_the_tier_binding_drops_nothing(tmp_path: Path) -> None:
    t = toks(48)
    with Engine.open(tmp_path / "s", local_config(16)) as e:
        e.put(t, skv(t), model=SMALL)
        with e.core.index.env.read() as txn:
            raw = bytes(txn.get(b"tiers", db=e.core.index._meta))
        _corrupt_index_value(e, "meta", b"tiers", raw.index(b'"dram": "') + 12)  # dram's id
    with Engine.open(tmp_path / "s") as e:
        assert exact(e, t)
        assert e.verify().clean


def test_damaged_chunk_entry_is_a_typed_error_and_put_heals_it(tmp_path: Path) -> None:
    t = toks(48)
    with Engine.open(tmp_path / "s", local_config(16)) as e:
        e.put(t, skv(t), model=SMALL)
        with e.core.index.env.read() as txn:
            second = next(k for k, m in e.core.index.chunks(txn) if m and m.pos == 1)
        _corrupt_index_value(e, "chunks", second)
        assert e.lookup(t, model=SMALL) == 16
        got = e.get(t, model=SMALL)
        assert got.n_tokens == 16 and not got.ok
        assert isinstance(got.errors()[0], CorruptStoreError)
        with pytest.raises(IntegrityError):
            e.get(t, model=SMALL, strict=True)
        rep = e.verify()
        assert rep.unreadable_chunks == 1 and not rep.clean and rep.orphans == 0
        e.put(t, skv(t), model=SMALL)   # re-put heals the entry
        assert exact(e, t)
        assert e.verify(repair=True).unreadable_chunks == 0
        assert e.verify().clean
        usage_matches_records(e)


def test_damaged_tier_id_keeps_the_tier(tmp_path: Path) -> None:
    import lmdb

    t = toks(48)
    with Engine.open(tmp_path / "s", local_config(16)) as e:
        e.put(t, skv(t), model=SMALL)
    env = lmdb.open(str(tmp_path / "s" / "t" / "dram"), max_dbs=4)
    meta = env.open_db(b"meta")
    with env.begin(write=True) as txn:
        txn.put(b"store_id", b"\xff" * 32, db=meta)
    env.close()
    with Engine.open(tmp_path / "s") as e:
        assert e.tiers["dram"].state == "damaged"
        assert exact(e, t)                        # its intact records still read
        u = toks(32, seed=5)
        e.put(u, skv(u), model=SMALL)   # placed past the damaged tier
        assert exact(e, u)
        assert "dram" in e.verify().damaged_tiers


def test_orphans_are_reported_and_reclaimed_only_by_repair(tmp_path: Path) -> None:
    t = toks(32)
    with Engine.open(tmp_path / "s", local_config(16)) as e:
        e.put(t, skv(t), model=SMALL)
        e.tiers["nvme"].put(b"\x07" * 34, b"stray")
        assert e.verify().orphans == 1
    with Engine.open(tmp_path / "s") as e:      # reopening never deletes it
        assert e.verify().orphans == 1
        rep = e.verify(repair=True)
        assert rep.reclaimed == 1
        assert e.verify().orphans == 0 and exact(e, t)


def test_usage_is_recounted_by_repair(tmp_path: Path) -> None:
    t = toks(32)
    with Engine.open(tmp_path / "s", local_config(16)) as e:
        e.put(t, skv(t), model=SMALL)

        def leak(txn: Any, pending: Any) -> None:
            u = e.core.index.usage(txn)
            u.add("cxl", 5, 12345)
            e.core.index.set_usage(txn, u)

        e.core.mutate(leak)
        assert e.verify(repair=True).usage_fixed
        usage_matches_records(e)


def test_wiped_tier_drops_only_its_chunks_and_keeps_accounting(tmp_path: Path) -> None:
    import shutil

    cfg = local_config(16, caps=(CHUNK * 2, 1 << 30, 1 << 30))
    seqs = [toks(32, seed=s) for s in range(4)]
    with Engine.open(tmp_path / "s", cfg) as e:
        for s in seqs:
            e.put(s, skv(s), model=SMALL)
        in_cxl = e.stats()["tiers"]["cxl"]["blocks"]
        assert in_cxl > 0
    shutil.rmtree(tmp_path / "s" / "t" / "dram")    # a reboot, for a memory tier
    with Engine.open(tmp_path / "s") as e:
        assert e.dropped_at_open > 0
        assert e.stats()["tiers"]["cxl"]["blocks"] == in_cxl   # nothing else dropped
        usage_matches_records(e)
        rep = e.verify()
        assert rep.dropped == e.dropped_at_open and not rep.clean
        assert e.verify(repair=True).reclaimed == 0
        assert e.verify().clean


def test_renamed_tier_is_an_error_unless_dropped(tmp_path: Path) -> None:
    t = toks(32)
    with Engine.open(tmp_path / "s", local_config(16, caps=(1, 1 << 30, 1 << 30))) as e:
        e.put(t, skv(t), model=SMALL)
    renamed = EngineConfig(chunk_tokens=16, tiers=(
        TierConfig("fast", medium="memory", path="t/fast"),
        TierConfig("nvme", medium="disk", path="t/nvme"),
    ))
    with pytest.raises(ConfigError, match="drop_tiers"):
        Engine.open(tmp_path / "s", renamed)
    with Engine.open(tmp_path / "s", local_config(16)) as e:   # nothing was lost
        assert exact(e, t)
    with Engine.open(tmp_path / "s", renamed, drop_tiers=["cxl", "dram"]) as e:
        assert e.lookup(t, model=SMALL) == 0
        assert e.verify(repair=True).chunks == 0


# -- typed errors ------------------------------------------------------------------------------
def test_read_only_open_inspects_without_writing(tmp_path: Path) -> None:
    t = toks(32)
    with Engine.open(tmp_path / "s", local_config(16)) as e:
        e.put(t, skv(t), model=SMALL)
    before = (tmp_path / "s" / "index" / "data.mdb").read_bytes()
    with Engine.open(tmp_path / "s", readonly=True) as e:
        assert exact(e, t)
        assert e.verify().clean
        with pytest.raises(ReadOnlyStoreError):
            e.put(toks(16, seed=9), skv(toks(16, seed=9)), model=SMALL)
        for call in (lambda: e.delete(t, model=SMALL), e.clear,
                     lambda: e.verify(repair=True), lambda: e.pin(t, model=SMALL)):
            with pytest.raises(ReadOnlyStoreError):
                call()
    assert (tmp_path / "s" / "index" / "data.mdb").read_bytes() == before
    with pytest.raises(StoreError, match="not an rkv store"):
        Engine.open(tmp_path / "nothing", readonly=True)
    assert not (tmp_path / "nothing").exists()


def test_close_racing_a_get_waits_for_it(tmp_path: Path) -> None:
    t = toks(16)
    e = Engine.open(tmp_path / "s", local_config(16))
    e.put(t, skv(t), model=SMALL)
    slow = e.wrap_tier("dram", HeldTier)
    assert isinstance(slow, HeldTier)
    results: list[Any] = []
    g = threading.Thread(target=lambda: results.append(e.get(t, model=SMALL)))
    g.start()
    assert slow.reading.wait(30)
    closer = threading.Thread(target=e.close)
    closer.start()
    slow.release.set()
    g.join(30)
    closer.join(30)
    assert results and results[0].n_tokens == 16
    assert np.array_equal(results[0].kv, skv(t))
    with pytest.raises(StoreClosedError):
        e.get(t, model=SMALL)


def test_reopen_in_a_forked_child(tmp_path: Path) -> None:
    import multiprocessing as mp

    t = toks(32)
    path = tmp_path / "s"
    with Engine.open(path, local_config(16)) as e:
        e.put(t, skv(t), model=SMALL)
        q: Any = mp.get_context("fork").Queue()

        def child() -> None:
            try:
                with Engine.open(path) as c:
                    u = toks(16, seed=4)
                    c.put(u, skv(u), model=SMALL)
                    q.put(exact(c, t) and exact(c, u))
            except BaseException as exc:
                q.put(repr(exc))

        p = mp.get_context("fork").Process(target=child)
        p.start()
        assert q.get(timeout=60) is True
        p.join(30)
        assert exact(e, t) and exact(e, toks(16, seed=4))


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EROFS, errno.EIO])
def test_os_errors_become_typed(err: int) -> None:
    from rkv.tiers.lmdbenv import translate

    out = translate(OSError(err, "x"), "here")
    assert isinstance(out, RkvError)
    assert isinstance(out, TierFullError) == (err == errno.ENOSPC)
    assert isinstance(out, ReadOnlyStoreError) == (err == errno.EROFS)


def test_map_never_resizes_under_readers(tmp_path: Path) -> None:
    """Readers in threads while a writer fills far past the old 64 MiB initial map."""
    t = toks(64)
    with Engine.open(tmp_path / "s", local_config(16)) as e:
        e.put(t, skv(t), model=SMALL)
        size = e.tiers["dram"].stats()["map_bytes"]
        stop = threading.Event()
        bad: list[str] = []

        def read() -> None:
            while not stop.is_set():
                if not exact(e, t):
                    bad.append("read")

        readers = [threading.Thread(target=read) for _ in range(2)]
        for r in readers:
            r.start()
        spec = ModelSpec("test/big", n_layers=4, n_kv_heads=8, head_dim=64, dtype="float16")
        for s in range(12):     # 8 MiB a put: about 100 MiB in all
            u = toks(1024, seed=1000 + s)
            e.put(u, random_kv(spec, 1024, seed=s), model=spec)
        stop.set()
        for r in readers:
            r.join(30)
        assert not bad
        assert e.tiers["dram"].stats()["map_bytes"] == size


def test_format_1_store_is_upgraded_in_place(tmp_path: Path) -> None:
    """A store written by the previous release (index format 1, memory tiers inside the
    store): opened, upgraded to the current format, read back exactly, pins kept."""
    import tarfile

    with tarfile.open(Path(__file__).parent / "golden" / "store_v1.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    seqs = [np.random.default_rng(s).integers(0, 30000, 40).tolist() for s in range(4)]
    with Engine.open(tmp_path / "store", readonly=True) as e:   # read without upgrading
        assert all(exact(e, t) for t in seqs)
    with Engine.open(tmp_path / "store") as e:
        assert e.core.index.format == 3 and e.migrated_from == 1
        assert all(exact(e, t) for t in seqs)
        assert e.stats()["pinned_chunks"] == 3
        assert e.verify().clean
        usage_matches_records(e)
    with Engine.open(tmp_path / "store") as e:
        assert e.delete(seqs[1], model=SMALL) == 3
        assert all(exact(e, t) for t in seqs if t != seqs[1])


def test_failed_open_releases_its_handles(tmp_path: Path) -> None:
    import rkv.tiers.lmdbenv as lmdbenv

    with Engine.open(tmp_path / "s", local_config(16)):
        pass
    before = dict(lmdbenv._open)
    with pytest.raises(ConfigError):
        Engine.open(tmp_path / "s", local_config(32))         # chunk_tokens is fixed
    renamed = EngineConfig(chunk_tokens=16, tiers=(TierConfig("x", path="t/x"),))
    with Engine.open(tmp_path / "s", local_config(16)) as e:
        e.put(toks(16), skv(toks(16)), model=SMALL)
    with pytest.raises(ConfigError):
        Engine.open(tmp_path / "s", renamed)                  # tiers the config lacks
    assert lmdbenv._open == before


def test_cli_verify_reports_dropped_chunks_until_repaired(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    import shutil

    from rkv.cli import main

    cfg = local_config(16, caps=(CHUNK * 2, 1 << 30, 1 << 30))
    with Engine.open(tmp_path / "s", cfg) as e:
        for s in range(3):
            t = toks(32, seed=s)
            e.put(t, skv(t), model=SMALL)
    shutil.rmtree(tmp_path / "s" / "t" / "dram")
    assert main(["verify", str(tmp_path / "s")]) == 1       # read-only: reported missing
    assert "6 missing" in capsys.readouterr().out
    with Engine.open(tmp_path / "s", readonly=True) as e:
        got = e.get(toks(32, seed=2), model=SMALL)
        assert got.n_tokens == 0 and got.counts["missing"] == 3
    with Engine.open(tmp_path / "s"):                        # the first writable open drops
        pass
    assert main(["verify", str(tmp_path / "s")]) == 1       # ... and says so until repaired
    assert main(["verify", "--repair", str(tmp_path / "s")]) == 0
    assert main(["verify", str(tmp_path / "s")]) == 0
    capsys.readouterr()


def test_nested_hold_keeps_the_writer_lock(tmp_path: Path) -> None:
    """A structure check inside a mutation takes the writer lock again; leaving it must not
    release the flock that keeps other processes out of the rest of the mutation."""
    import fcntl
    import os

    with Engine.open(tmp_path / "s", local_config(16)) as e:
        seen: list[str] = []

        def probe() -> None:
            e.core.index.check()                       # a nested hold, ended inside the mutation
            fd = os.open(e.core.index.env.path / "writer.lock", os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                seen.append("free")
                fcntl.flock(fd, fcntl.LOCK_UN)
            except BlockingIOError:
                seen.append("held")
            finally:
                os.close(fd)

        e.hooks["locked"] = probe
        e.put(toks(16), skv(toks(16)), model=SMALL)
        assert seen == ["held"]
