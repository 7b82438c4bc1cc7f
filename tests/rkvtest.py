"""Shared test helpers (a module with a unique name, so test directories never shadow it)."""

from __future__ import annotations

import numpy as np

from rkv import EngineConfig, ModelSpec, TierConfig

SMALL = ModelSpec("test/small", n_layers=3, n_kv_heads=2, head_dim=4, dtype="float16")


def local_config(chunk_tokens: int = 16, caps: tuple[int, int, int] | None = None,
                 policy: str = "prefix", **kw: object) -> EngineConfig:
    """Three tiers, all inside the store directory (tests never touch /dev/shm)."""
    caps = caps or (1 << 30, 1 << 30, 1 << 30)
    tiers = (
        TierConfig("dram", medium="memory", path="t/dram", capacity_bytes=caps[0],
                   policy=policy),
        TierConfig("cxl", medium="memory", path="t/cxl", capacity_bytes=caps[1],
                   policy=policy),
        TierConfig("nvme", medium="disk", path="t/nvme", capacity_bytes=caps[2],
                   policy=policy),
    )
    return EngineConfig(chunk_tokens=chunk_tokens, tiers=tiers, **kw)  # type: ignore[arg-type]


def random_kv(spec: ModelSpec, n: int, seed: int = 0) -> np.ndarray:
    from rkv.tensors import numpy_dtype

    rng = np.random.default_rng(seed)
    x = rng.standard_normal((spec.n_layers, 2, n, spec.n_kv_heads, spec.head_dim))
    return x.astype(numpy_dtype(spec.dtype))

