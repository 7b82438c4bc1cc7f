"""Moving a block between tiers: its code re-planned for the new tier, and with
``lossy_demotion`` its bits too, within the quality budget.

:class:`Transcode` is the record transform of one chunk's move (``Pending.move`` calls it
per block). Without placement it re-encodes with the destination tier's codec. With
placement it asks for the code planned for the destination's fault model, bits kept
(:meth:`EnginePlacement.demotion_code`); when no code there meets the targets the block
moves with the tier's own code (``Decisions.fallbacks``).

**Lossy demotion** (``[placement] lossy_demotion = true``; demotions only, never promotions):
the block may also go down to fewer bits (one of the configured ``bits``, never more than it
has) if that is the cheapest option the planner finds for the destination tier and the
quality budget holds. The budget of a stored block is that of the requests that read it: a
get reads a whole stored prefix, so every stored sequence through the block's chunk (its
ancestors, the chunk, and the deepest-KL path below it) must keep its total KL (the quality
profile's entry per layer and bits, summed over blocks as the put planner sums it) within
``quality_budget_kl``. The KL a chunk spends is known from the bits its index entry records
per layer (``ChunkMeta.pipes``); a chunk, ancestor or descendant whose bits are not all
known, a model without a quality profile, or a subtree larger than :data:`WALK_LIMIT`
chunks is never re-quantized. The new values are the quantizer's round trip of the block's
verified (corrected, dequantized) values, so the record's header says exactly what it holds.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from rkv.codec.blockcodec import read_block, reencode
from rkv.codec.pipeline import Pipeline
from rkv.codec.stages import header_stages
from rkv.errors import ConfigError, IntegrityError
from rkv.format.dtypes import numpy_dtype
from rkv.format.record import DecodedRecord, decode_record
from rkv.quant.widths import Width, fewer_bits
from rkv.store.clock import now_ns
from rkv.store.index import ChunkMeta, Index, label_parts
from rkv.store.storemix import stages_label

if TYPE_CHECKING:
    from rkv.ecc.base import Codec
    from rkv.format.model import ModelSpec
    from rkv.placement.plan import PlannedBlock
    from rkv.placement.planner import Planner
    from rkv.profiles import QualityProfile
    from rkv.store.plans import EnginePlacement

class Mover(Protocol):
    """What a transcode reads and counts on the decision site that moves the chunk
    (:class:`rkv.store.decisions.Decisions`)."""

    ix: Index
    codecs: dict[str, Codec | None]
    placement: EnginePlacement | None
    clock: Callable[[], int]
    lossy: int
    fallbacks: int
    lossy_plans: Any


log = logging.getLogger("rkv")
#: Chunks below a demoted chunk that the budget check walks at most (more: not lossy).
WALK_LIMIT = 4096


def record_label(record: Any, dec: DecodedRecord | None = None) -> str:
    """The pipeline label of a record, from its header ("" when unreadable)."""
    try:
        return stages_label(*header_stages((dec or decode_record(record)).header))
    except IntegrityError:
        return ""


def requantize(dec: DecodedRecord, pipe: Pipeline,
               erased: tuple[tuple[int, int], ...] = (),
               written_ns: int | None = None) -> Any | None:
    """The block's verified values quantized and coded by ``pipe``, stamped ``written_ns``
    (None: the record's own time). None when the block came back degraded, so its values
    are not all verified and it must not be rewritten. Raises IntegrityError when it
    cannot be verified."""
    h = dec.header
    values = np.empty(h.shape, dtype=numpy_dtype(h.dtype))
    got = read_block(dec, values, erased)
    if getattr(got, "degraded", 0):
        return None
    stamp = h.written_ns if written_ns is None else written_ns
    return pipe.encode(replace(h, checksum=bytes(16), written_ns=stamp), values)


class LossyPlans:
    """Per engine: single-block plans at a fixed bit-width for a destination tier, cached
    by (model, tokens, position, bits, tier), reliability targets applied, KL left to the
    caller's budget check."""

    def __init__(self, placement: EnginePlacement) -> None:
        self.placement = placement
        self._fixed: dict[tuple[bytes, Width], Planner] = {}
        self._plans: dict[tuple[Any, ...], PlannedBlock | None] = {}

    def option(self, spec: ModelSpec, layer: int, tokens: int, pos: int, bits: Width,
               tier: str) -> PlannedBlock | None:
        """The planned block at width ``bits`` (key bits, value bits) in ``tier`` (None: no
        code there meets the targets, or the profile has no entry)."""
        from rkv.placement.config import BlockInput
        from rkv.placement.planner import Planner

        fp = spec.fingerprint()
        hours, reuse = self.placement.expect(tier, pos)     # learned, or the config's
        key = (fp, layer, tokens, pos, bits, tier, hours, reuse)
        if key in self._plans:
            return self._plans[key]
        base = self.placement.planner(spec)
        one = self._fixed.get((fp, bits))
        if one is None:
            cfg = base.config.fixed(bits)
            one = self._fixed[fp, bits] = Planner(cfg, base.profile, base.cache)
        block = BlockInput(layer, "kv", pos, tokens, hours, reuse, spec.n_kv_heads,
                           spec.head_dim, spec.dtype, pos + 1)
        try:
            got: PlannedBlock | None = one.plan([block],
                                                [self.placement.tier_input(tier)]).blocks[0]
        except ConfigError:
            got = None
        self._plans[key] = got
        return got


class Transcode:
    """Re-encodes the blocks of one chunk moving into ``tier`` (see the module docstring),
    each stamped with the move's time (the decisions' clock, read once per chunk): a block
    written into another tier starts aging anew. ``label``: the pipeline label of the record
    it last returned ("" unknown); ``written``: its write time (0: the record moved as it
    was, unreadable, so its time is what it was)."""

    def __init__(self, decide: Mover, tier: str, stats: Counter[str],
                 txn: Any = None, key: bytes = b"", meta: ChunkMeta | None = None,
                 lossy: bool = False) -> None:
        self.decide, self.tier, self.stats = decide, tier, stats
        self.txn, self.key, self.meta = txn, key, meta
        placement = decide.placement
        self.lossy = bool(lossy and placement is not None and placement.cfg.lossy_demotion)
        self.label = ""
        self.now = now_ns(decide.clock)
        self.written = 0
        self._slack: float | None = None    # the chunk's KL headroom, once computed

    def __call__(self, record: Any, erased: tuple[tuple[int, int], ...] = ()) -> Any:
        dec = None
        self.written = 0
        try:
            dec = decode_record(record)
            quant, _ = header_stages(dec.header)
            codec, fewer = self.decide.codecs[self.tier], None
            if self.decide.placement is not None and self.meta is not None:
                codec, fewer = self._planned(dec, (16, 16) if quant is None else quant.widths)
            out = None if fewer is None else requantize(dec, fewer, erased, self.now)
            if out is not None:
                self.decide.lossy += 1
                self.stats["lossy"] += 1
            else:
                out = reencode(record, dec, codec, erased, self.now)
        except IntegrityError:
            # Moves unchanged, so its reads still report it (never silently "repaired").
            self.stats["moved_corrupt"] += 1
            self.label = "" if dec is None else record_label(record, dec)
            return record
        self.written = self.now
        if out is not record:
            self.stats["reencoded"] += 1
            self.label = record_label(out)
        else:
            self.label = record_label(record, dec)
        return out

    # -- placement ----------------------------------------------------------------------------
    def _planned(self, dec: DecodedRecord, bits: Width
                 ) -> tuple[Codec | None, Pipeline | None]:
        """The code placement plans for this block in the destination tier with its width
        (key bits, value bits) kept, or (lossy demotion) a pipeline with fewer bits."""
        from rkv.format.model import ModelSpec
        from rkv.store.plans import quant_spec

        decide, tier, meta = self.decide, self.tier, self.meta
        assert meta is not None and decide.placement is not None
        own: Codec | None = decide.codecs[tier]
        spec_d = decide.ix.get_model(self.txn, meta.fingerprint)
        if spec_d is None:
            return own, None
        spec = ModelSpec.from_dict(spec_d)
        h = dec.header
        if self.lossy:
            pick = self._lossy(spec, h.layer, h.shape[1], bits)
            if pick is not None:
                try:
                    pipe = Pipeline.parse(quant_spec(pick.width), pick.code).for_block(
                        tuple(h.shape), h.dtype)
                except ConfigError:
                    pass      # not a combination a record can hold: re-plan with bits kept
                else:
                    if fewer_bits(pipe.width, bits):
                        return pipe.codec, pipe
                    return pipe.codec, None
        try:
            return decide.placement.demotion_code(spec, h.layer, h.shape[1], meta.pos,
                                                  bits, tier).codec, None
        except ConfigError as exc:
            # No code there meets the targets: the tier's own code, counted and logged
            # (stats()["session"]["placement_fallbacks"]), rather than a failed put.
            log.warning("placement: %s; block moves with tier %s's code", exc, tier)
            decide.fallbacks += 1
            return own, None

    def _lossy(self, spec: ModelSpec, layer: int, tokens: int, bits: Width
               ) -> PlannedBlock | None:
        """The cheapest option at a width with no more bits than ``bits`` in K or V whose
        extra KL fits the chunk's headroom (None: none is feasible; the caller keeps the
        bits)."""
        decide, meta = self.decide, self.meta
        assert meta is not None and decide.placement is not None
        planner = decide.placement.planner(spec)
        profile = planner.profile
        widths = [bits, *sorted((w for w in planner.config.widths if fewer_bits(w, bits)),
                                reverse=True)]
        if profile is None or len(widths) < 2:
            return None
        if decide.lossy_plans is None:
            decide.lossy_plans = LossyPlans(decide.placement)
        try:
            now = profile.width_kl(layer, bits)
        except ConfigError:
            return None
        best: PlannedBlock | None = None
        for b in widths:
            opt = decide.lossy_plans.option(spec, layer, tokens, meta.pos, b, self.tier)
            if opt is None or (best is not None and opt.expected_cost_us >= best.expected_cost_us):
                continue
            extra = opt.kl - now
            if extra > 0 and extra > self.slack(profile):
                continue
            best = opt
        if best is not None and fewer_bits(best.width, bits):
            self._slack = self.slack(profile) - max(0.0, best.kl - now)
        return best

    def slack(self, profile: QualityProfile) -> float:
        """KL the chunk may still spend: ``quality_budget_kl`` minus the largest total of any
        stored sequence through it (-inf when some chunk's bits are unknown)."""
        if self._slack is None:
            assert self.meta is not None and self.decide.placement is not None
            worst = worst_path_kl(self.decide.ix, self.txn, self.key, self.meta, profile)
            budget = self.decide.placement.cfg.quality_budget_kl
            self._slack = -float("inf") if worst is None else budget - worst
        return self._slack


def chunk_kl(meta: ChunkMeta, profile: QualityProfile) -> float | None:
    """The KL a chunk's blocks spend at their recorded bits (None: some bits unknown)."""
    total = 0.0
    for layer in range(len(meta.blocks)):
        label = meta.pipe(layer)
        if not label:
            return None
        width = label_parts(label)[0]
        try:
            total += profile.width_kl(layer, width)
        except ConfigError:
            return None
    return total


def worst_path_kl(ix: Any, txn: Any, key: bytes, meta: ChunkMeta,
                  profile: QualityProfile) -> float | None:
    """The largest total KL of a stored sequence through chunk ``key``: its ancestors (those
    stored), itself, and the costliest path below it. None when some chunk's bits are
    unknown or the subtree exceeds :data:`WALK_LIMIT`."""
    own = chunk_kl(meta, profile)
    if own is None:
        return None
    total, parent, seen = own, meta.parent, 0
    while parent and seen <= meta.pos:
        up = ix.read_chunk(txn, parent)
        if up is None:
            break     # not stored: a read stops there, and its next put plans it afresh
        kl = chunk_kl(up, profile)
        if kl is None:
            return None
        total, parent, seen = total + kl, up.parent, seen + 1
    below = _deepest(ix, txn, key, profile)
    return None if below is None else total + below


def _deepest(ix: Any, txn: Any, key: bytes, profile: QualityProfile) -> float | None:
    """The largest KL of a chain of stored descendants of ``key`` (0.0 for a leaf)."""
    best: dict[bytes, float] = {}
    order: list[tuple[bytes, bytes]] = []     # (parent, child), parents first
    stack = [key]
    while stack:
        k = stack.pop()
        for kid in ix.kids(txn, k):
            order.append((k, kid))
            if len(order) > WALK_LIMIT:
                return None
            stack.append(kid)
    own: dict[bytes, float] = {}
    for _, kid in order:
        m = ix.read_chunk(txn, kid)
        kl = None if m is None else chunk_kl(m, profile)
        if kl is None:
            return None       # a damaged entry or unknown bits: not provably within budget
        own[kid] = kl
    for parent, kid in reversed(order):   # children before their parents
        val = own[kid] + best.get(kid, 0.0)
        if val > best.get(parent, 0.0):
            best[parent] = val
    return best.get(key, 0.0)
