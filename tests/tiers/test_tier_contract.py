"""The contract of rkv.tiers.base.Tier, run by every tier: LMDB, Redis (a real server, not
shared and shared), a bare TierWrapper and a FaultyTier with a zero-rate fault model around
LMDB, and a Redis Cluster tier (a real 3-master cluster); and the contract of the stand-in
for a tier that cannot be opened (UnavailableTier, bare and wrapped), whose every access is
a typed integrity error.

What every openable tier promises: exact bytes back from get, fetch and a reader, whatever
bytes-like value or callable was written; None for a missing key; put_many all or none
(a full tier raises TierFullError and keeps what it had); delete_many counts what existed
(a shared tier deletes nothing); iter_keys, records and stats agree with what was written;
a reader's buffers stay valid until it ends; clear empties the tier; close is idempotent and
later calls raise StoreClosedError.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from redis_cluster import RedisTestCluster, run_cluster
from redis_server import RedisServer, serve

import faultmodels
from rkv.errors import (
    CorruptStoreError,
    IntegrityError,
    MissingRecordError,
    StoreClosedError,
    TierFullError,
)
from rkv.tiers import LmdbTier, Tier, TierSpec, TierWrapper, UnavailableTier, open_tier, unwrap
from rkv.tiers.faulty import FaultyTier

#: The map of a small LMDB tier: 1 MiB fills after about a dozen 64 KiB records (a small
#: Redis tier is a namespace on a server with 4 MiB of memory).
SMALL_MAP = 1 << 20
VALUE = 1 << 16


@dataclass
class Kind:
    """How to open a fresh, empty tier of one kind: ``open(small)``, where a small tier
    fills up after a few MiB."""

    name: str
    open: Callable[[bool], Tier]


def zero_rate(inner: Tier) -> FaultyTier:
    """A FaultyTier drawing every read's errors from a raw bit error rate of 0."""
    model = faultmodels.get_model({"model": "raw-ber", "ber": 0.0})
    rng = np.random.default_rng(0)
    return FaultyTier(inner, seed=1, transient=lambda key, n: model.sample(n, 1.0, rng))


def lmdb_opener(tmp_path: Path) -> Callable[[bool], Tier]:
    def open_lmdb(small: bool) -> Tier:
        spec = TierSpec("t", SMALL_MAP if small else 1 << 30,
                        map_bytes=SMALL_MAP if small else 0)
        return LmdbTier(spec, tmp_path / uuid.uuid4().hex)
    return open_lmdb


def redis_opener(request: pytest.FixtureRequest, shared: bool,
                 cluster: bool = False) -> Callable[[bool], Tier]:
    from rkv.tiers.redis_cluster import RedisClusterTier
    from rkv.tiers.redis_tier import RedisTier
    from rkv.tiers.remote_config import RemoteSettings

    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed: the Redis tier's contract needs a real "
                    "server (scripts/test.sh installs it)")

    def open_redis(small: bool) -> Tier:
        if cluster:
            nodes: RedisTestCluster = request.getfixturevalue(
                "full_cluster" if small else "contract_cluster")
            if small:
                nodes.flush()    # the tests that fill these servers leave them full
            url = nodes.url
        else:
            server: RedisServer = request.getfixturevalue(
                "full_redis" if small else "redis_server")
            if small:
                server.flush()       # the tests that fill this server leave it full
            url = server.url
        settings = RemoteSettings(url=url, namespace=uuid.uuid4().hex[:12],
                                  shared=shared, retry_after_s=0.0, timeout_s=2.0,
                                  connect_timeout_s=1.0)
        return (RedisClusterTier if cluster else RedisTier)(
            TierSpec("t", 1 << 30, remote=settings), settings)
    return open_redis


@pytest.fixture(scope="session")
def full_redis() -> Iterator[RedisServer]:
    """A server with 4 MiB of memory that refuses writes when it is full."""
    yield from serve(("--maxmemory", "4mb", "--maxmemory-policy", "noeviction"))


@pytest.fixture(scope="session")
def contract_cluster() -> Iterator[RedisTestCluster]:
    yield from run_cluster()


@pytest.fixture(scope="session")
def full_cluster() -> Iterator[RedisTestCluster]:
    """A cluster of 4 MiB masters that refuse writes when full."""
    yield from run_cluster(("--maxmemory", "4mb", "--maxmemory-policy", "noeviction"))


KINDS = ["lmdb", "redis", "redis-shared", "redis-cluster", "wrapper-lmdb", "faulty-lmdb"]


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Kind]:
    name = request.param
    opened: list[Tier] = []
    if name.startswith("redis"):
        base = redis_opener(request, shared=name == "redis-shared",
                            cluster=name == "redis-cluster")
    else:
        base = lmdb_opener(tmp_path)
    wrap: Callable[[Tier], Tier] = {"wrapper-lmdb": TierWrapper,
                                    "faulty-lmdb": zero_rate}.get(name, lambda t: t)

    def open_kind(small: bool = False) -> Tier:
        tier = wrap(base(small))
        opened.append(tier)
        return tier

    yield Kind(name, open_kind)
    for tier in opened:
        if isinstance(tier, FaultyTier):        # a zero rate injects nothing, ever
            assert tier.log == []
        tier.close()


@pytest.fixture
def tier(kind: Kind) -> Tier:
    return kind.open(False)


def expect_deletes(tier: Tier, keys: list[bytes], model: dict[bytes, bytes]) -> int:
    """What delete_many(keys) returns by the contract (and model updated): how many of
    ``keys`` existed, or 0 and nothing deleted on a shared tier."""
    if tier.shared:
        return 0
    n = sum(1 for k in keys if k in model)
    for k in keys:
        model.pop(k, None)
    return n


def check_holds(tier: Tier, model: dict[bytes, bytes]) -> None:
    """The tier holds exactly ``model``: listing, counts, copies and one reader's views."""
    assert sorted(tier.iter_keys()) == sorted(model)
    assert tier.records() == len(model)
    assert tier.stats()["records"] in (None, len(model))
    for k, v in model.items():
        assert tier.get(k) == v
        assert tier.fetch(k) == (v, ())
    with tier.reader() as r:
        want = getattr(r, "want", None)     # a remote reader batches announced keys
        if want is not None:
            want([(k, len(v)) for k, v in model.items()])
        for k, v in model.items():
            got = r.get(k)
            assert got is not None and bytes(got) == v


# -- values: what put_many takes --------------------------------------------------------------
KEYS = [bytes([i]) * 32 for i in range(6)]
keys = st.one_of(st.sampled_from(KEYS), st.binary(min_size=1, max_size=64))
values = st.binary(min_size=0, max_size=4096)
FORMS = ["bytes", "bytearray", "memoryview", "numpy", "callable"]


def as_form(v: bytes, form: str) -> Any:
    """``v`` as one of the value forms put_many accepts."""
    if form == "bytearray":
        return bytearray(v)
    if form == "memoryview":
        return memoryview(v)
    if form == "numpy":
        return np.frombuffer(v, dtype=np.uint8).copy()
    if form == "callable":
        return lambda: v
    return v


batch = st.lists(st.tuples(keys, values, st.sampled_from(FORMS)), max_size=6,
                 unique_by=lambda kv: kv[0])
ops = st.lists(st.one_of(
    st.tuples(st.just("put_many"), batch),
    st.tuples(st.just("put"), keys, values),
    st.tuples(st.just("delete_many"), st.lists(keys, max_size=6, unique=True)),
    st.tuples(st.just("delete"), keys),
), max_size=12)


@settings(max_examples=40)
@given(script=ops)
def test_writes_read_back_exactly(tier: Tier, script: list[tuple[Any, ...]]) -> None:
    """Any sequence of puts and deletes: the tier holds what a dict would, byte for byte."""
    tier.clear()
    model: dict[bytes, bytes] = {}
    for op, *args in script:
        if op == "put_many":
            tier.put_many([(k, as_form(v, f)) for k, v, f in args[0]],
                          reserve=sum(len(v) for _, v, _ in args[0]))
            model.update((k, v) for k, v, _ in args[0])
        elif op == "put":
            k, v = args
            tier.put(k, v)
            model[k] = v
        elif op == "delete_many":
            expected = expect_deletes(tier, args[0], model)
            assert tier.delete_many(iter(args[0])) == expected   # any iterable of keys
        else:
            expected = expect_deletes(tier, [args[0]], model)
            assert tier.delete(args[0]) is (expected == 1)
    check_holds(tier, model)


def test_callables_may_reuse_one_buffer(tier: Tier) -> None:
    """Each callable's value is copied before the next one runs (one reused buffer)."""
    buf = bytearray(VALUE)

    def fill(i: int) -> Callable[[], bytearray]:
        def make() -> bytearray:
            buf[:] = bytes([i]) * VALUE
            return buf
        return make

    tier.put_many([(k, fill(i)) for i, k in enumerate(KEYS)], reserve=VALUE * len(KEYS))
    check_holds(tier, {k: bytes([i]) * VALUE for i, k in enumerate(KEYS)})


def test_a_large_record_reads_back_exactly(tier: Tier) -> None:
    v = np.random.default_rng(5).integers(0, 256, 3 << 20, dtype=np.uint8)
    tier.put(KEYS[0], v)
    check_holds(tier, {KEYS[0]: v.tobytes()})


def test_missing_keys(tier: Tier) -> None:
    tier.put(KEYS[0], b"there")
    assert tier.get(KEYS[1]) is None
    assert tier.fetch(KEYS[1]) == (None, ())
    with tier.reader() as r:
        assert r.get(KEYS[1]) is None
    assert tier.delete(KEYS[1]) is False
    assert tier.delete_many([KEYS[1], KEYS[2]]) == 0
    assert tier.delete_many([]) == 0
    check_holds(tier, {KEYS[0]: b"there"})


def test_a_readers_buffers_live_until_it_ends(tier: Tier) -> None:
    """Views a reader returned keep their bytes while the records change under it."""
    old, new = b"a" * 20000, b"b" * 20000
    tier.put_many([(KEYS[0], old), (KEYS[1], b"short")])
    with tier.reader() as r:
        first, second = r.get(KEYS[0]), r.get(KEYS[1])
        assert first is not None and second is not None
        tier.put(KEYS[0], new)
        tier.delete(KEYS[1])
        tier.put(KEYS[2], new)
        assert bytes(first) == old and bytes(second) == b"short"
    assert tier.get(KEYS[0]) == new
    assert tier.get(KEYS[1]) == (b"short" if tier.shared else None)


def test_clear_removes_every_record(tier: Tier) -> None:
    tier.put_many([(k, k * 3) for k in KEYS])
    tier.clear()
    check_holds(tier, {})
    tier.put(KEYS[0], b"again")
    check_holds(tier, {KEYS[0]: b"again"})


def test_what_the_tier_says_of_itself(tier: Tier) -> None:
    assert tier.name == tier.spec.name == "t"
    assert tier.state in ("new", "ok") and tier.damage is None
    assert isinstance(tier.shared, bool)
    sid = tier.store_id
    assert isinstance(sid, str) and sid and sid == tier.store_id
    assert sid == unwrap(tier).store_id
    tier.ensure_checked()
    tier.ensure_checked()
    tier.put(KEYS[0], b"x" * 100)
    stats = tier.stats()
    assert stats["records"] in (None, 1)
    assert isinstance(stats["map_bytes"], int) and isinstance(stats["file_bytes"], int)
    assert tier.store_id == sid


def test_a_full_tier_raises_and_keeps_what_it_had(kind: Kind) -> None:
    """Filled with 64 KiB records until a write fails: TierFullError, the failed batch left
    nothing behind, the records before it read back, and room made lets writes in again."""
    tier = kind.open(True)
    model: dict[bytes, bytes] = {}
    for i in range(1000):
        batch = [(b"%d-%d" % (i, j), bytes([i % 256, j]) * (VALUE // 2)) for j in range(2)]
        try:
            tier.put_many(batch, reserve=2 * VALUE)
        except TierFullError:
            assert all(tier.get(k) is None for k, _ in batch)
            break
        model.update(batch)
    else:
        pytest.fail("the small tier never filled")
    assert len(model) >= 4
    check_holds(tier, model)
    if tier.shared:
        tier.clear()
        model.clear()
    else:
        gone = sorted(model)[:4]
        assert tier.delete_many(gone) == 4
        for k in gone:
            del model[k]
    tier.put(b"after", b"z" * 1000)
    model[b"after"] = b"z" * 1000
    check_holds(tier, model)


def test_close_is_idempotent_and_final(tier: Tier) -> None:
    tier.put(KEYS[0], b"x")
    tier.close()
    tier.close()
    with pytest.raises(StoreClosedError):
        tier.get(KEYS[0])
    with pytest.raises(StoreClosedError):
        tier.put_many([(KEYS[1], b"y")])


# -- a tier that cannot be opened ---------------------------------------------------------------
UNAVAILABLE = ["damaged", "missing", "wrapper-damaged", "faulty-missing"]


@pytest.fixture(params=UNAVAILABLE)
def unavailable(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Tier]:
    spec = TierSpec("t", 1 << 30)
    if "damaged" in request.param:
        (tmp_path / "file").write_bytes(b"not a directory")
        inner = open_tier(spec, tmp_path / "file", readonly=False)
    else:
        inner = UnavailableTier(spec, tmp_path / "gone", "missing (wiped?)", missing=True)
    assert isinstance(inner, UnavailableTier)
    tier = {"wrapper": TierWrapper, "faulty": zero_rate}.get(
        request.param.split("-")[0], lambda t: t)(inner)
    yield tier
    tier.close()


def test_unavailable_tier_fails_every_access(unavailable: Tier) -> None:
    """Every read, write, listing and count raises the tier's integrity error (a miss to a
    cache user): MissingRecordError when it is missing, CorruptStoreError when damaged."""
    tier = unavailable
    error = MissingRecordError if tier.state == "missing" else CorruptStoreError
    assert tier.state in ("missing", "damaged")
    assert tier.damage and "cannot be opened" in tier.damage
    assert tier.store_id == ""
    assert issubclass(error, IntegrityError)
    calls: list[Callable[[], Any]] = [
        lambda: tier.get(KEYS[0]), lambda: tier.fetch(KEYS[0]),
        lambda: tier.put(KEYS[0], b"x"), lambda: tier.put_many([(KEYS[0], b"x")]),
        lambda: tier.delete(KEYS[0]), lambda: tier.delete_many([KEYS[0]]),
        lambda: list(tier.iter_keys()), tier.records, tier.clear,
    ]
    for call in calls:
        with pytest.raises(error) as caught:
            call()
        assert type(caught.value) is error and str(caught.value) == tier.damage
    with tier.reader() as r, pytest.raises(error):
        r.get(KEYS[0])
    stats = tier.stats()
    assert (stats["records"], stats["map_bytes"], stats["file_bytes"]) == (None, 0, 0)
    assert stats["state"] == tier.state and stats["error"] == tier.damage
    tier.close()
    tier.close()
    with pytest.raises(error):
        tier.get(KEYS[0])
