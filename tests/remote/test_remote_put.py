"""Puts through a shared remote tier: a chunk counts as stored only when the server holds it
and, on an authenticated tier, its values verify under this node's keys; a hung or down
server fails a put with TierUnavailableError within the documented bound."""

from __future__ import annotations

import hashlib
import hmac
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from redis_server import RedisServer, remote_config
from rkvtest import SMALL, random_kv

from rkv import Engine
from rkv.errors import AuthenticationError, TierUnavailableError
from rkv.format.keys import as_token_array, block_key, chunk_keys
from rkv.format.record_mac import MAC_BYTES, MAGIC
from rkv.tiers.redis_tier import RedisTier

TOKS = list(range(48))          # 3 chunks of 16 tokens
KEY = os.urandom(32)


def ns() -> str:
    return uuid.uuid4().hex[:12]


@pytest.fixture
def mac_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    var = f"RKV_TEST_PUT_MAC_{os.getpid()}"
    monkeypatch.setenv(var, KEY.hex())
    return {"mac_keys": {"k1": f"env:{var}"}, "mac_key_id": "k1"}


def block_names(t: RedisTier, toks: list[int]) -> list[bytes]:
    """The server keys of every block of ``toks`` (chunk by chunk, layer by layer)."""
    keys = chunk_keys(as_token_array(toks), SMALL.fingerprint(), 16)
    return [t.key(block_key(k, layer)) for k in keys for layer in range(SMALL.n_layers)]


def remote(e: Engine) -> RedisTier:
    t = e.tiers["remote"]
    assert isinstance(t, RedisTier)
    return t


# -- a keyless writer cannot void an honest put ----------------------------------------------
def fake_envelope(record: bytes) -> bytes:
    """A well-formed envelope (magic, current version, HMAC-SHA256, key id "k1") around a
    genuine record, with a MAC its writer could not compute (it has no key)."""
    from rkv.format.record_mac import VERSION

    return MAGIC + bytes([VERSION, 2, 2, 0]) + b"k1" + os.urandom(MAC_BYTES) + record


@pytest.mark.parametrize("local", [False, True])
def test_keyless_writer_cannot_void_an_honest_put(tmp_path: Path, redis_server: RedisServer,
                                                  mac_env: dict[str, Any], local: bool) -> None:
    """A writer without the MAC key plants well-formed records in fake envelopes under the
    (public, content-addressed) block keys before the honest node puts: the honest put does
    not adopt them, it overwrites and counts them, and every keyed node then reads the KV."""
    space = ns()
    kv = random_kv(SMALL, 48, seed=1)
    with Engine.open(tmp_path / "plain", remote_config(redis_server.url, space)) as plain:
        plain.put(TOKS, kv, model=SMALL)             # genuine records, no envelope
        names = block_names(remote(plain), TOKS)
    c: Any = redis_server.client()
    for name in names:
        c.set(name, fake_envelope(c.get(name)))
    cfg = remote_config(redis_server.url, space, local=local, **mac_env)
    with Engine.open(tmp_path / "honest", cfg) as honest:
        res = honest.put(TOKS, kv, model=SMALL)
        assert res.chunks_written == 3 and res.chunks_deduped == 0
        got = honest.get(TOKS, model=SMALL)
        assert got.n_tokens == 48
        np.testing.assert_array_equal(got.kv, kv)
        assert honest.stats()["tiers"]["remote"]["remote"]["auth_rejected"] >= 1
        assert honest.stats()["session"]["remote_probe_rejected"] >= 1
        t = remote(honest)
        for name in names:                           # every value overwritten, sealed
            bk = bytes.fromhex(name[len(t.key(b"")):].decode())
            assert t.open_value(bk, c.get(name))
    with Engine.open(tmp_path / "other", remote_config(redis_server.url, space,
                                                       **mac_env)) as other:
        got = other.get(TOKS, model=SMALL)
        assert got.n_tokens == 48 and other.stats()["session"]["remote_adopted"] == 3
        np.testing.assert_array_equal(got.kv, kv)


def test_put_adopts_only_verified_chunks(tmp_path: Path, redis_server: RedisServer,
                                         mac_env: dict[str, Any]) -> None:
    """Another keyed node's chunks are adopted by a put (nothing written); a chunk with one
    bad value is not: it and the chunks after it are written."""
    space = ns()
    kv = random_kv(SMALL, 48, seed=2)
    cfg = remote_config(redis_server.url, space, **mac_env)
    with Engine.open(tmp_path / "a", cfg) as a:
        a.put(TOKS, kv, model=SMALL)
        names = block_names(remote(a), TOKS)
    with Engine.open(tmp_path / "b", cfg) as b:
        assert b.put(TOKS, kv, model=SMALL).chunks_written == 0      # all verified
    c: Any = redis_server.client()
    v = bytearray(c.get(names[4]))                  # chunk 1, layer 1: one byte
    v[-1] ^= 1
    c.set(names[4], bytes(v))
    with Engine.open(tmp_path / "c", cfg) as e:
        res = e.put(TOKS, kv, model=SMALL)
        assert (res.chunks_deduped, res.chunks_written) == (1, 2)
        np.testing.assert_array_equal(e.get(TOKS, model=SMALL).kv, kv)
    assert bytes(c.get(names[4])) != bytes(v)       # the bad value was overwritten


# -- the server lost the values between two puts ------------------------------------------
def lose_values(how: str, server: RedisServer, names: list[bytes]) -> None:
    c: Any = server.client()
    if how == "restart":
        server.restart()
    elif how == "flushall":
        c.flushall()
    elif how == "expired":
        for name in names:
            c.pexpire(name, 1)
        deadline = time.monotonic() + 10
        while c.exists(*names) and time.monotonic() < deadline:
            time.sleep(0.005)       # polling the server's clock until the keys expired
        assert not c.exists(*names)
    else:                           # evicted: maxmemory took the values of one chunk
        c.delete(*names[3:6])


@pytest.mark.parametrize("how", ["restart", "flushall", "expired", "evicted"])
@pytest.mark.parametrize("authenticated", [False, True])
def test_reput_after_the_server_lost_the_values(tmp_path: Path, own_redis: RedisServer,
                                                mac_env: dict[str, Any], how: str,
                                                authenticated: bool) -> None:
    """A put of a prefix this node stored on the shared tier asks the server, not only the
    local index: the values the server lost are stored again, and the get finds them."""
    kv = random_kv(SMALL, 48, seed=3)
    cfg = remote_config(own_redis.url, ns(), **(mac_env if authenticated else {}))
    with Engine.open(tmp_path / "s", cfg) as e:
        assert e.put(TOKS, kv, model=SMALL).chunks_written == 3
        names = block_names(remote(e), TOKS)
        lose_values(how, own_redis, names)
        res = e.put(TOKS, kv, model=SMALL)
        lost = 1 if how == "evicted" else 3
        assert (res.chunks_written, res.chunks_deduped) == (lost, 3 - lost)
        assert e.stats()["session"]["remote_gone"] == lost
        got = e.get(TOKS, model=SMALL)
        assert got.n_tokens == 48 and got.counts["missing"] == 0
        np.testing.assert_array_equal(got.kv, kv)
        assert e.put(TOKS, kv, model=SMALL).chunks_written == 0    # all there now


def test_reput_of_an_adopted_prefix_after_a_flush(tmp_path: Path, redis_server: RedisServer
                                                  ) -> None:
    """Node B adopted node A's chunks (blocks of the shared tier in B's index); after the
    server lost them, B's put stores them again."""
    space = ns()
    kv = random_kv(SMALL, 48, seed=4)
    cfg = remote_config(redis_server.url, space, local=True)
    with Engine.open(tmp_path / "a", remote_config(redis_server.url, space)) as a:
        a.put(TOKS, kv, model=SMALL)
        names = block_names(remote(a), TOKS)
    with Engine.open(tmp_path / "b", cfg) as b:
        assert b.lookup(TOKS, model=SMALL) == 48            # adopted
        redis_server.client().delete(*names)                # type: ignore[attr-defined]
        res = b.put(TOKS, kv, model=SMALL)
        assert res.chunks_written == 3 and res.tiers == {"dram": 3}
        np.testing.assert_array_equal(b.get(TOKS, model=SMALL).kv, kv)
    with Engine.open(tmp_path / "c", cfg) as c:             # written through again
        np.testing.assert_array_equal(c.get(TOKS, model=SMALL).kv, kv)


# -- a hung server ---------------------------------------------------------------------------
#: The test's timeouts (seconds); the bound is what docs/remote.md documents for them:
#: connect_timeout_s + 2 * timeout_s.
HUNG = {"timeout_s": 0.5, "connect_timeout_s": 0.5, "retries": 2}
BOUND = 0.5 + 2 * 0.5
#: Time the test allows on top of the bound for rkv's own work (encoding, the index).
SLACK = 0.5


@pytest.fixture
def hung(own_redis: RedisServer) -> Iterator[RedisServer]:
    """``own_redis``; ``hang()`` stops the process (SIGSTOP: connections are accepted by the
    kernel, nothing answers), continued before the fixture stops it."""
    yield own_redis
    if own_redis.proc is not None:
        own_redis.proc.send_signal(signal.SIGCONT)


def hang(server: RedisServer) -> None:
    assert server.proc is not None
    server.proc.send_signal(signal.SIGSTOP)


def timed_put(e: Engine, toks: list[int], kv: Any) -> tuple[Any, float]:
    t0 = time.monotonic()
    try:
        out: Any = e.put(toks, kv, model=SMALL)
    except Exception as exc:
        out = exc
    return out, time.monotonic() - t0


@pytest.mark.parametrize("retry_after_s", [0.0, 1.0])
def test_put_against_a_hung_server(tmp_path: Path, hung: RedisServer,
                                   retry_after_s: float) -> None:
    """New chunks, and chunks already stored there: TierUnavailableError (not TierFullError)
    within the bound; the engine recovers when the server answers again."""
    kv = random_kv(SMALL, 48, seed=5)
    cfg = remote_config(hung.url, ns(), retry_after_s=retry_after_s, **HUNG)
    with Engine.open(tmp_path / "s", cfg) as e:
        e.put(TOKS, kv, model=SMALL)
        hang(hung)
        for toks in (list(range(100, 148)), TOKS):      # new; stored before the hang
            out, took = timed_put(e, toks, random_kv(SMALL, 48, seed=6))
            assert isinstance(out, TierUnavailableError), out
            assert took < BOUND + SLACK, took
            assert "unavailable" in str(out)
        t0 = time.monotonic()
        got = e.get(TOKS, model=SMALL)                  # a miss, not forgotten
        assert time.monotonic() - t0 < BOUND + SLACK
        assert got.n_tokens == 0
        assert all(isinstance(b.error, TierUnavailableError)
                   for b in got.blocks if b.status == "missing")
        assert hung.proc is not None
        hung.proc.send_signal(signal.SIGCONT)
        t = remote(e)
        deadline = time.monotonic() + 30
        while t.state == "damaged" and time.monotonic() < deadline:
            time.sleep(0.01)        # waiting out the tier's retry window, not a race
        np.testing.assert_array_equal(e.get(TOKS, model=SMALL).kv, kv)
        assert e.put(list(range(100, 148)), kv, model=SMALL).chunks_written == 3
    assert cfg.tier("remote").remote_settings().give_up_s == BOUND      # what docs say


def test_put_with_a_local_tier_against_a_hung_server(tmp_path: Path, hung: RedisServer
                                                     ) -> None:
    """With a local tier the put is stored there; the write-through fails (counted) within
    the same bound: a hung server is not waited on twice by one put."""
    cfg = remote_config(hung.url, ns(), local=True, **HUNG)
    kv = random_kv(SMALL, 48, seed=7)
    with Engine.open(tmp_path / "s", cfg) as e:
        e.put(TOKS, kv, model=SMALL)
        hang(hung)
        out, took = timed_put(e, list(range(200, 248)), kv)
        assert not isinstance(out, Exception), out
        assert out.chunks_written == 3 and out.tiers == {"dram": 3}
        assert took < BOUND + SLACK, took
        assert e.stats()["session"]["remote_write_errors"] == 1


@pytest.mark.slow
def test_put_against_a_hung_server_default_timeouts(tmp_path: Path, hung: RedisServer) -> None:
    """The default settings: a put fails within connect_timeout_s + 2 * timeout_s = 12 s."""
    cfg = remote_config(hung.url, ns(), timeout_s=5.0, connect_timeout_s=2.0)
    settings = cfg.tier("remote").remote_settings()
    assert settings.give_up_s == 12.0
    with Engine.open(tmp_path / "s", cfg) as e:
        e.put(TOKS, random_kv(SMALL, 48, seed=8), model=SMALL)
        hang(hung)
        out, took = timed_put(e, list(range(100, 148)), random_kv(SMALL, 48, seed=9))
        assert isinstance(out, TierUnavailableError) and took < settings.give_up_s + SLACK


# -- the MAC binds the namespace, and the envelope version --------------------------------
def test_record_copied_to_another_namespace_fails(tmp_path: Path, redis_server: RedisServer,
                                                  mac_env: dict[str, Any]) -> None:
    """Values sealed in namespace A, copied under the same block keys into namespace B, fail
    B's MAC: not adopted, not returned; B's put stores its own."""
    space_a, space_b = ns(), ns()
    kv = random_kv(SMALL, 48, seed=10)
    with Engine.open(tmp_path / "a", remote_config(redis_server.url, space_a,
                                                   **mac_env)) as a:
        a.put(TOKS, kv, model=SMALL)
        names = block_names(remote(a), TOKS)
    c: Any = redis_server.client()
    copies = [n.replace(space_a.encode(), space_b.encode()) for n in names]
    for src, dst in zip(names, copies, strict=True):
        c.set(dst, c.get(src))
    cfg_b = remote_config(redis_server.url, space_b, **mac_env)
    with Engine.open(tmp_path / "b", cfg_b) as b:
        assert b.get(TOKS, model=SMALL).n_tokens == 0
        t = remote(b)
        with pytest.raises(AuthenticationError, match="failed its MAC"):
            t.get(block_key(chunk_keys(as_token_array(TOKS), SMALL.fingerprint(), 16)[0], 0))
        assert b.put(TOKS, kv, model=SMALL).chunks_written == 3
        np.testing.assert_array_equal(b.get(TOKS, model=SMALL).kv, kv)


def seal_v1(key: bytes, block: bytes, record: bytes) -> bytes:
    """A value as rkv sealed it before the MAC bound the namespace (envelope version 1:
    HMAC-SHA256 over the head, the block key and the record)."""
    head = MAGIC + bytes([1, 2, 2, 0]) + b"k1"
    mac = hmac.new(key, head + bytes([len(block)]) + block + record, hashlib.sha256).digest()
    return head + mac + record


def test_values_sealed_by_envelope_version_1(tmp_path: Path, redis_server: RedisServer,
                                             mac_env: dict[str, Any]) -> None:
    """Values of the previous envelope (no namespace in the MAC) are rejected as such, not
    adopted, and the next honest put rewrites and counts them (docs/remote.md)."""
    space = ns()
    kv = random_kv(SMALL, 48, seed=11)
    with Engine.open(tmp_path / "plain", remote_config(redis_server.url, space)) as plain:
        plain.put(TOKS, kv, model=SMALL)
        t = remote(plain)
        names = block_names(t, TOKS)
    c: Any = redis_server.client()
    keys = chunk_keys(as_token_array(TOKS), SMALL.fingerprint(), 16)
    blocks = [block_key(k, layer) for k in keys for layer in range(SMALL.n_layers)]
    for name, bk in zip(names, blocks, strict=True):
        c.set(name, seal_v1(KEY, bk, c.get(name)))
    cfg = remote_config(redis_server.url, space, **mac_env)
    with Engine.open(tmp_path / "new", cfg) as e:
        with pytest.raises(AuthenticationError, match="envelope version 1"):
            remote(e).get(blocks[0])
        assert e.get(TOKS, model=SMALL).n_tokens == 0
        res = e.put(TOKS, kv, model=SMALL)
        assert res.chunks_written == 3
        np.testing.assert_array_equal(e.get(TOKS, model=SMALL).kv, kv)
    with Engine.open(tmp_path / "other", cfg) as other:
        np.testing.assert_array_equal(other.get(TOKS, model=SMALL).kv, kv)



# -- a replayed old value is stale, never current ----------------------------------------------
@pytest.mark.parametrize("local", [False, True])
def test_a_replayed_old_value_is_a_stale_miss(tmp_path: Path, redis_server: RedisServer,
                                              mac_env: dict[str, Any], local: bool) -> None:
    """A node stores KV, deletes it, the server loses the values, and the node stores other
    KV for the same tokens; someone who recorded the server's old values (valid MACs: a
    replay needs no key) writes them back.
    The node's index holds the later write, so the old records read as StaleRecordError
    (misses), never as the current KV."""
    from rkv.errors import StaleRecordError

    old_kv, new_kv = random_kv(SMALL, 48, seed=3), random_kv(SMALL, 48, seed=4)
    cfg = remote_config(redis_server.url, ns(), local=local, **mac_env)
    c: Any = redis_server.client()
    with Engine.open(tmp_path / "n", cfg) as e:
        e.put(TOKS, old_kv, model=SMALL)
        names = block_names(remote(e), TOKS)
        recorded = {n: c.get(n) for n in names}
        assert all(recorded.values())
        e.delete(TOKS, model=SMALL)
        c.delete(*names)                    # (shared values outlive a node's delete:
        e.put(TOKS, new_kv, model=SMALL)    # here the server evicted them)
        np.testing.assert_array_equal(e.get(TOKS, model=SMALL).kv, new_kv)
        for n, v in recorded.items():       # the replay
            c.set(n, v)
        got = e.get(TOKS, model=SMALL)
        np.testing.assert_array_equal(got.kv, new_kv[:, :, :got.n_tokens])
        if not local:                        # (a local tier serves its own copy first)
            assert got.n_tokens == 0
            assert any(isinstance(b.error, StaleRecordError) for b in got.blocks)
