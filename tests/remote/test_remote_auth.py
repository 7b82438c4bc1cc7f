"""Authenticated records on a remote tier: a record without a valid MAC is rejected with a
typed error, counted, and never returned."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from redis_server import RedisServer, remote_config
from rkvtest import SMALL, random_kv

from rkv import Engine
from rkv.errors import AuthenticationError, ConfigError
from rkv.format.keys import as_token_array, block_key, chunk_keys
from rkv.format.record_mac import MacKeys
from rkv.tiers import TierSpec, open_tier
from rkv.tiers.redis_tier import RedisTier
from rkv.tiers.remote_config import RemoteSettings

K1, K2 = os.urandom(32), os.urandom(32)
BK, OTHER = b"\x01" * 34, b"\x02" * 34
NS = "ns-a"


def macs(keys: dict[str, bytes], write: str, alg: str = "hmac-sha256") -> MacKeys:
    return MacKeys(keys, write, alg, namespace=NS)


@pytest.fixture
def keys_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    names = {"k1": f"RKV_TEST_MAC_K1_{os.getpid()}", "k2": f"RKV_TEST_MAC_K2_{os.getpid()}"}
    monkeypatch.setenv(names["k1"], K1.hex())
    monkeypatch.setenv(names["k2"], K2.hex())
    return {kid: f"env:{var}" for kid, var in names.items()}


def auth(keys: dict[str, str], ids: tuple[str, ...], write: str) -> dict[str, Any]:
    return {"mac_keys": {k: keys[k] for k in ids}, "mac_key_id": write}


def tier(server: RedisServer, namespace: str, **kw: Any) -> RedisTier:
    s = RemoteSettings.from_dict(server.url, {"namespace": namespace, **kw})
    t = open_tier(TierSpec("remote", 1 << 30, remote=s), Path("-"), False)
    assert isinstance(t, RedisTier)
    return t


# -- the envelope --------------------------------------------------------------------------
def test_seal_open_round_trip() -> None:
    m = macs({"k1": K1}, "k1")
    sealed = m.seal(BK, b"record bytes")
    assert bytes(m.open(BK, sealed)) == b"record bytes"
    assert K1.hex() not in repr(m) and "k1" in repr(m)


@pytest.mark.parametrize("alg", ["blake2b", "hmac-sha256"])
@settings(max_examples=40)
@given(data=st.data())
def test_any_change_is_rejected(alg: str, data: st.DataObject) -> None:
    """A flipped bit anywhere, a truncation, an extension: never opened."""
    m = macs({"k1": K1}, "k1", alg)
    sealed = bytearray(m.seal(BK, os.urandom(data.draw(st.integers(0, 300)))))
    kind = data.draw(st.sampled_from(["flip", "truncate", "extend"]))
    if kind == "flip":
        bit = data.draw(st.integers(0, 8 * len(sealed) - 1))
        sealed[bit // 8] ^= 1 << (bit % 8)
    elif kind == "truncate":
        del sealed[data.draw(st.integers(0, len(sealed) - 1)):]
    else:
        sealed += data.draw(st.binary(min_size=1, max_size=8))
    with pytest.raises(AuthenticationError):
        m.open(BK, sealed)


def test_algorithms_do_not_mix() -> None:
    b2, hs = macs({"k1": K1}, "k1", "blake2b"), macs({"k1": K1}, "k1")   # default: hmac
    assert bytes(hs.open(BK, hs.seal(BK, b"r"))) == b"r"
    assert hs.seal(BK, b"r")[5] == 2                  # the envelope names HMAC-SHA256
    for a, b in ((b2, hs), (hs, b2)):
        with pytest.raises(AuthenticationError, match="unknown MAC envelope"):
            a.open(BK, b.seal(BK, b"r"))
    with pytest.raises(ConfigError, match="algorithm"):
        macs({"k1": K1}, "k1", "md5")


def test_key_rotation() -> None:
    old, new = macs({"k1": K1}, "k1"), macs({"k1": K1, "k2": K2}, "k2")
    assert bytes(new.open(BK, old.seal(BK, b"a"))) == b"a"        # old records still read
    with pytest.raises(AuthenticationError, match="'k2'"):
        old.open(BK, new.seal(BK, b"b"))                          # a key it does not have
    other = macs({"k1": K2}, "k1")                             # same id, another key
    with pytest.raises(AuthenticationError, match="failed its MAC"):
        old.open(BK, other.seal(BK, b"c"))


def test_the_namespace_is_bound() -> None:
    """A value sealed in one namespace fails in another (same key, same block key)."""
    a = MacKeys({"k1": K1}, "k1", namespace="ns-a")
    b = MacKeys({"k1": K1}, "k1", namespace="ns-b")
    sealed = a.seal(BK, b"record")
    assert bytes(a.open(BK, sealed)) == b"record"
    with pytest.raises(AuthenticationError, match="namespace"):
        b.open(BK, sealed)
    assert "ns-a" in repr(a)
    with pytest.raises(ConfigError, match="namespace"):
        MacKeys({"k1": K1}, "k1", namespace="")


def test_envelope_version_1_is_rejected() -> None:
    """Version-1 envelopes (MAC without the namespace) are named and rejected, even when
    their MAC is right; the probe's envelope check rejects them too."""
    import hashlib
    import hmac

    head = b"RKVA" + bytes([1, 2, 2, 0]) + b"k1"
    v1 = head + hmac.new(K1, head + bytes([len(BK)]) + BK + b"rec", hashlib.sha256).digest()
    m = macs({"k1": K1}, "k1")
    for check in (lambda: m.open(BK, v1 + b"rec"), lambda: m.record_offset(BK, v1)):
        with pytest.raises(AuthenticationError, match="envelope version 1"):
            check()
    assert m.record_offset(BK, m.seal(BK, b"rec")[:50]) == 8 + 2 + 32


def test_bad_keys_are_config_errors(monkeypatch: pytest.MonkeyPatch,
                                    redis_server: RedisServer) -> None:
    var = f"RKV_TEST_SHORTKEY_{os.getpid()}"
    monkeypatch.setenv(var, "abcd")
    with pytest.raises(ConfigError, match="16 to 64") as err:
        tier(redis_server, "x", mac_keys={"k1": f"env:{var}"}, mac_key_id="k1")
    assert "abcd" not in str(err.value)
    monkeypatch.setenv(var, "not hex" * 8)
    with pytest.raises(ConfigError, match="hex"):
        tier(redis_server, "x", mac_keys={"k1": f"env:{var}"}, mac_key_id="k1")


# -- on the server -------------------------------------------------------------------------
def test_tier_rejects_forged_moved_and_damaged(redis_server: RedisServer,
                                               keys_env: dict[str, str]) -> None:
    ns = uuid.uuid4().hex[:12]
    good = tier(redis_server, ns, **auth(keys_env, ("k1",), "k1"))
    plain = tier(redis_server, ns)                       # a writer without the key
    other = tier(redis_server, ns, **auth(keys_env, ("k2",), "k2"))
    good.put(BK, b"genuine record")
    assert good.get(BK) == b"genuine record"
    c: Any = redis_server.client()
    sealed = c.get(good.key(BK))
    cases: dict[str, Callable[[], object]] = {
        "forged": lambda: plain.put(BK, b"forged record"),
        "another key": lambda: other.put(BK, b"other key's record"),
        "moved": lambda: c.set(good.key(BK), c.get(good.key(OTHER))),  # type: ignore
        "truncated": lambda: c.set(good.key(BK), sealed[:-3]),      # type: ignore
        "corrupted": lambda: c.set(good.key(BK),                    # type: ignore
                                   sealed[:50] + bytes([sealed[50] ^ 4]) + sealed[51:]),
        "mac forged": lambda: c.set(good.key(BK),                   # type: ignore
                                    sealed[:10] + os.urandom(32) + sealed[42:]),
    }
    good.put(OTHER, b"a record of another block")
    for name, damage in cases.items():
        damage()
        with pytest.raises(AuthenticationError):
            good.get(BK)
        assert name
    assert good.stats()["remote"]["auth_rejected"] == len(cases)
    for t in (good, plain, other):
        t.close()


def test_engine_never_returns_an_unauthenticated_record(
        tmp_path: Path, redis_server: RedisServer, keys_env: dict[str, str]) -> None:
    ns = uuid.uuid4().hex[:12]
    toks = list(range(48))
    kv = random_kv(SMALL, 48, seed=1)
    cfg = remote_config(redis_server.url, ns, **auth(keys_env, ("k1", "k2"), "k1"))
    with Engine.open(tmp_path / "a", cfg) as a:
        a.put(toks, kv, model=SMALL)
    b = Engine.open(tmp_path / "b", cfg)
    np.testing.assert_array_equal(b.get(toks, model=SMALL).kv, kv)    # adopted, verified
    # An attacker (or a buggy node) without the key overwrites them with wrong KV.
    evil = random_kv(SMALL, 48, seed=2)
    with Engine.open(tmp_path / "evil", remote_config(redis_server.url, ns)) as bad:
        bad._share.names = []                      # it writes without probing first
        bad.put(toks, evil, model=SMALL)
    with b:
        got = b.get(toks, model=SMALL)
        assert got.n_tokens == 0
        errors = [s.error for s in got.blocks if s.error is not None]
        assert errors and all(isinstance(e, AuthenticationError) for e in errors)
        assert b.stats()["tiers"]["remote"]["remote"]["auth_rejected"] >= 1
        with Engine.open(tmp_path / "c", cfg) as c:   # a new node does not adopt them
            assert c.get(toks, model=SMALL).n_tokens == 0
            assert c.stats()["session"]["remote_probe_rejected"] >= 1
        np.testing.assert_array_equal(b.get(toks, model=SMALL).kv, kv[:, :, :0])
        # The honest node stores it again (the bad chunks are not adopted), readers agree.
        assert b.put(toks, kv, model=SMALL).chunks_written == 3
    with Engine.open(tmp_path / "d", cfg) as d:
        np.testing.assert_array_equal(d.get(toks, model=SMALL).kv, kv)
    with Engine.open(tmp_path / "e", cfg) as e:
        e.put(toks[:16], kv[:, :, :16], model=SMALL)
        t = e.tiers["remote"]
        assert isinstance(t, RedisTier)
        k0 = chunk_keys(as_token_array(toks), SMALL.fingerprint(), 16)[0]
        redis_server.client().set(                    # type: ignore[attr-defined]
            t.key(block_key(k0, 1)), macs({"k1": os.urandom(32)}, "k1").seal(b"x", b"f"))
        with pytest.raises(AuthenticationError):   # strict: the typed error itself
            e.get(toks, model=SMALL, strict=True)


def test_rotation_on_the_server(tmp_path: Path, redis_server: RedisServer,
                                keys_env: dict[str, str]) -> None:
    ns = uuid.uuid4().hex[:12]
    kv = random_kv(SMALL, 32, seed=3)
    old = remote_config(redis_server.url, ns, **auth(keys_env, ("k1",), "k1"))
    new = remote_config(redis_server.url, ns, **auth(keys_env, ("k1", "k2"), "k2"))
    with Engine.open(tmp_path / "a", old) as a:
        a.put(list(range(32)), kv, model=SMALL)
    with Engine.open(tmp_path / "b", new) as b:      # reads k1 records, writes k2
        np.testing.assert_array_equal(b.get(list(range(32)), model=SMALL).kv, kv)
        kv2 = random_kv(SMALL, 20, seed=4)
        b.put(list(range(100, 120)), kv2, model=SMALL)
    with Engine.open(tmp_path / "c", old) as c:      # a node without k2 rejects them
        got = c.get(list(range(100, 120)), model=SMALL)
        assert got.n_tokens == 0                     # the probe refused the key id
        assert c.stats()["session"]["remote_probe_rejected"] >= 1
        k0 = chunk_keys(as_token_array(list(range(100, 120))), SMALL.fingerprint(), 16)[0]
        with pytest.raises(AuthenticationError, match="'k2'"):
            c.tiers["remote"].get(block_key(k0, 0))
