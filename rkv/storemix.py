"""The stored mix: per tier, blocks and bytes per (bits, code), from the index alone.

Every index entry records each block's pipeline as a short label (``ChunkMeta.pipes``,
``"<bits>/<code>"``), written when the block is written, moved, re-quantized or repaired.
:meth:`Engine.stats` counts the labels during the scan of the index it makes anyway, so the
mix costs no record reads. Entries written before labels existed (or by an older release
that rewrote an entry) have none: their blocks count as ``unknown``.
"""

from __future__ import annotations

import io
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from rkv.index import ChunkMeta, label_parts, pipe_label

if TYPE_CHECKING:
    from rkv.ecc.base import Codec
    from rkv.pipeline import Pipeline
    from rkv.quant import Quantizer

UNKNOWN = "unknown"


def stages_label(quant: Quantizer | None, codec: Codec | None) -> str:
    """The label of a block quantized by ``quant`` (None: 16 bits) and coded by ``codec``."""
    return pipe_label(16 if quant is None else int(quant.bits),
                      "none" if codec is None else codec.spec)


@lru_cache(maxsize=1024)
def pipeline_label(pipe: Pipeline) -> str:
    return stages_label(pipe.quant, pipe.codec)


def mix_key(label: str) -> str:
    """How the mix names a label: ``"4-bit + rs(n=255,k=239,interleave=1)"``."""
    if not label:
        return UNKNOWN
    bits, code = label_parts(label)
    return f"{bits}-bit + {code}"


class Mix:
    """Blocks and bytes per (tier, label), added one index entry at a time."""

    def __init__(self) -> None:
        self._n: dict[tuple[str, str], list[int]] = {}

    def add(self, meta: ChunkMeta) -> None:
        pipes = meta.pipes
        for layer, (tier, size) in enumerate(meta.blocks):
            key = (tier, pipes[layer] if layer < len(pipes) else "")
            cur = self._n.get(key)
            if cur is None:
                self._n[key] = [1, size]
            else:
                cur[0] += 1
                cur[1] += size

    def tier(self, name: str) -> dict[str, dict[str, Any]]:
        """``{"4-bit + rs(...)": {"bits", "code", "blocks", "bytes"}, ...}``, largest first;
        ``"unknown"`` (bits and code None) for blocks without a label."""
        rows = sorted(((lab, n) for (t, lab), n in self._n.items() if t == name),
                      key=lambda r: (-r[1][1], r[0]))
        out: dict[str, dict[str, Any]] = {}
        for lab, (blocks, nbytes) in rows:
            bits, code = label_parts(lab) if lab else (None, None)
            out[mix_key(lab)] = {"bits": bits, "code": code, "blocks": blocks,
                                 "bytes": nbytes}
        return out


def mix_table(tiers: dict[str, dict[str, Any]]) -> str:
    """``rkv info``'s table of the stored mix (``stats()["tiers"]``): one row per tier and
    (bits, code); ``rich`` when installed, else plain text. Empty when nothing is stored."""
    from rkv.results import human_bytes

    head = ("tier", "bits", "code", "blocks", "bytes", "share")
    rows = []
    for name, t in tiers.items():
        total = sum(r["bytes"] for r in t.get("mix", {}).values()) or 1
        for r in t.get("mix", {}).values():
            rows.append((name, UNKNOWN if r["bits"] is None else str(r["bits"]),
                         r["code"] or UNKNOWN, f"{r['blocks']:,}", human_bytes(r["bytes"]),
                         f"{100 * r['bytes'] / total:.1f} %"))
    if not rows:
        return ""
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # pragma: no cover - rich is installed in the dev venv
        widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
        return "\n".join("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True))
                         .rstrip() for r in [head, *rows]) + "\n"
    table = Table(title="stored mix")
    for i, name in enumerate(head):
        table.add_column(name, justify="right" if i >= 3 else "left")
    for r in rows:
        table.add_row(*r)
    buf = io.StringIO()
    Console(file=buf, width=120, color_system=None).print(table)
    return buf.getvalue()
