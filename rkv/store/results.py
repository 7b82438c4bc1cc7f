"""What the engine's calls return: per-block statuses, get/put results, verify reports."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from rkv.errors import IntegrityError
from rkv.ui.sizes import human_bytes  # re-exported: callers import it from here

__all__ = ["CORRECTED", "DEGRADED", "MISSING", "OK", "UNCORRECTABLE", "BlockLog", "BlockStatus",
           "GetResult", "PrefetchResult", "PutResult", "VerifyReport", "human_bytes"]

#: Block outcomes reported by :meth:`Engine.get` and :meth:`Engine.verify`.
OK, CORRECTED, UNCORRECTABLE, MISSING = "ok", "corrected", "uncorrectable", "missing"
#: A block whose strictly verified part (the high byte plane) is exact and whose tolerant
#: part failed its check: returned with bounded numeric noise, never silently.
DEGRADED = "degraded"


@dataclass(frozen=True, slots=True)
class BlockStatus:
    """The outcome of reading one block."""

    chunk: int
    layer: int
    tier: str
    status: str                   # ok | corrected | degraded | uncorrectable | missing
    corrected: int = 0            # symbols (Reed-Solomon) or bits (BCH) the ECC corrected
    error: IntegrityError | None = None
    header_repairs: int = 0       # header/prelude copies that were outvoted or skipped


class BlockLog:
    """Block outcomes of one read, kept compactly: the chunks read (their tiers per layer,
    from the index) and a :class:`BlockStatus` only for blocks that were not plainly ok. The
    fast path of a clean read makes no per-block object; the full list is built on demand."""

    __slots__ = ("chunks", "extra", "special")

    def __init__(self) -> None:
        self.chunks: list[tuple[int, tuple[str, ...]]] = []   # (chunk, tier of each layer)
        self.special: dict[tuple[int, int], BlockStatus] = {}
        self.extra: list[BlockStatus] = []                      # after the chunks (index)

    def __len__(self) -> int:
        return sum(len(t) for _, t in self.chunks) + len(self.extra)

    def statuses(self) -> list[BlockStatus]:
        sp = self.special
        out = [sp.get((ci, layer)) or BlockStatus(ci, layer, tier, OK)
               for ci, tiers in self.chunks for layer, tier in enumerate(tiers)]
        return out + self.extra

    def counts(self) -> Counter[str]:
        c = Counter(b.status for b in (*self.special.values(), *self.extra))
        c[OK] += len(self) - sum(c.values())
        return c


class GetResult:
    """KV for the longest verified stored prefix of the requested tokens.

    ``blocks`` (a :class:`BlockStatus` per block read) is built on first access: a clean read
    of thousands of blocks makes no per-block object unless the caller asks for them."""

    __slots__ = ("_blocks", "kv", "n_tokens", "stored_tokens")

    def __init__(self, n_tokens: int, kv: Any, blocks: list[BlockStatus] | BlockLog,
                 stored_tokens: int) -> None:
        self.n_tokens = n_tokens
        self.kv = kv                  # [layers, 2, n_tokens, kv_heads, head_dim], numpy or torch
        self._blocks = blocks
        self.stored_tokens = stored_tokens   # what the index promised before verification

    def __repr__(self) -> str:
        return (f"GetResult(n_tokens={self.n_tokens}, stored_tokens={self.stored_tokens}, "
                f"counts={self.counts})")

    @property
    def blocks(self) -> list[BlockStatus]:
        if isinstance(self._blocks, BlockLog):
            self._blocks = self._blocks.statuses()
        return self._blocks

    def _special(self) -> list[BlockStatus]:
        b = self._blocks
        return [*b.special.values(), *b.extra] if isinstance(b, BlockLog) else b

    @property
    def counts(self) -> dict[str, int]:
        b = self._blocks
        c = b.counts() if isinstance(b, BlockLog) else Counter(x.status for x in b)
        return {s: c.get(s, 0) for s in (OK, CORRECTED, DEGRADED, UNCORRECTABLE, MISSING)}

    @property
    def degraded(self) -> int:
        """Blocks returned with an unverified tolerant part (bounded noise)."""
        return sum(1 for b in self._special() if b.status == DEGRADED)

    @property
    def corrected(self) -> int:
        return sum(b.corrected for b in self._special())

    @property
    def ok(self) -> bool:
        """True when every stored block was read back (clean, corrected or degraded: check
        :attr:`degraded` for blocks with bounded noise)."""
        return self.n_tokens == self.stored_tokens

    def errors(self) -> list[IntegrityError]:
        return [b.error for b in self.blocks if b.error is not None]


@dataclass(frozen=True)
class PutResult:
    n_tokens: int
    chunks: int
    chunks_written: int
    chunks_deduped: int
    blocks_written: int
    bytes_written: int
    evicted_chunks: int = 0
    demoted_chunks: int = 0
    tiers: dict[str, int] = field(default_factory=dict)   # chunks written per tier (a chunk
    #                                            planned into several counts in each)
    #: New chunks not stored: refused by every full tier's admission policy, or no room
    #: could be made without evicting pinned, in-flight or this put's own chunks.
    chunks_refused: int = 0


@dataclass(frozen=True)
class PrefetchResult:
    """What an :meth:`Engine.prefetch` did once it finished."""

    tier: str                     # where the prefix was asked to be
    chunks: int                   # chunks of the stored prefix when the prefetch ran
    promoted: int                 # moved up into ``tier``
    already: int                  # were in ``tier`` or above
    failed: int                   # could not be moved (no room, or dropped as damaged)
    evicted_chunks: int = 0       # evicted from the last tier to make room
    demoted_chunks: int = 0       # pushed down to make room
    skipped: int = 0              # below ``tier`` but left there: over the byte budget


@dataclass(frozen=True)
class VerifyReport:
    """What :meth:`Engine.verify` found.

    ``unreadable_chunks``: index entries that failed their checksum; ``unreachable``: chunks
    whose parent is not stored (kept: they become reachable again when the prefix is stored);
    ``orphans``: records no index entry refers to; ``damaged_tiers``: tiers that cannot be
    read as a whole; ``dropped``: chunks the store dropped since the last repair because their
    tier was wiped (a memory tier after a reboot).
    """

    chunks: int
    blocks: int
    ok: int
    corrected: int
    uncorrectable: int
    missing: int
    orphans: int
    problems: list[tuple[str, int, str, str]]   # (chunk key hex, layer, tier, message)
    repaired: int = 0
    unreadable_chunks: int = 0
    unreachable: int = 0
    damaged_tiers: list[str] = field(default_factory=list)
    dropped: int = 0
    reclaimed: int = 0
    usage_fixed: bool = False
    degraded: int = 0             # readable with bounded noise (a tolerant plane failed)
    labelled: int = 0             # old index entries given their blocks' pipeline labels

    @property
    def clean(self) -> bool:
        return (self.uncorrectable == 0 and self.missing == 0 and self.unreadable_chunks == 0
                and not self.damaged_tiers and self.dropped == 0)
