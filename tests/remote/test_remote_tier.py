"""The Redis tier against a real redis-server: round trips, config, misses, a server killed
and restarted, credentials that never show."""

from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from redis_server import (
    ACL_PASSWORD,
    ACL_USER,
    DEFAULT_PASSWORD,
    RedisServer,
    env_name,
    remote_config,
)
from rkvtest import SMALL, random_kv

from rkv import Engine, EngineConfig, TierConfig
from rkv.errors import ConfigError, StoreError, TierUnavailableError
from rkv.format.keys import as_token_array, block_key, chunk_keys
from rkv.tiers import TierSpec, open_tier
from rkv.tiers.redis_tier import RedisTier
from rkv.tiers.remote_config import RemoteSettings


def ns() -> str:
    return uuid.uuid4().hex[:12]


def tier(server: RedisServer, **kw: Any) -> RedisTier:
    settings = RemoteSettings.from_dict(server.url, {"namespace": ns(), "retry_after_s": 0.0,
                                                     **kw})
    t = open_tier(TierSpec("remote", 1 << 30, remote=settings), Path("unused"), False)
    assert isinstance(t, RedisTier)
    return t


def keys_of(tokens: Any, chunk: int = 16) -> list[bytes]:
    return chunk_keys(as_token_array(tokens), SMALL.fingerprint(), chunk)


# -- the tier ------------------------------------------------------------------------------
def test_tier_round_trip(redis_server: RedisServer) -> None:
    t = tier(redis_server, shared=False, window_bytes=1 << 16)
    buf = bytearray(b"x" * 100)

    def later() -> bytearray:     # a callable value, from a buffer reused afterwards
        return buf

    items = [(bytes([i]) * 34, bytes([i]) * (1000 + i)) for i in range(20)]
    t.put_many([*items, (b"\xee" * 34, later)])
    buf[:] = b"y" * 100
    assert t.get(b"\xee" * 34) == b"x" * 100
    with t.reader() as r:
        r.want([(k, len(v)) for k, v in items])      # batched in MGET windows
        for k, v in items:
            assert bytes(r.get(k)) == v               # type: ignore[arg-type]
        assert r.get(b"\x99" * 34) is None            # absent: a miss
    assert t.stats()["remote"]["mgets"] >= 1
    assert sorted(t.iter_keys()) == sorted([k for k, _ in items] + [b"\xee" * 34])
    assert t.delete_many([items[0][0], b"\x99" * 34]) == 1
    assert t.get(items[0][0]) is None
    t.clear()
    assert list(t.iter_keys()) == []
    t.close()


def test_shared_tier_never_deletes(redis_server: RedisServer) -> None:
    t = tier(redis_server)
    t.put(b"\x01" * 34, b"abc")
    assert t.delete_many([b"\x01" * 34]) == 0
    assert t.get(b"\x01" * 34) == b"abc"
    t.close()


def test_ttl_expires_values(redis_server: RedisServer) -> None:
    t = tier(redis_server, ttl_s=100)
    t.put(b"\x02" * 34, b"v")
    ttl = redis_server.client().ttl(t.key(b"\x02" * 34))   # type: ignore[attr-defined]
    assert 0 < ttl <= 100
    t.close()


# -- config --------------------------------------------------------------------------------
@pytest.mark.parametrize("bad, match", [
    ({"url": "redis://u:pw@h:1/0"}, "holds a password"),
    ({"url": "http://h:1"}, "scheme"),
    ({"url": ""}, "needs url"),
    ({"remote": {"password": "hunter2"}}, "env:VAR"),
    ({"remote": {"bogus": 1}}, "remote: unknown key"),
    ({"remote": {"mac_keys": {"k1": "env:X"}}}, "mac_key_id"),
    ({"remote": {"mac_keys": {"k1": "literal"}, "mac_key_id": "k1"}}, "env:VAR"),
    ({"remote": {"timeout_s": 0}}, "timeout_s"),
    ({"remote": {"namespace": "a b"}}, "namespace"),
    ({"remote": {"mac_keys": {"k1": "env:X"}, "mac_key_id": "k1", "mac_algorithm": "md5"}},
     "mac_algorithm"),
    ({"kind": "s3"}, "kind"),
])
def test_bad_remote_config(bad: dict[str, Any], match: str) -> None:
    base: dict[str, Any] = {"name": "remote", "kind": "redis", "url": "redis://h:6379/0"}
    with pytest.raises(ConfigError, match=match) as err:
        TierConfig.from_dict({**base, **bad})
    assert "hunter2" not in str(err.value) and ":pw@" not in str(err.value)


def test_lmdb_tier_refuses_url() -> None:
    with pytest.raises(ConfigError, match="kind = 'redis'"):
        TierConfig("t", url="redis://h/0")


def test_remote_config_round_trips_toml() -> None:
    cfg = remote_config("redis://127.0.0.1:1/0", "ns1", local=True, password="env:RKV_PW",
                        mac_keys={"k1": "env:RKV_K1"}, mac_key_id="k1")
    assert isinstance(cfg, EngineConfig)
    again = EngineConfig.from_toml(cfg.to_toml())
    assert again == cfg
    assert again.tier("remote").remote_settings().mac_key_id == "k1"


# -- the engine on a remote tier ------------------------------------------------------------
def test_engine_round_trip(tmp_path: Path, redis_server: RedisServer) -> None:
    tokens = list(range(70))
    kv = random_kv(SMALL, 70, seed=1)
    cfg = remote_config(redis_server.url, ns())
    with Engine.open(tmp_path / "s", cfg) as e:
        assert e.put(tokens, kv, model=SMALL).chunks_written == 5
        got = e.get(tokens, model=SMALL)
        assert got.n_tokens == 70
        np.testing.assert_array_equal(got.kv, kv)
        st = e.stats()["tiers"]["remote"]
        assert st["kind"] == "redis" and st["blocks"] == 5 * SMALL.n_layers
        assert e.verify().ok == 5 * SMALL.n_layers
    with Engine.open(tmp_path / "s") as e:      # reopened with its stored config
        np.testing.assert_array_equal(e.get(tokens, model=SMALL).kv, kv)


def test_missing_value_is_a_miss(tmp_path: Path, redis_server: RedisServer) -> None:
    """The server may drop any value (maxmemory eviction, expiry): a miss, forgotten, and
    a later put stores the chunk again."""
    tokens = list(range(64))
    kv = random_kv(SMALL, 64, seed=2)
    cfg = remote_config(redis_server.url, ns())
    with Engine.open(tmp_path / "s", cfg) as e:
        e.put(tokens, kv, model=SMALL)
        remote = e.tiers["remote"]
        assert isinstance(remote, RedisTier)
        k2 = keys_of(tokens)[2]
        redis_server.client().delete(remote.key(block_key(k2, 1)))  # type: ignore[attr-defined]
        got = e.get(tokens, model=SMALL)
        assert got.n_tokens == 32
        np.testing.assert_array_equal(got.kv, kv[:, :, :32])
        assert e.stats()["session"]["remote_forgotten"] == 2     # chunk 2 and the next
        assert e.lookup(tokens, model=SMALL) == 32
        assert e.put(tokens, kv, model=SMALL).chunks_written == 2   # both stored again
        np.testing.assert_array_equal(e.get(tokens, model=SMALL).kv, kv)


def test_maxmemory_eviction_never_wrong(tmp_path: Path, own_redis: RedisServer) -> None:
    """A server evicting values at random under maxmemory: every get returns a verified
    prefix of what was put."""
    c = own_redis.client()
    used = c.info("memory")["used_memory"]           # type: ignore[attr-defined]
    c.config_set("maxmemory", used + 250_000)         # type: ignore[attr-defined]
    c.config_set("maxmemory-policy", "allkeys-random")  # type: ignore[attr-defined]
    cfg = remote_config(own_redis.url, ns())
    seqs = [(list(range(1000 * i, 1000 * i + 96)), random_kv(SMALL, 96, seed=i))
            for i in range(40)]
    with Engine.open(tmp_path / "s", cfg) as e:
        for tokens, kv in seqs:
            e.put(tokens, kv, model=SMALL)
        short = 0
        for tokens, kv in seqs:
            got = e.get(tokens, model=SMALL)
            np.testing.assert_array_equal(got.kv, kv[:, :, :got.n_tokens])
            short += got.n_tokens < 96
        assert short > 0          # the server did evict


def test_server_killed_and_restarted(tmp_path: Path, own_redis: RedisServer) -> None:
    """Down: gets are misses (typed errors in their statuses), puts fail typed; restarted
    empty: misses, forgotten, stored again; never wrong KV."""
    tokens = list(range(48))
    kv = random_kv(SMALL, 48, seed=3)
    cfg = remote_config(own_redis.url, ns())
    with Engine.open(tmp_path / "s", cfg) as e:
        e.put(tokens, kv, model=SMALL)
        own_redis.stop()
        got = e.get(tokens, model=SMALL)
        assert got.n_tokens == 0
        bad = [b for b in got.blocks if b.status == "missing"]
        assert bad and all(isinstance(b.error, TierUnavailableError) for b in bad)
        with pytest.raises(TierUnavailableError):
            e.get(tokens, model=SMALL, strict=True)
        with pytest.raises(TierUnavailableError):
            e.put(list(range(500, 520)), random_kv(SMALL, 20, seed=4), model=SMALL)
        assert e.lookup(tokens, model=SMALL) == 48     # still indexed: not known gone
        own_redis.start()                               # back, empty
        got = e.get(tokens, model=SMALL)
        np.testing.assert_array_equal(got.kv, kv[:, :, :got.n_tokens])
        e.put(tokens, kv, model=SMALL)                  # forgotten chunks stored again
        got = e.get(tokens, model=SMALL)
        assert got.n_tokens == 48
        np.testing.assert_array_equal(got.kv, kv)


def test_down_at_open_then_recovers(tmp_path: Path, own_redis: RedisServer) -> None:
    own_redis.stop()
    cfg = remote_config(own_redis.url, ns())
    with Engine.open(tmp_path / "s", cfg) as e:
        assert e.get(list(range(20)), model=SMALL).n_tokens == 0
        own_redis.start()
        kv = random_kv(SMALL, 20, seed=5)
        e.put(list(range(20)), kv, model=SMALL)
        np.testing.assert_array_equal(e.get(list(range(20)), model=SMALL).kv, kv)


# -- credentials ---------------------------------------------------------------------------
def test_credentials_never_show(tmp_path: Path, auth_redis: RedisServer,
                                monkeypatch: pytest.MonkeyPatch,
                                caplog: pytest.LogCaptureFixture,
                                capsys: pytest.CaptureFixture[str]) -> None:
    var = env_name("pw")
    monkeypatch.setenv(var, ACL_PASSWORD)
    cfg = remote_config(auth_redis.url, ns(), username=ACL_USER, password=f"env:{var}")
    kv = random_kv(SMALL, 40, seed=6)
    caplog.set_level(logging.DEBUG)
    seen: list[str] = []
    with Engine.open(tmp_path / "s", cfg) as e:
        e.put(list(range(40)), kv, model=SMALL)
        np.testing.assert_array_equal(e.get(list(range(40)), model=SMALL).kv, kv)
        seen += [json.dumps(e.stats(), default=str), repr(e.tiers["remote"]),
                 repr(cfg), cfg.to_toml(), str(e.tiers["remote"].__dict__)]
        auth_redis.client().config_set("timeout", 0)   # type: ignore[attr-defined]
    from rkv.cli import main

    assert main(["info", str(tmp_path / "s")]) == 0
    assert main(["info", "--json", str(tmp_path / "s")]) == 0
    # Wrong or missing credentials: typed errors that name no secret.
    monkeypatch.setenv(var, "wrong-" + ACL_PASSWORD)
    with pytest.raises(StoreError) as err:
        Engine.open(tmp_path / "s2", cfg)
    seen.append(str(err.value))
    monkeypatch.delenv(var)
    with pytest.raises(ConfigError, match=var) as err2:
        Engine.open(tmp_path / "s3", cfg)
    seen.append(str(err2.value))
    out = capsys.readouterr()
    assert '"kind": "redis"' in out.out and " redis " in out.out   # info names the kind
    seen += [out.out, out.err, caplog.text]
    for text in seen:
        for secret in (ACL_PASSWORD, DEFAULT_PASSWORD):
            assert secret not in text


def test_acl_user_limited_to_its_keys(tmp_path: Path, auth_redis: RedisServer,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The ACL user may touch only rkv:* keys; the tier works with exactly that."""
    var = env_name("acl")
    monkeypatch.setenv(var, ACL_PASSWORD)
    t = tier(auth_redis, username=ACL_USER, password=f"env:{var}")
    t.put(b"\x05" * 34, b"ok")
    assert t.get(b"\x05" * 34) == b"ok"
    t.close()


def test_missing_server_fails_loudly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without redis-server the remote tests fail with a message, never skip silently."""
    import shutil

    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(pytest.fail.Exception, match="not installed"):
        RedisServer(tmp_path)


def test_peek_header() -> None:
    from rkv.errors import CorruptRecordError, TruncatedRecordError
    from rkv.format.record import RecordHeader, encode_array_record, peek_header

    block = random_kv(SMALL, 16, seed=9)[1]
    h = RecordHeader(key=bytes(range(32)), layer=1, fingerprint=SMALL.fingerprint(),
                     shape=block.shape, dtype="float16", data_len=0, payload_len=0,
                     written_ns=7)
    rec = bytearray(encode_array_record(h, block).tobytes())
    got, size = peek_header(rec[:1024])
    assert (got.key, got.layer, got.shape, got.written_ns, size) == (
        h.key, 1, block.shape, 7, len(rec))
    rec[40] ^= 1                                  # first header copy damaged: the second
    assert peek_header(rec[:1024])[0].key == h.key
    with pytest.raises(TruncatedRecordError):
        peek_header(rec[:10])
    assert peek_header(b"XXXX" + bytes(rec[4:1024]))[0].key == h.key   # one prelude lost
    with pytest.raises(CorruptRecordError):
        peek_header(b"X" * 16 + bytes(rec[16:1024]))
