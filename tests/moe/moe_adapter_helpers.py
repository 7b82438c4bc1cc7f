"""Helpers of the rkv.adapters.moe tests: synthetic experts, small tiers, exact comparison."""

from __future__ import annotations

import numpy as np

from rkv.moe.experts import ExpertWeights
from rkv.moe.store import pack, unpack
from rkv.quant import RowQuantizer
from rkv.store.config import TierConfig


def make_layers(n_layers: int, n_experts: int, n: int, d: int, dtype: type = np.float16,
                seed: int = 0) -> list[list[ExpertWeights]]:
    rng = np.random.default_rng(seed)

    def m(shape: tuple[int, int]) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.5).astype(dtype)

    return [[ExpertWeights(m((n, d)), m((n, d)), m((d, n))) for _ in range(n_experts)]
            for _ in range(n_layers)]


def tiers(first_ecc: str = "none") -> tuple[TierConfig, ...]:
    """dram / cxl / nvme, 1 GiB each (sparse maps), small enough to keep tests quick."""
    return (TierConfig("dram", medium="memory", capacity_bytes=1 << 30, ecc=first_ecc),
            TierConfig("cxl", medium="memory", capacity_bytes=1 << 30, ecc="rs(255,239)"),
            TierConfig("nvme", capacity_bytes=1 << 30, ecc="shardrs(k=4,m=2)"))


def assert_same(got: ExpertWeights, want: ExpertWeights) -> None:
    """Bitwise equal: values, shapes, dtypes, C-contiguous."""
    for name in ("gate", "up", "down"):
        a, b = getattr(got, name), getattr(want, name)
        assert a.shape == b.shape and a.dtype == b.dtype and a.flags.c_contiguous, name
        assert a.tobytes() == b.tobytes(), name


def low_bit(w: ExpertWeights, bits: int) -> ExpertWeights:
    """What the low-bit copy of ``w`` decodes to."""
    block = pack(w)
    q = RowQuantizer(bits)
    return unpack(q.decode(q.encode(block), block.shape, block.dtype), w.gate.shape[0],
                  w.gate.shape[1])
