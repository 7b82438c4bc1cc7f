"""TierWrapper and unwrap: what a wrapper forwards (what its tier is, read live), what it routes
through its own primitives (get, fetch, put, delete), and how the tiers under wrappers are
found (the remote tier under a fault-injecting wrapper included)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from redis_server import RedisServer
from rkvtest import SMALL, local_config, random_kv

from rkv import Engine
from rkv.errors import CorruptStoreError
from rkv.store.remote_share import remote_of
from rkv.tiers import LmdbTier, Tier, TierReader, TierSpec, TierWrapper, unwrap
from rkv.tiers.faulty import FaultyTier
from rkv.tiers.redis_tier import RedisTier
from rkv.tiers.remote_config import RemoteSettings


@pytest.fixture
def lmdb(tmp_path: Path) -> Iterator[LmdbTier]:
    tier = LmdbTier(TierSpec("t", 1 << 30), tmp_path / "t")
    yield tier
    tier.close()


class Counting(TierWrapper):
    """Counts the primitives it is asked for and marks what its reader returns."""

    def __init__(self, inner: Tier) -> None:
        super().__init__(inner)
        self.calls: list[str] = []

    @contextmanager
    def _reader(self) -> Iterator[Any]:
        with self.inner.reader() as r:
            class Marked:
                def get(self, key: bytes) -> memoryview | None:
                    v = r.get(key)
                    return None if v is None else memoryview(b"seen:" + bytes(v))
            yield Marked()

    def reader(self) -> AbstractContextManager[TierReader]:
        self.calls.append("reader")
        return self._reader()

    def put_many(self, items: Any, *, reserve: int = 0) -> None:
        self.calls.append("put_many")
        super().put_many(items, reserve=reserve)

    def delete_many(self, keys: Any) -> int:
        self.calls.append("delete_many")
        return super().delete_many(keys)


def test_conveniences_run_through_the_wrappers_primitives(lmdb: LmdbTier) -> None:
    """A wrapper that overrides reader, put_many and delete_many sees every get, fetch, put
    and delete (they are not forwarded to the inner tier's own)."""
    t = Counting(lmdb)
    t.put(b"k", b"v")
    assert t.get(b"k") == b"seen:v"
    assert t.fetch(b"k") == (b"seen:v", ())
    assert t.delete(b"k") is True
    assert t.calls == ["put_many", "reader", "reader", "delete_many"]
    assert lmdb.get(b"k") is None


def test_what_the_tier_is_is_read_live(lmdb: LmdbTier) -> None:
    """State and damage come from the inner tier when asked (not copied when wrapped): a
    tier marked damaged under two wrappers is damaged through them, and refuses writes."""
    t = FaultyTier(TierWrapper(lmdb))
    assert (t.state, t.damage, t.spec, t.shared) == ("new", None, lmdb.spec, False)
    lmdb.mark_damaged("a test says so")
    assert (t.state, t.damage) == ("damaged", "a test says so")
    with pytest.raises(CorruptStoreError):
        t.put(b"k", b"v")
    with pytest.raises(AttributeError):
        t.state = "ok"   # type: ignore[misc]


def test_unwrap_walks_the_chain(lmdb: LmdbTier) -> None:
    bare = TierWrapper(lmdb)
    faulty = FaultyTier(bare)
    outer = TierWrapper(faulty)
    assert unwrap(outer) is lmdb and unwrap(lmdb) is lmdb
    assert unwrap(outer, FaultyTier) is faulty
    assert unwrap(outer, TierWrapper) is outer        # the outermost one of the class
    assert unwrap(faulty, LmdbTier) is lmdb
    assert unwrap(bare, FaultyTier) is None
    assert unwrap(lmdb, TierWrapper) is None
    assert remote_of(outer) is None


def test_the_remote_tier_is_found_under_wrappers(redis_server: RedisServer) -> None:
    settings = RemoteSettings(url=redis_server.url, namespace=uuid.uuid4().hex[:12])
    remote = RedisTier(TierSpec("r", 1 << 30, remote=settings), settings)
    try:
        t = TierWrapper(FaultyTier(remote))
        assert remote_of(t) is remote and remote_of(remote) is remote
        assert t.shared is True and t.store_id == remote.store_id
    finally:
        remote.close()


def test_placement_skips_a_wrapped_tier_found_damaged(tmp_path: Path) -> None:
    """The engine asks a wrapped tier its state after checking it: once the tier under the
    wrapper is damaged, puts go to the next tier instead of failing on the damaged one."""
    with Engine.open(tmp_path / "s", local_config(16)) as e:
        wrapped = e.wrap_tier("dram", TierWrapper)
        assert isinstance(wrapped, TierWrapper)
        kv = random_kv(SMALL, 16)
        tokens = list(range(16))
        unwrap(wrapped, LmdbTier).mark_damaged("damaged by the test")  # type: ignore[union-attr]
        put = e.put(tokens, kv, model=SMALL)
        assert put.chunks_written == 1 and "dram" not in put.tiers
        got = e.get(tokens, model=SMALL)
        assert got.n_tokens == 16 and np.array_equal(got.kv, kv)
