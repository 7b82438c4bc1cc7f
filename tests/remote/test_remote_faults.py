"""Faults on the wire: the fault-injecting wrapper around a remote tier (link bit errors,
lost values, partial reads, a server restart in the middle of a read) and a small campaign
run against a remote tier."""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from redis_server import RedisServer, remote_config
from rkvtest import SMALL, random_kv

from rkv import Engine, EngineConfig, ModelSpec
from rkv.errors import TierUnavailableError, TruncatedRecordError
from rkv.format.keys import as_token_array, block_key, chunk_keys
from rkv.tiers.faulty import FaultyTier

TOKENS = list(range(64))
BIG = ModelSpec("test/big", n_layers=4, n_kv_heads=8, head_dim=128, dtype="float16")


def keys_of(tokens: list[int]) -> list[bytes]:
    return chunk_keys(as_token_array(tokens), SMALL.fingerprint(), 16)


def faulty(e: Engine, **kw: Any) -> FaultyTier:
    t = e.wrap_tier("remote", lambda inner: FaultyTier(inner, seed=7, **kw))
    assert isinstance(t, FaultyTier)
    return t


class Flips:
    """A transient pattern: flip these bit offsets of one read."""

    def __init__(self, bits: list[int]) -> None:
        self.flips = np.asarray(bits, dtype=np.int64)
        self.erasures: tuple[tuple[int, int, str], ...] = ()
        self.lost = False
        self.transient = True

    @property
    def is_empty(self) -> bool:
        return self.flips.size == 0

    def apply(self, buf: np.ndarray, rng: Any) -> None:
        for b in self.flips:
            buf[b // 8] ^= np.uint8(1 << (b % 8))


def ecc_config(server: RedisServer, **kw: Any) -> EngineConfig:
    cfg = remote_config(server.url, uuid.uuid4().hex[:12], **kw)
    return cfg.with_tier("remote", ecc="rs(255,239)")


def test_link_bit_errors(tmp_path: Path, redis_server: RedisServer) -> None:
    """Flips in one read: corrected by the tier's ECC (the stored value is intact), or,
    past what it corrects, reported; never wrong KV."""
    kv = random_kv(SMALL, 64, seed=1)
    with Engine.open(tmp_path / "s", ecc_config(redis_server)) as e:
        e.put(TOKENS, kv, model=SMALL)
        t = faulty(e)
        k = block_key(keys_of(TOKENS)[1], 2)
        rec_bits = 8 * len(t.inner.get(k) or b"")
        t.inject_transient(k, Flips([rec_bits // 2, rec_bits // 2 + 9, rec_bits // 3]))
        got = e.get(TOKENS, model=SMALL)
        assert got.n_tokens == 64 and got.corrected > 0
        np.testing.assert_array_equal(got.kv, kv)
        t.inject_transient(k, Flips(list(range(rec_bits // 4, rec_bits // 4 + 4000, 3))))
        got = e.get(TOKENS, model=SMALL)
        assert got.n_tokens == 16
        np.testing.assert_array_equal(got.kv, kv[:, :, :16])


def test_lost_values_and_partial_reads(tmp_path: Path, redis_server: RedisServer) -> None:
    kv = random_kv(SMALL, 64, seed=2)
    cfg = remote_config(redis_server.url, uuid.uuid4().hex[:12])
    with Engine.open(tmp_path / "s", cfg) as e:
        e.put(TOKENS, kv, model=SMALL)
        t = faulty(e)
        keys = keys_of(TOKENS)
        t.inject_partial(block_key(keys[2], 0), 100)          # cut short on the wire
        got = e.get(TOKENS, model=SMALL)
        assert got.n_tokens == 32
        np.testing.assert_array_equal(got.kv, kv[:, :, :32])
        bad = [b for b in got.blocks if b.status == "uncorrectable"]
        assert [type(b.error) for b in bad] == [TruncatedRecordError]
        # Forgotten; not adopted again until this node stores it (a transient fault looks
        # like a bad record): the put rewrites chunks 2 and 3.
        assert e.lookup(TOKENS, model=SMALL) == 32
        assert e.put(TOKENS, kv, model=SMALL).chunks_written == 2
        np.testing.assert_array_equal(e.get(TOKENS, model=SMALL).kv, kv)
        t.lost.add(block_key(keys[1], 1))                     # a value the server dropped
        got = e.get(TOKENS, model=SMALL)
        assert got.n_tokens == 16
        np.testing.assert_array_equal(got.kv, kv[:, :, :16])


def test_server_restart_mid_read(tmp_path: Path, own_redis: RedisServer) -> None:
    """The server dies after a few records of a get were read (and comes back empty):
    the get returns the prefix it verified, the engine recovers with the server."""
    kv = random_kv(BIG, 64, seed=3)              # 64 KiB blocks: one per MGET window
    cfg = remote_config(own_redis.url, uuid.uuid4().hex[:12], window_bytes=1 << 16)
    reads = Counter[str]()

    def killer(key: bytes, nbytes: int) -> None:
        reads["n"] += 1
        if reads["n"] == 5:           # during chunk 1: the rest of the read fails
            own_redis.stop()
        return None

    with Engine.open(tmp_path / "s", cfg) as e:
        e.put(TOKENS, kv, model=BIG)
        faulty(e, transient=killer)
        got = e.get(TOKENS, model=BIG)
        assert got.n_tokens < 64
        np.testing.assert_array_equal(got.kv, kv[:, :, :got.n_tokens])
        assert any(isinstance(b.error, TierUnavailableError) for b in got.blocks)
        own_redis.start()
        got = e.get(TOKENS, model=BIG)
        np.testing.assert_array_equal(got.kv, kv[:, :, :got.n_tokens])
        e.put(TOKENS, kv, model=BIG)
        got = e.get(TOKENS, model=BIG)
        assert got.n_tokens == 64
        np.testing.assert_array_equal(got.kv, kv)


def test_mget_window_with_server_restart(tmp_path: Path, own_redis: RedisServer) -> None:
    """Unwrapped (MGET windows): a server that restarts between windows gives misses."""
    kv = random_kv(SMALL, 64, seed=4)
    cfg = remote_config(own_redis.url, uuid.uuid4().hex[:12], window_bytes=1 << 16)
    with Engine.open(tmp_path / "s", cfg) as e:
        e.put(TOKENS, kv, model=SMALL)
        own_redis.restart()
        got = e.get(TOKENS, model=SMALL)
        assert got.n_tokens == 0 and got.blocks[0].status == "missing"


@pytest.mark.parametrize("protection", ["rs(255,239)", "none"])
def test_small_campaign_against_the_remote_tier(redis_server: RedisServer,
                                                protection: str) -> None:
    """The campaign's own trials (rkv.eval.faults.bench) with the harness's tier on Redis: link
    and media faults drawn from a fault model, injected at the tier boundary, read back
    through the real read path. No silent corruption."""
    from rkv.eval.faults.bench import _Bench
    from rkv.eval.faults.campaign import CampaignConfig
    from rkv.eval.faults.harness import Harness

    cfg = CampaignConfig(tier="nvme", protection=protection, trials=6, blocks=4,
                         chunk_tokens=32, kv_heads=2, head_dim=16, hours=1.0,
                         fault_model={"model": "raw-ber", "ber": 2e-4})
    root = Path(tempfile.mkdtemp(prefix="rkv-remote-campaign-"))
    bench = _Bench(cfg, root)
    try:
        bench.harness.close()
        tier = replace(cfg.tier_config(), kind="redis", url=redis_server.url,
                       remote={"namespace": uuid.uuid4().hex[:12], "shared": False})
        bench.harness = Harness(root / "remote", tier, chunk_tokens=cfg.chunk_tokens)
        outcomes: Counter[str] = Counter()
        for trial in range(cfg.trials):
            outcomes.update(bench.run(trial, cfg.trial_seed(trial), True).outcomes)
    finally:
        bench.close()
        shutil.rmtree(root, ignore_errors=True)
    assert sum(outcomes.values()) == cfg.trials * cfg.blocks
    assert outcomes["sdc"] == 0
    if protection == "none":
        assert outcomes["due"] > 0        # detected, recomputed
    else:
        assert outcomes["corrected"] > 0
