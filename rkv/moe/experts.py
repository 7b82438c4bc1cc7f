"""How a MoE model gets its experts' weights: the :class:`ExpertProvider` protocol.

The model (:mod:`rkv.moe.model`) asks for the experts a layer's router chose, right before it
runs them, and may say which experts it expects next (a prefetch hint, e.g. speculative
routing: layer ``l+1``'s router applied to layer ``l``'s hidden state). A provider returns
each expert's exact weights or raises a typed :class:`~rkv.errors.RkvError`; it never returns
weights it could not verify. :class:`ResidentExperts` keeps every expert in memory (the
reference); :class:`rkv.adapters.moe.RkvExperts` streams them from rkv's tiers through a
device cache run by ``policies/`` objects.

An expert of a SwiGLU feed-forward layer with ``n`` of the layer's neurons is three matrices:
``gate`` and ``up`` of shape ``[n, d_model]`` and ``down`` of shape ``[d_model, n]``, with
``mlp(x) = down @ (silu(gate @ x) * (up @ x))`` summed over the chosen experts (each scaled by
its routing weight when the model uses weights).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np


@dataclass(frozen=True)
class ExpertWeights:
    """One expert's weights (float32 or float16 numpy arrays, C-contiguous)."""

    gate: np.ndarray          # [n, d_model]
    up: np.ndarray            # [n, d_model]
    down: np.ndarray          # [d_model, n]

    @property
    def nbytes(self) -> int:
        return int(self.gate.nbytes + self.up.nbytes + self.down.nbytes)


@runtime_checkable
class ExpertProvider(Protocol):
    """What a MoE model needs from wherever its experts live."""

    def experts(self, layer: int, ids: Sequence[int]) -> Mapping[int, ExpertWeights]:
        """The weights of experts ``ids`` of ``layer`` (every id present in the result), or
        a typed error. Called once per layer per forward step."""
        ...

    def hint(self, layer: int, ids: Iterable[int]) -> None:
        """Experts of ``layer`` the model expects to need soon (may be ignored)."""
        ...


class ResidentExperts:
    """Every expert in memory: the reference provider (no cache, no I/O)."""

    def __init__(self, layers: Sequence[Sequence[ExpertWeights]]) -> None:
        self.layers = [list(experts) for experts in layers]

    def experts(self, layer: int, ids: Sequence[int]) -> Mapping[int, ExpertWeights]:
        experts = self.layers[layer]
        return {int(i): experts[int(i)] for i in ids}

    def hint(self, layer: int, ids: Iterable[int]) -> None:
        return None
