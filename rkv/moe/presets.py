"""Shapes of real MoE models, and synthetic routing traces of those shapes.

The shapes come from the models' published ``config.json`` files on the Hugging Face Hub
(the field names below are theirs). Every expert is a SwiGLU feed-forward block of three
matrices (``gate``, ``up``: ``[moe_intermediate, hidden]``; ``down``: ``[hidden,
moe_intermediate]``), so it has ``3 * hidden * moe_intermediate`` parameters.

* ``mixtral-8x7b``, mistralai/Mixtral-8x7B-v0.1: ``num_hidden_layers`` 32, ``num_local_experts``
  8, ``num_experts_per_tok`` 2, ``hidden_size`` 4096, ``intermediate_size`` 14336.
* ``olmoe-1b-7b``, allenai/OLMoE-1B-7B-0924: ``num_hidden_layers`` 16, ``num_experts`` 64,
  ``num_experts_per_tok`` 8, ``hidden_size`` 2048, ``intermediate_size`` 1024.
* ``qwen3-30b-a3b``, Qwen/Qwen3-30B-A3B: ``num_hidden_layers`` 48, ``num_experts`` 128,
  ``num_experts_per_tok`` 8, ``hidden_size`` 2048, ``moe_intermediate_size`` 768.
* ``deepseek-v2-lite``, deepseek-ai/DeepSeek-V2-Lite: ``num_hidden_layers`` 27 of which the
  first is dense (``first_k_dense_replace`` 1), so 26 MoE layers; ``n_routed_experts`` 64,
  ``num_experts_per_tok`` 6, ``hidden_size`` 2048, ``moe_intermediate_size`` 1408, plus
  ``n_shared_experts`` 2 that run for every token (always resident: not part of the cache).

:func:`synthetic_trace` writes a routing trace of a preset's shape without the model. It is
**synthetic**: expert popularity per layer is Zipf-skewed, tokens repeat the previous token's
experts with probability ``locality``, and with probability ``affinity`` a slot follows a
fixed random map from the previous layer's expert (the inter-layer affinity real routers
show, at a strength chosen here, not measured). Results on it say how policies behave under
those assumptions, not how a real model routes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from rkv.errors import ConfigError

#: Bytes per parameter at the supported widths.
BITS = (16, 8, 4)


@dataclass(frozen=True)
class MoEShape:
    """The routed-expert structure of a MoE model."""

    name: str
    source: str                   # the Hugging Face repository its config comes from
    layers: int                   # MoE layers (dense layers excluded)
    experts: int                  # routed experts per layer
    top_k: int                    # experts chosen per token per layer
    hidden: int
    expert_intermediate: int
    shared_experts: int = 0       # always-on experts per layer (not cached)

    @property
    def expert_params(self) -> int:
        return 3 * self.hidden * self.expert_intermediate

    def expert_bytes(self, bits: int = 16) -> int:
        """Bytes of one routed expert at ``bits`` per weight (16: fp16/bf16; 8, 4: quantized,
        scales not counted)."""
        if bits not in BITS:
            raise ConfigError(f"bits must be one of {BITS}, got {bits!r}")
        return self.expert_params * bits // 8

    def routed_bytes(self, bits: int = 16) -> int:
        """Bytes of every routed expert of the model."""
        return self.layers * self.experts * self.expert_bytes(bits)

    def shared_bytes(self, bits: int = 16) -> int:
        """Bytes of the shared experts (resident, outside the cache)."""
        return self.layers * self.shared_experts * self.expert_bytes(bits)


PRESETS: dict[str, MoEShape] = {s.name: s for s in (
    MoEShape("mixtral-8x7b", "mistralai/Mixtral-8x7B-v0.1", 32, 8, 2, 4096, 14336),
    MoEShape("olmoe-1b-7b", "allenai/OLMoE-1B-7B-0924", 16, 64, 8, 2048, 1024),
    MoEShape("qwen3-30b-a3b", "Qwen/Qwen3-30B-A3B", 48, 128, 8, 2048, 768),
    MoEShape("deepseek-v2-lite", "deepseek-ai/DeepSeek-V2-Lite", 26, 64, 6, 2048, 1408,
             shared_experts=2),
)}


def preset(name: str) -> MoEShape:
    """The preset called ``name`` (case-insensitive), or a ConfigError listing them."""
    shape = PRESETS.get(str(name).lower())
    if shape is None:
        raise ConfigError(f"unknown MoE shape {name!r} (known: {', '.join(PRESETS)})")
    return shape


# -- synthetic traces ------------------------------------------------------------------------------
def synthetic_routes(shape: MoEShape, tokens: int, *, seed: int = 0, zipf: float = 1.0,
                     locality: float = 0.3, affinity: float = 0.4
                     ) -> Iterator[list[list[int]]]:
    """Per token, the experts chosen at every layer (``top_k`` distinct ids per layer).

    Per layer, expert ``i`` of a seeded random permutation has popularity ``1 / (i + 1) **
    zipf``. Each of a token's ``top_k`` slots keeps the previous token's expert of that slot
    with probability ``locality``; otherwise, with probability ``affinity`` (layers after the
    first), it takes a fixed random map of this token's previous-layer expert in the same slot;
    otherwise (or when the candidate is already chosen) it draws from the popularity.
    """
    import numpy as np

    for name, v in (("locality", locality), ("affinity", affinity)):
        if not 0 <= v <= 1:
            raise ConfigError(f"{name} must be in [0, 1], got {v!r}")
    if tokens < 0 or zipf < 0:
        raise ConfigError("tokens and zipf must be >= 0")
    rng = np.random.default_rng(seed)
    n, k = shape.experts, shape.top_k
    pops = []
    for _ in range(shape.layers):
        w = 1.0 / np.arange(1, n + 1) ** zipf
        p = np.empty(n)
        p[rng.permutation(n)] = w / w.sum()
        pops.append(p)
    maps = [rng.integers(0, n, size=n) for _ in range(shape.layers)]
    prev: list[list[int]] | None = None
    for _ in range(tokens):
        # Draw generously in bulk (the popularity draws and the coin flips), use what is needed.
        u = rng.random((shape.layers, k, 2))
        draws = [rng.choice(n, size=4 * k, p=pops[layer]) for layer in range(shape.layers)]
        route: list[list[int]] = []
        for layer in range(shape.layers):
            chosen: list[int] = []
            pool = iter(draws[layer].tolist())
            for j in range(k):
                cand = -1
                if prev is not None and u[layer, j, 0] < locality:
                    cand = prev[layer][j]
                elif layer and u[layer, j, 1] < affinity:
                    cand = int(maps[layer][route[layer - 1][j]])
                while cand < 0 or cand in chosen:
                    nxt = next(pool, None)
                    cand = int(rng.choice(n, p=pops[layer])) if nxt is None else nxt
                chosen.append(cand)
            route.append(chosen)
        prev = route
        yield route


def synthetic_trace(shape: MoEShape, path: str | os.PathLike[str], tokens: int, *,
                    seed: int = 0, bits: int = 16, zipf: float = 1.0, locality: float = 0.3,
                    affinity: float = 0.4) -> Path:
    """Write a synthetic routing trace (the ``rkv-moe-trace`` format) of ``shape``."""
    p = Path(path)
    model = (f"synthetic:{shape.name}(zipf={zipf:g},locality={locality:g},"
             f"affinity={affinity:g},seed={seed})")
    header = {"format": "rkv-moe-trace", "version": 1, "model": model,
              "fingerprint": f"{seed:016x}", "layers": shape.layers,
              "experts": shape.experts, "top_k": shape.top_k,
              "expert_bytes": shape.expert_bytes(bits)}
    with p.open("w", encoding="utf-8") as f:
        f.write(json.dumps(header) + "\n")
        for t, route in enumerate(synthetic_routes(shape, tokens, seed=seed, zipf=zipf,
                                                   locality=locality, affinity=affinity)):
            f.write(json.dumps({"t": t, "layers": route}, separators=(",", ":")) + "\n")
    return p


def table(bits: Sequence[int] = BITS) -> list[dict[str, object]]:
    """Every preset with its expert sizes, for docs and ``--json``."""
    return [{"name": s.name, "source": s.source, "layers": s.layers, "experts": s.experts,
             "top_k": s.top_k, "expert_params": s.expert_params,
             **{f"expert_bytes_{b}bit": s.expert_bytes(b) for b in bits},
             **{f"routed_bytes_{b}bit": s.routed_bytes(b) for b in bits},
             "shared_experts": s.shared_experts} for s in PRESETS.values()]
