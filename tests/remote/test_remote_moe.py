"""MoE experts in a Redis tier: the expert store opens a redis tier as one (it once built
its tier specs without the remote settings and would have opened a local LMDB instead)."""

from __future__ import annotations

import uuid
from pathlib import Path

import numpy as np
from redis_server import RedisServer

from rkv.adapters.moe import RkvExperts
from rkv.store.config import TierConfig
from rkv.tiers.redis_tier import RedisTier
from tests.moe.moe_adapter_helpers import assert_same, make_layers


def test_experts_round_trip_through_redis(tmp_path: Path, redis_server: RedisServer) -> None:
    layers = make_layers(2, 3, 4, 8, np.float16, seed=5)
    ns = uuid.uuid4().hex[:12]
    tiers = (TierConfig("remote", kind="redis", url=redis_server.url, capacity_bytes=1 << 30,
                        remote={"namespace": ns, "shared": False, "retry_after_s": 0.0}),)
    with RkvExperts.create(tmp_path / "s", layers, fingerprint="m", tiers=tiers,
                           device_budget_bytes=0) as p:
        assert all(isinstance(t, RedisTier) for t in p.tiers.values())
        for layer in range(2):
            got = p.experts(layer, range(3))
            for e in range(3):
                assert_same(got[e], layers[layer][e])
    assert not (tmp_path / "s" / "tiers" / "remote").exists()      # nothing local
    import redis

    r = redis.Redis.from_url(redis_server.url)
    assert len(list(r.scan_iter(f"rkv:{ns}:*"))) >= 6
