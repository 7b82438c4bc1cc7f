"""Helpers of the expert-replay tests (test_moe_replay, test_moe_replay_link): a hand-made
routing trace file and a slow source whose 100-byte experts load in one second."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rkv.moe import replay as R

SLOW = R.Source("test", bandwidth=100.0, latency=0.0)     # 100-byte experts load in 1 s


def write(path: Path, routes: list[list[list[int]]], *, experts: int = 4, top_k: int = 1,
          hints: list[list[list[int]]] | None = None, expert_bytes: int = 100) -> Path:
    """A routing trace at ``path``: ``routes[t][layer]`` the token's experts, ``hints``
    (optional) the same shape."""
    head = {"format": "rkv-moe-trace", "version": 1, "model": "hand", "fingerprint": "ab",
            "layers": len(routes[0]), "experts": experts, "top_k": top_k,
            "expert_bytes": expert_bytes}
    lines = [json.dumps(head)]
    for t, route in enumerate(routes):
        obj: dict[str, Any] = {"t": t, "layers": route}
        if hints is not None:
            obj["hints"] = hints[t]
        lines.append(json.dumps(obj))
    path.write_text("\n".join(lines) + "\n")
    return path
