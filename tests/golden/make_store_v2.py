"""How tests/golden/store_v2.tar.gz was made: run with the code of commit 13ce8ce (index
format 2, the last release before the policies), then `tar czf store_v2.tar.gz store`."""

import numpy as np

from rkv import Engine, EngineConfig, ModelSpec, TierConfig

SMALL = ModelSpec("test/small", n_layers=3, n_kv_heads=2, head_dim=4, dtype="float16")


def kv(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((3, 2, n, 2, 4)).astype(np.float16)


tiers = (TierConfig("dram", medium="memory", path="t/dram", capacity_bytes=6000),
         TierConfig("nvme", medium="disk", path="t/nvme", capacity_bytes=1 << 20,
                    ecc="rs(255,239)"))
with Engine.open("store", EngineConfig(chunk_tokens=16, tiers=tiers)) as e:
    for s in range(5):
        t = np.random.default_rng(s).integers(0, 30000, 40).tolist()
        e.put(t, kv(40, s), model=SMALL)
    e.pin(np.random.default_rng(0).integers(0, 30000, 40).tolist(), model=SMALL)
