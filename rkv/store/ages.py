"""How long each stored block has sat in its tier since its record was last written.

Retention errors (NAND) and latent faults (DRAM, CXL) grow with the time since a write, and
every rewrite (a repair, a move to another tier) restarts that time. Each record's header
carries its write time (record format 2, ``written_ns``) and the index keeps a copy per
layer (:attr:`rkv.store.index.ChunkMeta.written`), so ages are known from the index alone, without
reading a record. Time is the engine's clock (:attr:`rkv.store.engine.Engine.clock`), which a
simulation may run faster or fake; blocks whose write time is unknown (written before
format 2) have no age.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rkv.errors import ConfigError
from rkv.store.clock import now_ns

if TYPE_CHECKING:
    from rkv.store.core import StoreCore
    from rkv.store.index import ChunkMeta

@dataclass(frozen=True, slots=True)
class BlockAge:
    """One stored block as the index sees it."""

    key: bytes                  # chunk key (32 bytes)
    layer: int
    tier: str
    nbytes: int                 # record bytes
    written_ns: int | None      # when its record was last written; None: unknown
    age_s: float | None         # seconds since then by the engine's clock; None: unknown
    at: int                     # the chunk's last access, ns since the epoch (0: never)


def chunk_ages(key: bytes, meta: ChunkMeta, now: int, tier: str | None = None
               ) -> Iterator[BlockAge]:
    """The blocks of one index entry (those in ``tier``, or all) aged at ``now`` (ns)."""
    for layer, (where, size) in enumerate(meta.blocks):
        if tier is not None and where != tier:
            continue
        w = meta.written_at(layer)
        yield BlockAge(key, layer, where, size, w or None,
                       (now - w) / 1e9 if w else None, meta.at)


def block_ages(core: StoreCore, tier: str | None = None) -> Iterator[BlockAge]:
    """Every stored block (of ``tier``, or all) with its age, from one read snapshot of the
    index taken now (errors are raised here, not while iterating); damaged entries are
    skipped (verify reports them). An age is negative if the clock was set back."""
    core.check()
    if tier is not None and tier not in core.tiers:
        raise ConfigError(f"no tier named {tier!r} (tiers: {core.order})")
    now = now_ns(core.clock)
    ix = core.index
    with ix.env.read() as txn:
        entries = [(k, m) for k, m in ix.chunks(txn) if m is not None]
    return (age for key, meta in entries for age in chunk_ages(key, meta, now, tier))


class TierAges:
    """Per tier: blocks of unknown age, and the ages of the others (for ``stats()``)."""

    def __init__(self, now: int) -> None:
        self.now = now
        self._ages: dict[str, list[float]] = {}
        self._unknown: dict[str, int] = {}

    def add(self, meta: ChunkMeta) -> None:
        for age in chunk_ages(b"", meta, self.now):
            if age.age_s is None:
                self._unknown[age.tier] = self._unknown.get(age.tier, 0) + 1
            else:
                self._ages.setdefault(age.tier, []).append(age.age_s)

    def tier(self, name: str) -> dict[str, Any]:
        """``{"unknown": blocks, "oldest_s": ..., "median_s": ...}`` (None without ages)."""
        ages = self._ages.get(name, [])
        return {"unknown": self._unknown.get(name, 0),
                "oldest_s": max(ages) if ages else None,
                "median_s": statistics.median(ages) if ages else None}
