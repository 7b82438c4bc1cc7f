"""The shared tier on a real 3-master Redis Cluster (tests/redis_cluster.py): batched reads
across slots, a master killed or hung mid-read (only its keys fail, in bounded time), slot
migration (MOVED and ASK) and two engines sharing prefixes through the cluster."""

from __future__ import annotations

import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from redis_cluster import RedisTestCluster
from redis_server import remote_config
from rkvtest import SMALL, random_kv

from rkv import Engine
from rkv.errors import ConfigError, TierUnavailableError
from rkv.tiers import TierSpec, open_tier
from rkv.tiers.redis_cluster import RedisClusterTier
from rkv.tiers.remote_config import RemoteSettings, redact_url

#: A hang guard only (never a timing assertion): far above give_up_s of the tiers below.
HANG_GUARD_S = 60.0


def ns() -> str:
    return uuid.uuid4().hex[:12]


def open_cluster_tier(url: str, **remote: object) -> RedisClusterTier:
    settings = RemoteSettings(url=url, namespace=ns(), **{  # type: ignore[arg-type]
        "retry_after_s": 0.0, "timeout_s": 1.0, "connect_timeout_s": 0.5, **remote})
    tier = open_tier(TierSpec("c", 1 << 30, remote=settings), Path("unused"), readonly=False)
    assert isinstance(tier, RedisClusterTier)
    return tier


def records(n: int, size: int = 4096) -> list[tuple[bytes, bytes]]:
    rng = np.random.default_rng(n)
    return [(b"blk-%d" % i, rng.bytes(size)) for i in range(n)]


@pytest.fixture
def tier(redis_cluster: RedisTestCluster) -> Iterator[RedisClusterTier]:
    t = open_cluster_tier(redis_cluster.url)
    yield t
    t.close()


def test_cluster_urls_are_checked_and_redacted() -> None:
    ok = RemoteSettings(url="redis+cluster://alice@10.0.0.1:7000,[::1]:7001/")
    assert redact_url(ok.url) == "redis+cluster://10.0.0.1:7000,::1:7001/"
    assert "alice" not in repr(ok)
    for bad, says in [("redis+cluster://10.0.0.1/", "host:port"),
                      ("redis+cluster://a:1,,b:2/", "host:port"),
                      ("redis+cluster://a:99999/", "host:port"),
                      ("redis+cluster://a:1/3", "one database"),
                      ("redis+cluster://u:secret@a:1/", "password"),
                      ("valkey://a:1/", "scheme")]:
        with pytest.raises(ConfigError, match=says) as caught:
            RemoteSettings(url=bad)
        assert "secret" not in str(caught.value)


def test_tls_options_need_a_tls_cluster_url(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="rediss"):
        open_cluster_tier("redis+cluster://127.0.0.1:1/", tls_ca=str(tmp_path / "ca.pem"))


def test_batched_reads_span_many_slots(tier: RedisClusterTier) -> None:
    """500 records over the three nodes: one window, per-node MGETs, exact bytes (a cross-slot
    MGET would be a CROSSSLOT error)."""
    items = records(500)
    tier.put_many(items)
    with tier.reader() as r:
        r.want([(k, len(v)) for k, v in items])
        got = [r.get(k) for k, _ in items]
    assert [bytes(g) if g is not None else None for g in got] == [v for _, v in items]
    stats = tier.stats()
    assert stats["remote"]["mgets"] == 1 and stats["remote"]["hits"] == 500
    assert len(stats["nodes"]) == 3 and set(stats["nodes"].values()) == {"ok"}
    assert sorted(tier.iter_keys()) == sorted(k for k, _ in items)
    assert tier.lengths([items[0][0], b"absent"]) == [4096, 0]


def dead_node_read(cluster: RedisTestCluster, how: int) -> None:
    """Read records in windows; between the first window and the rest (the test's own hook:
    the reader fetches a window when its first key is read), one master is killed
    (``SIGKILL``) or hung (``SIGSTOP``)."""
    tier = open_cluster_tier(cluster.url, window_bytes=1 << 16, retry_after_s=3600.0)
    items = records(120)          # 16 records a window: 8 windows
    tier.put_many(items)
    owner = {k: n for n, at in tier.node_groups([k for k, _ in items]).items()
             for k in (items[i][0] for i in at)}
    with tier.reader() as r:
        r.want([(k, len(v)) for k, v in items])
        first = r.get(items[0][0])
        assert first is not None and bytes(first) == items[0][1]
        victim = next(n for n in sorted(set(owner.values())) if n != owner[items[0][0]])
        node = cluster.node_of(victim)
        assert node.proc is not None
        node.proc.send_signal(how)
        start = time.monotonic()
        lost = 0
        for k, v in items[1:]:
            if owner[k] == victim and k not in (x for x, _ in items[:16]):
                with pytest.raises(TierUnavailableError, match=victim):
                    r.get(k)
                lost += 1
            else:
                got = r.get(k)
                assert got is not None and bytes(got) == v
        assert time.monotonic() - start < HANG_GUARD_S     # returned (a hang guard)
    assert lost > 10
    stats = tier.stats()
    assert stats["nodes"][victim] == "damaged" and stats["state"] == "ok"
    assert sum(v == "ok" for v in stats["nodes"].values()) == 2
    # Marked down once: the victim was asked in one window (one failure, one wait), the
    # later windows' keys of it failed at once.
    assert stats["remote"]["down"] == 1 and stats["remote"]["unavailable"] >= 2
    tier.close()


def test_a_killed_master_fails_only_its_keys(own_cluster: RedisTestCluster) -> None:
    dead_node_read(own_cluster, signal.SIGKILL)


def test_a_hung_master_fails_only_its_keys_in_bounded_time(
        own_cluster: RedisTestCluster) -> None:
    dead_node_read(own_cluster, signal.SIGSTOP)
    for n in own_cluster.nodes:          # let it go, so it stops cleanly
        if n.proc is not None:
            n.proc.send_signal(signal.SIGCONT)


def test_a_node_back_serves_again(own_cluster: RedisTestCluster) -> None:
    """A hung node, taken as down, is asked again after retry_after_s and serves."""
    tier = open_cluster_tier(own_cluster.url, retry_after_s=0.0, timeout_s=0.5)
    items = records(60)
    tier.put_many(items)
    node = own_cluster.nodes[0]
    assert node.proc is not None
    node.proc.send_signal(signal.SIGSTOP)
    name = f"127.0.0.1:{node.port}"
    with tier.reader() as r:
        r.want([(k, len(v)) for k, v in items])
        errors = 0
        for k, _ in items:
            try:
                r.get(k)
            except TierUnavailableError:
                errors += 1
        assert errors > 0
    node.proc.send_signal(signal.SIGCONT)
    deadline = time.monotonic() + HANG_GUARD_S
    while tier.stats()["nodes"][name] != "ok":     # down for as long as the call waited
        assert time.monotonic() < deadline
        time.sleep(0.05)
    with tier.reader() as r:
        r.want([(k, len(v)) for k, v in items])
        for k, v in items:
            got = r.get(k)
            assert got is not None and bytes(got) == v
    tier.close()


def cli(port: int, *args: str) -> str:
    return subprocess.run(["redis-cli", "-p", str(port), *args], capture_output=True,
                          text=True, check=True, timeout=10).stdout.strip()


def test_slot_migration_keeps_reads_right(own_cluster: RedisTestCluster) -> None:
    """A slot moves between masters mid-run (CLUSTER SETSLOT MIGRATING/IMPORTING, MIGRATE,
    SETSLOT NODE): the tier's slot map goes stale, ASK and MOVED replies redirect it, every
    read returns the right bytes."""
    tier = open_cluster_tier(own_cluster.url)
    items = records(200)
    tier.put_many(items)
    key, value = items[0]
    name = tier.key(key)
    slot = int(cli(own_cluster.nodes[0].port, "cluster", "keyslot", name.decode()))
    src = own_cluster.node_of(tier.node_groups([key]).popitem()[0])
    dst = next(n for n in own_cluster.nodes if n is not src)
    src_id, dst_id = (cli(n.port, "cluster", "myid") for n in (src, dst))
    in_slot = [k for k, _ in items if int(cli(src.port, "cluster", "keyslot",
                                              tier.key(k).decode())) == slot]

    def read_all() -> None:
        with tier.reader() as r:
            r.want([(k, len(v)) for k, v in items])
            for k, v in items:
                got = r.get(k)
                assert got is not None and bytes(got) == v, k

    read_all()
    cli(dst.port, "cluster", "setslot", str(slot), "importing", src_id)
    cli(src.port, "cluster", "setslot", str(slot), "migrating", dst_id)
    cli(src.port, "migrate", "127.0.0.1", str(dst.port), "", "0", "5000", "keys",
        *(tier.key(k).decode() for k in in_slot))
    assert key in in_slot     # src answers ASK: the key is on dst now
    assert cli(src.port, "exists", name.decode()).startswith("ASK")
    read_all()                                        # ASK: the key is on dst already
    for n in own_cluster.nodes:
        cli(n.port, "cluster", "setslot", str(slot), "node", dst_id)
    read_all()                                        # MOVED: the slot is dst's now
    got = tier.get(key)
    assert got is not None and bytes(got) == value
    tier.close()


def test_two_engines_share_prefixes_through_the_cluster(
        tmp_path: Path, redis_cluster: RedisTestCluster) -> None:
    cfg = remote_config(redis_cluster.url, ns(), local=True)
    kv = random_kv(SMALL, 70, seed=3)
    with Engine.open(tmp_path / "a", cfg) as a:
        a.put(list(range(70)), kv, model=SMALL)
    with Engine.open(tmp_path / "b", cfg) as b:      # a second engine, its own index
        assert b.lookup(list(range(70)), model=SMALL) == 70
        got = b.get(list(range(70)), model=SMALL)
        assert got.n_tokens == 70
        np.testing.assert_array_equal(got.kv, kv)
        st = b.stats()
        assert st["session"]["remote_adopted"] == 5
        assert st["tiers"]["remote"]["kind"] == "redis-cluster"
        assert len(st["tiers"]["remote"]["nodes"]) == 3


def test_a_cluster_that_cannot_start_leaves_no_server(tmp_path: Path) -> None:
    """A node that fails to start (a port too high for a cluster bus) stops the others."""
    from rkv.errors import StoreError
    from rkv.tiers.local_redis import LocalCluster

    cluster = LocalCluster(tmp_path)
    cluster.nodes[2].port = 60000
    with pytest.raises(StoreError, match="did not start"):
        cluster.start()
    assert [n.proc for n in cluster.nodes] == [None, None, None]


@pytest.mark.parametrize("which", ["latest-first-chunk", "slot-0-owner"])
def test_a_dead_master_leaves_the_prefix_on_the_live_nodes_adoptable(
        tmp_path: Path, own_cluster: RedisTestCluster, which: str) -> None:
    """The shared-prefix probe asks each node apart: with one master killed, a second
    engine adopts the chunks up to the first one with a layer on the dead node (its own
    prefix), instead of missing the whole prefix as a cross-node probe would. The victim is
    the node whose first chunk comes latest, or the owner of slot 0: the cluster client's
    default node, where a PING at the open goes (a CI run once took the whole tier as down
    at the open when that node was the one killed)."""
    from rkv.format.keys import as_token_array, block_key, chunk_keys

    tokens = list(range(70))
    keys = chunk_keys(as_token_array(tokens), SMALL.fingerprint(), 16)
    from redis.cluster import RedisCluster

    raw = RedisCluster(host="127.0.0.1", port=own_cluster.nodes[0].port)
    # A namespace whose layout puts all of chunk 0 off some node (7 in 9 do).
    for _ in range(40):
        space = ns()
        first: dict[str, int] = {}
        for i, k in enumerate(keys):
            for layer in range(SMALL.n_layers):
                name = f"rkv:{space}:{block_key(k, layer).hex()}"
                first.setdefault(raw.get_node_from_key(name).name, i)
        if which == "slot-0-owner":
            victim = raw.nodes_manager.get_node_from_slot(0).name
            expect = first.get(victim, len(keys))
        else:
            victim, expect = max(((n, first.get(n, len(keys))) for n in
                                  (f"127.0.0.1:{x.port}" for x in own_cluster.nodes)),
                                 key=lambda t: t[1])
        if expect > 0:
            break
    else:
        pytest.fail("no namespace put chunk 0 off a node in 40 tries")
    raw.close()
    cfg = remote_config(own_cluster.url, space, local=True)
    kv = random_kv(SMALL, 70, seed=5)
    with Engine.open(tmp_path / "a", cfg) as a:
        a.put(tokens, kv, model=SMALL)
    node = next(x for x in own_cluster.nodes if f"127.0.0.1:{x.port}" == victim)
    node.stop(signal.SIGKILL)
    with Engine.open(tmp_path / "b", cfg) as b:
        want = min(expect * 16, 70)
        assert b.lookup(tokens, model=SMALL) == want
        got = b.get(tokens, model=SMALL)
        assert got.n_tokens == want
        np.testing.assert_array_equal(got.kv, kv[:, :, :want])
