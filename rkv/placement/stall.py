"""What a restore waits for under layer streaming: the stall a placement causes.

With layer streaming (``Engine.get_layers``), layer ``l`` of a prefix is read while the
layers before it compute, so its blocks may live in a slower tier without a stall as long as
they arrive in time. The model here: every tier streams the blocks it holds in layer order
(all chunks of layer 0, then of layer 1, ...), tiers in parallel; a block's read takes its
tier's latency plus its bytes over the tier's bandwidth; layer ``l`` is ready when its last
block is; computing a layer takes ``layer_us`` (measured per model and machine, e.g. by
``benchmarks/bench_tier_stream.py``). With one reader (rkv's own
:meth:`~rkv.Engine.get_layers` reads in one background thread) all tiers share one queue:
pass every block as tier 0 of 1. Then the restore ends at

    end = L x layer_us + max(0, max_l (ready_l - l x layer_us))

and the second term is the **stall**: what the placement adds to a restore whose data were
all there at once (:func:`stall_us`). An all-fast-tier placement stalls by little more than
its first layer's read.

The stall is a maximum over layers, not a sum over blocks, so the planner (a separable
knapsack) prices it through a per-block surrogate (:func:`lateness`): how late the block
arrives, given the blocks queued before it in its tier by the previous iterate, against the
compute of the layers before it. The planner iterates that and keeps the plan whose real
stall (:func:`stall_us`) costs least (:mod:`rkv.placement.planner`).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]


def stream_order(layer: I64, chunk: I64) -> I64:
    """Block indices in the order a streamed read needs them: by layer, then chunk."""
    return np.lexsort((chunk, layer)).astype(np.int64)


def finish_times(order: I64, tier: I64, read_us: F64, n_tiers: int) -> F64:
    """When each block's read ends: its tier reads its blocks one after another in
    ``order``, all tiers at once."""
    out = np.empty(len(tier), np.float64)
    for t in range(n_tiers):
        idx = order[tier[order] == t]
        out[idx] = np.cumsum(read_us[idx])
    return out


def queued(order: I64, tier: I64, read_us: F64, n_tiers: int) -> F64:
    """Per block and tier: the time that tier spends on blocks ahead of it in ``order``
    (``blocks x n_tiers``), for the placement ``tier``."""
    n = len(tier)
    q = np.zeros((n, n_tiers), np.float64)
    pos = np.empty(n, np.int64)
    pos[order] = np.arange(n)
    for t in range(n_tiers):
        busy = np.where(tier[order] == t, read_us[order], 0.0)
        ahead = np.concatenate(([0.0], np.cumsum(busy)[:-1]))   # before each position
        q[:, t] = ahead[pos]
    return q


def layer_rank(layer: I64) -> I64:
    """Each block's layer as a position among the layers present (0 first)."""
    return np.unique(layer, return_inverse=True)[1].astype(np.int64)


def stall_us(layer: I64, chunk: I64, tier: I64, read_us: F64, n_tiers: int,
             layer_us: float) -> float:
    """The stall of a streamed restore of these blocks placed in ``tier`` (see the module
    docstring)."""
    return stall_ranked(layer_rank(layer), stream_order(layer, chunk), tier, read_us,
                        n_tiers, layer_us)


def stall_ranked(rank: I64, order: I64, tier: I64, read_us: F64, n_tiers: int,
                 layer_us: float) -> float:
    """:func:`stall_us` with the layer ranks and stream order computed once by the caller."""
    done = finish_times(order, tier, read_us, n_tiers)
    ready = np.full(int(rank.max()) + 1, 0.0)
    np.maximum.at(ready, rank, done)
    late = ready - layer_us * np.arange(len(ready))
    return float(max(0.0, late.max()))


def lateness(read_us: F64, col_tier: I64, queue: F64, slack: F64) -> F64:
    """Per block and option: how late the block arrives in that option's tier behind the
    ``queue`` (``blocks x tiers``) against its ``slack`` (the compute before its layer is
    needed): ``max(0, queue + read - slack)``."""
    q = np.take_along_axis(queue, col_tier, axis=1)
    return np.maximum(0.0, q + read_us - slack[:, None])
