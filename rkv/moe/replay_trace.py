"""The routing trace as the expert replay reads it (:mod:`rkv.moe.replay`).

Format ``rkv-moe-trace`` version 1, JSON Lines: a header ``{"format": "rkv-moe-trace",
"version": 1, "model": name, "fingerprint": hex, "layers": L, "experts": E, "top_k": k,
"expert_bytes": bytes of one expert at fp16}``, then one line per token ``{"t": index,
"layers": [[e, ...] per layer]}`` with optional ``"scores"`` (ignored here) and optional
``"hints"``: one list per layer of the experts the model's speculative router predicted for
that layer before its router ran (issued during the previous layer; ``[]`` when none).
:mod:`rkv.moe.trace` reads and validates it; here it becomes lists the replay walks.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field, replace
from pathlib import Path

from rkv.errors import InputError
from rkv.moe.trace import FORMAT as FORMAT  # re-exported for the replay's users
from rkv.moe.trace import TraceHeader


@dataclass
class MoETrace:
    """A routing trace: its header, and per token, per layer, the experts chosen (and
    optionally hinted)."""

    header: TraceHeader
    routes: list[list[tuple[int, ...]]]            # [token][layer] -> expert ids
    hints: list[list[tuple[int, ...]]] | None = None   # [token][layer] -> predicted ids
    path: str = ""
    _refs: list[Hashable] | None = field(default=None, repr=False)

    @property
    def model(self) -> str:
        return self.header.model

    @property
    def fingerprint(self) -> str:
        return self.header.fingerprint

    @property
    def layers(self) -> int:
        return self.header.layers

    @property
    def experts(self) -> int:
        return self.header.experts

    @property
    def top_k(self) -> int:
        return self.header.top_k

    @property
    def expert_bytes(self) -> int:
        return self.header.expert_bytes


    @property
    def tokens(self) -> int:
        return len(self.routes)

    @property
    def refs(self) -> list[Hashable]:
        """Every access in order: ``(layer, expert)`` per token, per layer, per choice."""
        if self._refs is None:
            self._refs = [(layer, e) for route in self.routes
                          for layer, chosen in enumerate(route) for e in chosen]
        return self._refs

    def with_expert_bytes(self, nbytes: int) -> MoETrace:
        return replace(self, header=replace(self.header, expert_bytes=nbytes),
                       _refs=self._refs)


# -- reading ---------------------------------------------------------------------------------------
def read_trace(path: str | Path, limit: int | None = None) -> MoETrace:
    """Read an ``rkv-moe-trace`` file with :func:`rkv.moe.trace.read_moe_trace` (the one
    reader and validator of the format), at most ``limit`` tokens, into the lists the replay
    walks. Any problem raises :class:`InputError` naming the file and line."""
    from rkv.moe.trace import read_moe_trace

    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)
                              or limit < 1):
        raise InputError(f"limit must be an integer >= 1, got {limit!r}")
    head, tokens = read_moe_trace(path)
    nl = head.layers
    routes: list[list[tuple[int, ...]]] = []
    hints: list[list[tuple[int, ...]]] = []
    any_hints = False
    for tok in tokens:
        routes.append([tuple(x) for x in tok.layers])
        if tok.hints is not None:
            any_hints = True
            hints.append([tuple(x) for x in tok.hints])
        else:
            hints.append([()] * nl)
        if limit is not None and len(routes) >= limit:
            break
    if not routes:
        raise InputError(f"{path}: the MoE trace has no tokens")
    return MoETrace(head, routes, hints if any_hints else None, str(path))
