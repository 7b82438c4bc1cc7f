"""Making room in a tier: LRU demotion down the tiers, eviction from the last one.

Everything here runs inside one index write transaction (see :mod:`rkv.txn`). Every loop is
bounded and every pass must free bytes, or the caller is told there is no room: a stale LRU
row, a damaged record or a chunk with children can no longer wedge a put.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

from rkv.blockcodec import reencode
from rkv.config import EngineConfig
from rkv.errors import IntegrityError, TierFullError
from rkv.index import ChunkMeta, Index, Usage
from rkv.keys import block_key
from rkv.record import decode_record
from rkv.tiers import Tier
from rkv.txn import Pending

log = logging.getLogger("rkv")
#: Victim-selection rounds per call before giving up (each round must free bytes).
MAX_ROUNDS = 256


def free_chunk(ix: Index, txn: Any, key: bytes, meta: ChunkMeta | None, pending: Pending,
               usage: Usage | None) -> None:
    """Remove one chunk from the index; its records are deleted after the commit. A damaged
    entry (``meta`` None) leaves its records as unreferenced ones for verify to reclaim."""
    ix.del_chunk(txn, key, meta)
    if meta is None:
        return
    for layer, (tier, size) in enumerate(meta.blocks):
        pending.drop(tier, block_key(key, layer))
        if usage is not None:
            usage.add(tier, -1, -size)


def subtree(ix: Index, txn: Any, key: bytes) -> list[bytes]:
    """``key`` and every stored descendant (breadth first; bounded by the index size)."""
    out, frontier, seen = [key], [key], {key}
    limit = ix.count_chunks(txn) + 1
    while frontier and len(out) <= limit:
        nxt = []
        for k in frontier:
            for kid in ix.kids(txn, k):
                if kid not in seen and ix.has_chunk(txn, kid):
                    seen.add(kid)
                    nxt.append(kid)
        out.extend(nxt)
        frontier = nxt
    return out


class Evictor:
    """Demotes and evicts for one engine (its index, tiers and config)."""

    def __init__(self, ix: Index, tiers: dict[str, Tier], config: EngineConfig,
                 codecs: dict[str, Any]) -> None:
        self.ix = ix
        self.tiers = tiers
        self.config = config
        self.codecs = codecs
        self.order = [t.name for t in config.tiers]

    def usable(self, name: str) -> bool:
        tier = self.tiers[name]
        if tier.state != "damaged":
            tier.ensure_checked()      # once per process, under the writer lock
        return tier.state != "damaged"

    def place(self, txn: Any, usage: Usage, size: Callable[[str], int], protect: set[bytes],
              pending: Pending, stats: Counter[str]) -> str:
        """The first usable tier that has (or can be made to have) room for a chunk of
        ``size(tier)`` bytes (the size depends on the tier's codec)."""
        for level, name in enumerate(self.order):
            if self.usable(name) and self.make_room(txn, level, size(name), usage, protect,
                                                    pending, stats):
                return name
        usable = [n for n in self.order if self.usable(n)]
        raise TierFullError(
            f"no tier can take a chunk of {size(usable[-1] if usable else self.order[-1])} "
            f"bytes (full of pinned or in-use data, damaged, or on_full="
            f"'{self.config.on_full}')"
        )

    def _below(self, level: int) -> int | None:
        for lower in range(level + 1, len(self.order)):
            if self.usable(self.order[lower]):
                return lower
        return None

    def make_room(self, txn: Any, level: int, need: int, usage: Usage, protect: set[bytes],
                  pending: Pending, stats: Counter[str]) -> bool:
        """Demote (upper tiers) or evict (last usable tier) LRU chunks until ``need`` fits."""
        name = self.order[level]
        cap = self.config.tiers[level].capacity_bytes
        if need > cap or not self.usable(name):
            return False
        below = self._below(level)
        for _ in range(MAX_ROUNDS):
            if usage.bytes(name) + need <= cap:
                return True
            if below is None and self.config.on_full == "error":
                raise TierFullError(
                    f"tier {name} is full ({usage.bytes(name)} of {cap} bytes) and "
                    "on_full='error'"
                )
            deficit = usage.bytes(name) + need - cap
            victims = self._victims(txn, name, deficit, protect, leaves_only=below is None)
            if not victims and below is None:
                victims = self._subtrees(txn, name, deficit, protect)
            if not victims:
                return False
            before = usage.bytes(name)
            for key, meta in victims:
                if below is None:
                    for k in subtree(self.ix, txn, key):
                        m = meta if k == key else self.ix.read_chunk(txn, k)
                        free_chunk(self.ix, txn, k, m, pending, usage)
                        stats["evicted"] += 1
                elif not self._demote(txn, key, meta, level, below, usage, protect, pending,
                                      stats):
                    return False
            if usage.bytes(name) >= before:
                return False  # no progress: never loop on the same victims
        return usage.bytes(name) + need <= cap

    def _victims(self, txn: Any, name: str, deficit: int, protect: set[bytes], *,
                 leaves_only: bool) -> list[tuple[bytes, ChunkMeta]]:
        """Least recently used unpinned chunks with bytes in ``name`` (only leaves when the
        tier is the last, so prefixes stay reachable). Stale LRU rows are dropped."""
        victims: list[tuple[bytes, ChunkMeta]] = []
        stale: list[tuple[int, bytes]] = []
        freed = 0
        for at, key in self.ix.lru_order(txn, name):
            if key in protect:
                continue
            meta = self.ix.read_chunk(txn, key)
            if meta is None or meta.at != at or meta.bytes_in(name) == 0:
                stale.append((at, key))
                continue
            if meta.pins or (leaves_only and self.ix.has_kids(txn, key)):
                continue
            victims.append((key, meta))
            freed += meta.bytes_in(name)
            if freed >= deficit:
                break
        for at, key in stale:
            self.ix.drop_lru_row(txn, name, at, key)
        return victims

    def _subtrees(self, txn: Any, name: str, deficit: int, protect: set[bytes]
                  ) -> list[tuple[bytes, ChunkMeta]]:
        """When no leaf can go: least recently used chunks evicted with their descendants,
        if none of those is pinned or protected."""
        victims: list[tuple[bytes, ChunkMeta]] = []
        taken: set[bytes] = set()
        freed = 0
        for _, key in self.ix.lru_order(txn, name):
            meta = self.ix.read_chunk(txn, key)
            if key in protect or key in taken or meta is None or meta.pins:
                continue
            tree = subtree(self.ix, txn, key)
            metas = [self.ix.read_chunk(txn, k) for k in tree[1:]]
            if any(k in protect or k in taken for k in tree) or any(
                    m is not None and m.pins for m in metas):
                continue
            taken.update(tree)
            victims.append((key, meta))
            freed += meta.bytes_in(name) + sum(m.bytes_in(name) for m in metas if m)
            if freed >= deficit:
                break
        return victims

    def _demote(self, txn: Any, key: bytes, meta: ChunkMeta, level: int, below: int,
                usage: Usage, protect: set[bytes], pending: Pending,
                stats: Counter[str]) -> bool:
        name, dst = self.order[level], self.order[below]
        if not self.make_room(txn, below, meta.bytes_in(name), usage, protect | {key},
                              pending, stats):
            return False
        blocks, moved = [], []
        try:
            for layer, (tier, size) in enumerate(meta.blocks):
                if tier == name:
                    bkey = block_key(key, layer)
                    new_size = pending.move(bkey, name, dst, self._transcoder(dst, stats))
                    moved.append(bkey)
                    tier, size = dst, new_size
                blocks.append((tier, size))
        except IntegrityError as exc:
            # A record that cannot be read (missing, damaged page) makes the chunk useless:
            # drop it rather than wedge every later put behind it.
            for bkey in moved:
                pending.drop(dst, bkey)
            log.warning("dropping chunk %s: a block cannot be moved (%s)", key.hex()[:16], exc)
            free_chunk(self.ix, txn, key, meta, pending, usage)
            stats["dropped_damaged"] += 1
            return True
        for layer, (tier, size) in enumerate(meta.blocks):
            if tier == name:
                usage.add(name, -1, -size)
                usage.add(dst, 1, blocks[layer][1])
        self.ix.put_chunk(txn, key, meta.with_(blocks=tuple(blocks)), meta)
        stats["demoted"] += 1
        return True

    def _transcoder(self, tier: str, stats: Counter[str]) -> Callable[[Any], Any]:
        """Re-encode a moving record with ``tier``'s codec. A record that fails verification
        moves unchanged, so its reads still report it (never silently "repaired")."""
        codec = self.codecs[tier]

        def transform(record: Any) -> Any:
            try:
                dec = decode_record(record)
                out = reencode(record, dec, codec)
            except IntegrityError:
                stats["moved_corrupt"] += 1
                return record
            if out is not record:
                stats["reencoded"] += 1
            return out

        return transform
