"""The stored mix: per tier, blocks and bytes per (bits, code), from the index alone.

Every index entry records each block's pipeline as a short label (``ChunkMeta.pipes``,
``"<bits>/<code>"``), written when the block is written, moved, re-quantized or repaired.
:meth:`Engine.stats` counts the labels during the scan of the index it makes anyway, so the
mix costs no record reads. Entries written before labels existed (or by an older release
that rewrote an entry) have none: their blocks count as ``unknown``.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Any

from rkv.quant.widths import width_text
from rkv.store.index import ChunkMeta, label_parts, pipe_label
from rkv.ui.sizes import human_bytes
from rkv.ui.tables import Column, render

if TYPE_CHECKING:
    from rkv.codec.pipeline import Pipeline
    from rkv.ecc.base import Codec
    from rkv.quant import Quantizer

UNKNOWN = "unknown"


def stages_label(quant: Quantizer | None, codec: Codec | None) -> str:
    """The label of a block quantized by ``quant`` (None: 16 bits) and coded by ``codec``."""
    return pipe_label((16, 16) if quant is None else quant.widths,
                      "none" if codec is None else codec.spec)


@lru_cache(maxsize=1024)
def pipeline_label(pipe: Pipeline) -> str:
    return stages_label(pipe.quant, pipe.codec)


def mix_key(label: str) -> str:
    """How the mix names a label: ``"4-bit + rs(n=255,k=239,interleave=1)"``."""
    if not label:
        return UNKNOWN
    width, code = label_parts(label)
    return f"{width_text(width)}-bit + {code}"


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
        """``{"4-bit + rs(...)": {"bits", "vbits", "code", "blocks", "bytes"}, ...}``, largest
        first (``bits`` the keys', ``vbits`` the values'; ``"4+2-bit + ..."`` when they
        differ); ``"unknown"`` (bits and code None) for blocks without a label."""
        rows = sorted(((lab, n) for (t, lab), n in self._n.items() if t == name),
                      key=lambda r: (-r[1][1], r[0]))
        out: dict[str, dict[str, Any]] = {}
        for lab, (blocks, nbytes) in rows:
            width, code = label_parts(lab) if lab else ((None, None), None)
            out[mix_key(lab)] = {"bits": width[0], "vbits": width[1], "code": code,
                                 "blocks": blocks, "bytes": nbytes}
        return out


def mix_rows(tiers: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per tier and (bits, code) of the stored mix (``stats()["tiers"]``): tier, bits
    and code (None: unknown), blocks, bytes and the share of the tier's bytes."""
    rows = []
    for name, t in tiers.items():
        total = sum(r["bytes"] for r in t.get("mix", {}).values()) or 1
        for r in t.get("mix", {}).values():
            bits = r["bits"] if r.get("vbits") in (None, r["bits"]) else \
                width_text((r["bits"], r["vbits"]))
            rows.append({"tier": name, "bits": bits, "code": r["code"],
                         "blocks": r["blocks"], "bytes": r["bytes"],
                         "share": r["bytes"] / total})
    return rows


_COLUMNS = [Column("tier"), Column("bits", fmt=lambda b: str(b)),
            Column("code", fmt=lambda c: str(c)),
            Column("blocks", align="right", fmt="{:,}"),
            Column("bytes", align="right", fmt=human_bytes),
            Column("share", align="right", fmt=lambda x: f"{100 * x:.1f} %")]


def mix_table(tiers: dict[str, dict[str, Any]], fmt: str = "text") -> str:
    """``rkv info``'s table of the stored mix (:func:`mix_rows`) in ``fmt`` (text, json, csv,
    markdown). Text is empty when nothing is stored."""
    rows = mix_rows(tiers)
    if not rows and fmt in ("text", "markdown"):
        return ""
    shown = [{**r, "bits": UNKNOWN if r["bits"] is None else r["bits"],
              "code": r["code"] or UNKNOWN} for r in rows] if fmt in ("text", "markdown") \
        else rows
    return render(shown, _COLUMNS, fmt=fmt, title="stored mix")
