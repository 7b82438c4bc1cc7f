"""Moving a block between tiers: its code re-planned for the new tier, its bits kept.

:class:`Transcode` is the record transform of one chunk's move (``Pending.move`` calls it
per block). Without placement it re-encodes with the destination tier's codec. With
placement it asks for the code planned for the destination's fault model, bits kept
(:meth:`EnginePlacement.demotion_code`); when no code there meets the targets the block
moves with the tier's own code (``Decisions.fallbacks``).
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import TYPE_CHECKING, Any

from rkv.blockcodec import header_stages, reencode
from rkv.errors import ConfigError, IntegrityError
from rkv.index import ChunkMeta
from rkv.pipeline import Pipeline
from rkv.record import DecodedRecord, decode_record
from rkv.storemix import stages_label

if TYPE_CHECKING:
    from rkv.decisions import Decisions
    from rkv.ecc.base import Codec

log = logging.getLogger("rkv")


def record_label(record: Any, dec: DecodedRecord | None = None) -> str:
    """The pipeline label of a record, from its header ("" when unreadable)."""
    try:
        return stages_label(*header_stages((dec or decode_record(record)).header))
    except IntegrityError:
        return ""


class Transcode:
    """Re-encodes the blocks of one chunk moving into ``tier`` (see the module docstring).
    ``label``: the pipeline label of the record it last returned ("" unknown)."""

    def __init__(self, decide: Decisions, tier: str, stats: Counter[str],
                 txn: Any = None, key: bytes = b"", meta: ChunkMeta | None = None,
                 lossy: bool = False) -> None:
        self.decide, self.tier, self.stats = decide, tier, stats
        self.txn, self.key, self.meta = txn, key, meta
        self.lossy = lossy        # a demotion (fewer bits: not yet)
        self.label = ""

    def __call__(self, record: Any, erased: tuple[tuple[int, int], ...] = ()) -> Any:
        dec = None
        try:
            dec = decode_record(record)
            quant, _ = header_stages(dec.header)
            codec = self.decide.codecs[self.tier]
            if self.decide.placement is not None and self.meta is not None:
                codec = self._planned(dec, 16 if quant is None else int(quant.bits))
            out = reencode(record, dec, codec, erased)
        except IntegrityError:
            # Moves unchanged, so its reads still report it (never silently "repaired").
            self.stats["moved_corrupt"] += 1
            self.label = "" if dec is None else record_label(record, dec)
            return record
        if out is not record:
            self.stats["reencoded"] += 1
            self.label = record_label(out)
        else:
            self.label = record_label(record, dec)
        return out

    # -- placement ----------------------------------------------------------------------------
    def _planned(self, dec: DecodedRecord, bits: int) -> Codec | None:
        """The code placement plans for this block in the destination tier, bits kept."""
        from rkv.model import ModelSpec

        decide, tier, meta = self.decide, self.tier, self.meta
        assert meta is not None and decide.placement is not None
        own: Codec | None = decide.codecs[tier]
        spec_d = decide.ix.get_model(self.txn, meta.fingerprint)
        if spec_d is None:
            return own
        spec = ModelSpec.from_dict(spec_d)
        h = dec.header
        try:
            pipe: Pipeline = decide.placement.demotion_code(spec, h.layer, h.shape[1],
                                                            meta.pos, bits, tier)
            return pipe.codec
        except ConfigError as exc:
            # No code there meets the targets: the tier's own code, counted and logged
            # (stats()["session"]["placement_fallbacks"]), rather than a failed put.
            log.warning("placement: %s; block moves with tier %s's code", exc, tier)
            decide.fallbacks += 1
            return own
