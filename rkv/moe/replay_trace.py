"""The routing trace as the expert replay reads it (:mod:`rkv.moe.replay`).

Format ``rkv-moe-trace`` version 1, JSON Lines: a header ``{"format": "rkv-moe-trace",
"version": 1, "model": name, "fingerprint": hex, "layers": L, "experts": E, "top_k": k,
"expert_bytes": bytes of one expert at fp16}``, then one line per token ``{"t": index,
"layers": [[e, ...] per layer]}`` with optional ``"scores"`` (ignored here) and optional
``"hints"``: one list per layer of the experts the model's speculative router predicted for
that layer before its router ran (issued during the previous layer; ``[]`` when none).

This private reader stays until :func:`rkv.moe.trace.read_moe_trace` accepts ``hints``.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rkv.errors import InputError

FORMAT = "rkv-moe-trace"
_MAX_DIM = 1 << 16


@dataclass
class MoETrace:
    """A routing trace: per token, per layer, the experts chosen (and optionally hinted)."""

    model: str
    fingerprint: str
    layers: int
    experts: int
    top_k: int
    expert_bytes: int
    routes: list[list[tuple[int, ...]]]            # [token][layer] -> expert ids
    hints: list[list[tuple[int, ...]]] | None = None   # [token][layer] -> predicted ids
    path: str = ""
    _refs: list[Hashable] | None = field(default=None, repr=False)

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
        return replace(self, expert_bytes=nbytes, _refs=self._refs)


# -- reading ---------------------------------------------------------------------------------------
def read_trace(path: str | Path, limit: int | None = None) -> MoETrace:
    """Read an ``rkv-moe-trace`` file (JSON Lines: a header, then one line per token); at most
    ``limit`` tokens. Any problem raises :class:`InputError` naming the file and line."""
    from rkv.traces import _lines, _show

    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)
                              or limit < 1):
        raise InputError(f"limit must be an integer >= 1, got {limit!r}")
    lines = _lines(path, "MoE trace")
    first = next(lines, None)
    if first is None:
        raise InputError(f"{path}: empty MoE trace (no header)")
    lineno, head = first

    def bad(msg: str) -> InputError:
        return InputError(f"{path}:{lineno}: {msg}")

    if not isinstance(head, dict) or head.get("format") != FORMAT:
        raise bad(f'the first line must be a header with "format": "{FORMAT}"')
    if head.get("version") != 1:
        raise bad(f"unsupported MoE trace version {_show(head.get('version'))} (known: 1)")
    dims = {}
    for name, hi in (("layers", _MAX_DIM), ("experts", _MAX_DIM), ("top_k", _MAX_DIM),
                     ("expert_bytes", 1 << 50)):
        v = head.get(name)
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= hi:
            raise bad(f"header {name!r} must be an integer in [1, {hi}], got {_show(v)}")
        dims[name] = v
    if dims["top_k"] > dims["experts"]:
        raise bad(f"header top_k {dims['top_k']} exceeds experts {dims['experts']}")
    for name in ("model", "fingerprint"):
        if not isinstance(head.get(name, ""), str):
            raise bad(f"header {name!r} must be a string")
    nl, ne = dims["layers"], dims["experts"]

    def ids(v: Any, what: str, exact: int | None) -> tuple[int, ...]:
        if not isinstance(v, list) or (exact is not None and not 1 <= len(v) <= exact):
            raise bad(f"{what} must be a list of 1 to {exact} expert ids, got {_show(v)}")
        for e in v:
            if isinstance(e, bool) or not isinstance(e, int) or not 0 <= e < ne:
                raise bad(f"{what}: expert ids must be integers in [0, {ne}), got {_show(e)}")
        if len(set(v)) != len(v):
            raise bad(f"{what} repeats an expert: {_show(v)}")
        return tuple(v)

    def per_layer(v: Any, what: str, exact: int | None) -> list[tuple[int, ...]]:
        if not isinstance(v, list) or len(v) != nl:
            raise bad(f"{what!r} must be a list of {nl} lists (one per layer), got {_show(v)}")
        return [ids(x, f"{what}[{j}]", exact) for j, x in enumerate(v)]

    routes: list[list[tuple[int, ...]]] = []
    hints: list[list[tuple[int, ...]]] = []
    any_hints = False
    for n, obj in lines:
        lineno = n          # what ``bad`` reports
        if not isinstance(obj, dict):
            raise bad(f"expected a JSON object, got {type(obj).__name__}")
        t = obj.get("t")
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise bad(f"'t' must be an integer >= 0, got {_show(t)}")
        routes.append(per_layer(obj.get("layers"), "layers", dims["top_k"]))
        if "hints" in obj:
            any_hints = True
            h = obj["hints"]
            if not isinstance(h, list) or len(h) != nl:
                raise bad(f"'hints' must be a list of {nl} lists, got {_show(h)}")
            hints.append([() if x == [] else ids(x, f"hints[{j}]", ne)
                          for j, x in enumerate(h)])
        else:
            hints.append([()] * nl)
        if limit is not None and len(routes) >= limit:
            break
    if not routes:
        raise InputError(f"{path}: the MoE trace has no tokens")
    return MoETrace(str(head.get("model", "")), str(head.get("fingerprint", "")), nl, ne,
                    dims["top_k"], dims["expert_bytes"], routes, hints if any_hints else None,
                    str(path))
