"""Two engines (two processes, standing for two machines) sharing prefixes through one
remote tier: a local index miss probes the remote tier, verifies and adopts."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import numpy as np
from redis_server import RedisServer, remote_config
from rkvtest import SMALL, random_kv

from rkv import Engine, EngineConfig
from rkv.errors import StaleRecordError
from rkv.format.keys import as_token_array, block_key, chunk_keys
from rkv.tiers.redis_tier import RedisTier

NODE = textwrap.dedent("""
    import json, sys
    import numpy as np
    from rkv import Engine, EngineConfig
    from rkvtest import SMALL, random_kv
    path, cfg, n, seed, out = sys.argv[1:6]
    kv = random_kv(SMALL, int(n), seed=int(seed))
    with Engine.open(path, EngineConfig.from_toml(open(cfg).read())) as e:
        e.put(list(range(int(n))), kv, model=SMALL)
        got = e.get(list(range(int(n))), model=SMALL)
        st = e.stats()["session"]
    json.dump({"n": got.n_tokens, "same": bool(np.array_equal(got.kv, kv)),
               "adopted": st.get("remote_adopted", 0)}, open(out, "w"))
""")


def node(tmp: Path, name: str, cfg: EngineConfig, n: int, seed: int) -> dict[str, object]:
    """Run one node in its own process: put ``n`` tokens (of seed ``seed``), get them."""
    (tmp / f"{name}.toml").write_text(cfg.to_toml())
    tests = str(Path(__file__).resolve().parents[1])
    subprocess.run([sys.executable, "-c", NODE, str(tmp / name), str(tmp / f"{name}.toml"),
                    str(n), str(seed), str(tmp / f"{name}.json")], check=True,
                   env={"PYTHONPATH": f"{tests}:{Path(tests).parent}", "PATH": "/usr/bin"},
                   timeout=300)
    return json.loads((tmp / f"{name}.json").read_text())  # type: ignore[no-any-return]


def ns() -> str:
    return uuid.uuid4().hex[:12]


def test_two_processes_share_a_prefix(tmp_path: Path, redis_server: RedisServer) -> None:
    cfg = remote_config(redis_server.url, ns(), local=True)
    a = node(tmp_path, "a", cfg, 70, seed=1)       # node A stores 70 tokens
    assert a == {"n": 70, "same": True, "adopted": 0}
    kv = random_kv(SMALL, 70, seed=1)
    with Engine.open(tmp_path / "b", cfg) as b:     # node B finds them
        assert b.lookup(list(range(70)), model=SMALL) == 70
        got = b.get(list(range(70)), model=SMALL)
        assert got.n_tokens == 70
        np.testing.assert_array_equal(got.kv, kv)
        st = b.stats()
        assert st["session"]["remote_adopted"] == 5
        assert list(st["tiers"]["remote"]["mix"]) == ["16-bit + none"]   # labelled
        # B extends A's prefix: its first 4 full chunks are A's (the partial one differs).
        longer = random_kv(SMALL, 100, seed=9)
        longer[:, :, :64] = kv[:, :, :64]
        res = b.put(list(range(100)), longer, model=SMALL)
        assert res.chunks_deduped == 4 and res.chunks_written == 3
    # A third process reads B's longer sequence: A's chunks and B's, verified.
    with Engine.open(tmp_path / "c", cfg) as c:
        got = c.get(list(range(100)), model=SMALL)
        assert got.n_tokens == 100
        np.testing.assert_array_equal(got.kv, longer)


def test_two_nodes_store_the_same_chunk(tmp_path: Path, redis_server: RedisServer) -> None:
    """Both write the same content-addressed records: the last write wins, both are right."""
    cfg = remote_config(redis_server.url, ns())
    kv = random_kv(SMALL, 40, seed=2)
    with Engine.open(tmp_path / "a", cfg) as a, Engine.open(tmp_path / "b", cfg) as b:
        a.put(list(range(40)), kv, model=SMALL)
        # B stores the same prefix: its probe adopts A's chunks instead of writing them.
        assert b.put(list(range(40)), kv, model=SMALL).chunks_written == 0
        for e in (a, b):
            np.testing.assert_array_equal(e.get(list(range(40)), model=SMALL).kv, kv)
    cfg2 = remote_config(redis_server.url, ns())
    with Engine.open(tmp_path / "c", cfg2) as c, Engine.open(tmp_path / "d", cfg2) as d:
        c.put(list(range(40)), kv, model=SMALL)       # both write (neither probed first)
        d._share.names = []
        d.put(list(range(40)), kv, model=SMALL)
        d._share.names = ["remote"]
        for e in (c, d):
            # C's index holds its own write times, the server D's records: C may read them
            # as another write of the block (StaleRecordError, a miss), forgets them, and
            # its next probe adopts D's.
            got = e.get(list(range(40)), model=SMALL)
            np.testing.assert_array_equal(got.kv, kv[:, :, :got.n_tokens])
            assert all(isinstance(b.error, StaleRecordError) for b in got.blocks
                       if b.status != "ok")
            np.testing.assert_array_equal(e.get(list(range(40)), model=SMALL).kv, kv)


def _shared_prefix(tmp: Path, server: RedisServer, seed: int
                   ) -> tuple[EngineConfig, list[int], np.ndarray, list[bytes], RedisTier]:
    """Node "a" stores 48 tokens (3 chunks) through a shared remote tier; its config, the
    tokens, their KV, their chunk keys and the remote tier (closed; its key() still works)."""
    cfg = remote_config(server.url, ns())
    kv = random_kv(SMALL, 48, seed=seed)
    toks = list(range(48))
    keys = chunk_keys(as_token_array(toks), SMALL.fingerprint(), 16)
    with Engine.open(tmp / "a", cfg) as a:
        a.put(toks, kv, model=SMALL)
        t = a.tiers["remote"]
        assert isinstance(t, RedisTier)
    return cfg, toks, kv, keys, t


def test_probe_refuses_a_record_of_another_key(tmp_path: Path,
                                               redis_server: RedisServer) -> None:
    """A value under a chunk's key that holds another block (a bug, a stale copy) is not
    adopted: its header names another key."""
    cfg, toks, kv, keys, t = _shared_prefix(tmp_path, redis_server, seed=3)
    c = redis_server.client()
    c.set(t.key(block_key(keys[1], 0)),                 # type: ignore[attr-defined]
          c.get(t.key(block_key(keys[2], 0))))          # type: ignore[attr-defined]
    with Engine.open(tmp_path / "b", cfg) as b:
        got = b.get(toks, model=SMALL)
        assert got.n_tokens == 16
        np.testing.assert_array_equal(got.kv, kv[:, :, :16])
        assert b.stats()["session"]["remote_adopted"] == 1


def test_adopted_record_failing_its_checksum(tmp_path: Path,
                                             redis_server: RedisServer) -> None:
    """The probe trusts headers only; the get verifies the data, and a chunk that fails is
    not returned and is forgotten."""
    cfg, toks, kv, keys, t = _shared_prefix(tmp_path, redis_server, seed=4)
    r = redis_server.client()
    k = t.key(block_key(keys[1], 2))
    v = bytearray(r.get(k))                             # type: ignore[attr-defined]
    v[len(v) // 2] ^= 0x10                              # one bit of the payload
    r.set(k, bytes(v))                                  # type: ignore[attr-defined]
    with Engine.open(tmp_path / "b", cfg) as b:
        got = b.get(toks, model=SMALL)
        assert got.n_tokens == 16
        np.testing.assert_array_equal(got.kv, kv[:, :, :16])
        assert [s.status for s in got.blocks if s.status != "ok"] == ["uncorrectable"]
        assert b.stats()["session"]["remote_forgotten"] == 2
        assert b.lookup(toks, model=SMALL) == 16        # not adopted again
        assert b.put(toks, kv, model=SMALL).chunks_written == 2   # rewrites the bad one
    with Engine.open(tmp_path / "c", cfg) as c:
        np.testing.assert_array_equal(c.get(toks, model=SMALL).kv, kv)


def test_readonly_engine_does_not_adopt(tmp_path: Path, redis_server: RedisServer) -> None:
    cfg = remote_config(redis_server.url, ns())
    kv = random_kv(SMALL, 20, seed=5)
    with Engine.open(tmp_path / "a", cfg) as a:
        a.put(list(range(20)), kv, model=SMALL)
    with Engine.open(tmp_path / "b", cfg):
        pass
    with Engine.open(tmp_path / "b", readonly=True) as b:
        assert b.lookup(list(range(20)), model=SMALL) == 0
