"""Sharing prefixes through a shared remote tier: probe on a local index miss, adopt, forget.

Chunk keys are content-addressed (a key is the hash of the whole prefix and the model), so
nodes need no shared index: when the local index stops before a request does, the engine
asks each shared remote tier for the next chunks' block keys (:meth:`RemoteShare.probe`).

* **Probe**: one round trip asks for the length of layer 0 of every missing chunk; for the
  chunks present, a second reads the first bytes of every layer (the record's preludes and
  a header copy, after the MAC envelope on an authenticated tier). A chunk is adopted when
  every layer is there and its header verifies and says what the key asks for: the chunk
  key, the layer, the model fingerprint and the shape of that chunk's tokens (its length
  is checked by the read). Adoption stops at the first chunk that fails.
* **A put's probe** counts nothing as stored that is not: first it asks the server for the
  values of the chunks the local index has in a remote tier (one round trip of lengths per
  tier) and forgets those the server lost (a restart, eviction, expiry), so the put stores
  them again; a tier that cannot be asked fails the put (TierUnavailableError). Then, on an
  authenticated tier, a chunk is adopted only when every value of it verifies its MAC in
  full under this node's keys: a value a writer without the key planted is not adopted,
  the put overwrites it and counts it as written.
* **Adopt**: the chunks found are written to the local index as blocks of the remote tier
  (one mutation); nothing is copied. The get that follows reads them through the normal
  read path, which verifies every record in full (MAC, header vote, checksum, ECC).
* **Forget**: a chunk whose block in a shared tier then reads as missing (evicted or
  expired on the server, or a server that lost its data) or fails verification is removed
  from the local index after the read (its local blocks with it; nothing is deleted on
  the server), so a later put stores it again and a later probe can find it again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from policies.base import Reason
from rkv.codec.stages import header_stages
from rkv.errors import (
    AuthenticationError,
    CorruptStoreError,
    RkvError,
    StaleRecordError,
    TierUnavailableError,
)
from rkv.format.keys import KEY_BYTES, block_key, chunk_bounds
from rkv.format.model import ModelSpec
from rkv.format.record import peek_header
from rkv.store.decisions import free_chunk
from rkv.store.index import ChunkMeta
from rkv.store.results import MISSING, UNCORRECTABLE, BlockLog
from rkv.store.storemix import stages_label
from rkv.store.txn import Pending
from rkv.tiers.base import Tier
from rkv.tiers.wrapper import unwrap

log = logging.getLogger("rkv")

if TYPE_CHECKING:
    from rkv.store.core import StoreCore
    from rkv.tiers.redis_tier import RedisTier

#: Bytes read from the front of each value by a probe: MAC envelope, two preludes and a
#: header copy with a codec list (a raw record's header copy is 127 bytes).
PROBE_BYTES = 1024


def remote_of(tier: Tier) -> RedisTier | None:
    """The Redis tier under ``tier`` and its wrappers (None: not a remote tier)."""
    from rkv.tiers.redis_tier import RedisTier

    return unwrap(tier, RedisTier)


class RemoteShare:
    """The probe, adoption and forgetting of one engine (see the module docstring)."""

    def __init__(self, core: StoreCore) -> None:
        self.core = core
        self.names = [t.name for t in core.config.tiers
                      if t.kind == "redis" and t.remote_settings().shared]
        #: Every remote tier, shared or not (a put asks them whether they still hold what
        #: the index says they do).
        self.remote = [t.name for t in core.config.tiers if t.kind == "redis"]
        #: Chunks whose shared record failed verification here: not adopted again until
        #: this engine stores them itself (so a put rewrites them instead of deduplicating).
        self.bad: set[bytes] = set()
        self._warned = False

    def _tiers(self) -> list[tuple[str, RedisTier]]:
        out = []
        for name in self.names:
            tier = remote_of(self.core.tiers[name])
            if tier is not None and tier.state == "damaged":
                self.core.watch.observe(name, "damaged")
            elif tier is not None:
                out.append((name, tier))
        return out

    # -- probe and adopt --------------------------------------------------------------------
    def probe(self, requests: Sequence[tuple[list[bytes], int]], spec: ModelSpec, *,
              put: bool = False) -> int:
        """Adopt the chunks of ``requests`` (chunk keys, tokens) that the local index lacks
        and a shared remote tier holds; returns the chunks adopted. A tier that cannot be
        reached is skipped (its chunks stay unknown: a miss). ``put``: the probe of a put
        (see the module docstring): indexed chunks the server lost are forgotten first
        (TierUnavailableError when it cannot be asked), and on an authenticated tier only
        chunks whose values verify in full are adopted."""
        core = self.core
        if core.readonly:
            return 0
        if put:
            self.forget_lost(requests)
        if not self.names:
            return 0
        ix = core.index
        todo: list[tuple[list[bytes], int, int]] = []     # keys, first missing, tokens
        with ix.env.read() as txn:
            for keys, n_tokens in requests:
                metas, damaged = core.reads.stored(txn, keys)
                if damaged is None and len(metas) < len(keys):
                    todo.append((keys, len(metas), n_tokens))
        if not todo:
            return 0
        fp = spec.fingerprint()
        found: list[tuple[list[bytes], int, list[ChunkMeta]]] = []
        for name, tier in self._tiers():
            try:
                got = self._look(name, tier, todo, spec, fp)
                if put and tier.macs is not None:
                    got = self._verified(tier, got)
            except TierUnavailableError as exc:
                core.watch.failed(name, str(exc))     # logged once: the get is a miss
                continue
            except RkvError:
                continue
            core.watch.succeeded(name)
            found += got
            break
        core.count(remote_probes=1)
        if not any(metas for _, _, metas in found):
            return 0
        adopted = int(core.mutate(lambda txn, pending: self._adopt(txn, found, spec)))
        core.count(remote_adopted=adopted)
        return adopted

    def forget_lost(self, requests: Sequence[tuple[list[bytes], int]]) -> int:
        """Before a put: forget the chunks of ``requests`` that the local index has in a
        remote tier whose values the server no longer holds (absent, or a length no record
        of that size has), so the put stores them again; returns how many. Raises
        TierUnavailableError when a tier holding some cannot be asked: the put cannot tell
        whether they are stored."""
        core = self.core
        if not self.remote:
            return 0
        names = set(self.remote)
        asks: dict[str, list[tuple[bytes, int, int]]] = {}     # tier: (chunk, layer, size)
        seen: dict[bytes, ChunkMeta] = {}
        with core.index.env.read() as txn:
            for keys, _ in requests:
                for key in keys:
                    if key in seen:
                        continue
                    try:
                        meta = core.index.get_chunk(txn, key)
                    except CorruptStoreError:
                        continue             # the put heals a damaged entry
                    if meta is None or not meta.tiers() & names:
                        continue
                    seen[key] = meta
                    for layer, (name, size) in enumerate(meta.blocks):
                        if name in names:
                            asks.setdefault(name, []).append((key, layer, size))
        lost: list[bytes] = []
        for name, blocks in asks.items():
            tier = remote_of(core.tiers[name])
            if tier is None:
                continue
            lens = tier.lengths([block_key(k, layer) for k, layer, _ in blocks])
            lost += [k for (k, _, size), n in zip(blocks, lens, strict=True)
                     if not tier.holds(size, n)]
        if not lost:
            return 0

        # (a chunk stored again meanwhile has other blocks: kept)
        n = _forget(core, lost, lambda key, meta: meta.blocks == seen[key].blocks)
        core.count(remote_gone=n)
        return n

    def _verified(self, tier: RedisTier, found: list[tuple[list[bytes], int, list[ChunkMeta]]]
                  ) -> list[tuple[list[bytes], int, list[ChunkMeta]]]:
        """``found`` cut, per request, before the first chunk with a value that fails its
        MAC under this node's keys or is not the size its header says (values fetched in
        MGET windows, MACs checked on the codec pool)."""
        blocks = {block_key(keys[i], layer): size
                  for keys, start, metas in found for i, meta in enumerate(metas, start)
                  for layer, (_, size) in enumerate(meta.blocks)}
        bad: set[bytes] = set()
        with tier.reader() as r:
            r.want(blocks.items())
            for bk, size in blocks.items():
                chunk = bk[:KEY_BYTES]
                if chunk in bad:
                    continue
                try:
                    record = r.get(bk)
                except AuthenticationError:
                    record = None
                if record is None or record.nbytes != size:
                    bad.add(chunk)
        if not bad:
            return found
        self.core.count(remote_probe_rejected=len(bad))
        self.bad |= bad
        out = []
        for keys, start, metas in found:
            ok = next((j for j, _ in enumerate(metas) if keys[start + j] in bad), len(metas))
            out.append((keys, start, metas[:ok]))
        return out

    def raise_if_down(self, size: Callable[[str], int]) -> None:
        """Raise TierUnavailableError when a remote tier that could hold a chunk of
        ``size(tier)`` bytes is down now: placement skipped it, so the put that found no
        tier for the chunk fails because the server cannot be reached, not because tiers
        are full."""
        core = self.core
        for name in self.remote:
            tier = remote_of(core.tiers[name])
            if (tier is not None and tier.state == "damaged"
                    and size(name) <= core.config.tier(name).capacity_bytes):
                raise TierUnavailableError(f"{tier.where} is unavailable ({tier.damage}) and "
                                           "no other tier can take the chunk")

    def _look(self, name: str, tier: RedisTier, todo: list[tuple[list[bytes], int, int]],
              spec: ModelSpec, fp: bytes) -> list[tuple[list[bytes], int, list[ChunkMeta]]]:
        """Per request: the index entries of the chunks ``tier`` holds after its local
        prefix, each verified by its headers (see the module docstring)."""
        chunk_tokens = self.core.config.chunk_tokens
        wanted = list(dict.fromkeys(k for keys, i, _ in todo for k in keys[i:]))
        lens = tier.peek([("strlen", block_key(k, 0)) for k in wanted], PROBE_BYTES)
        down = [n for n in lens if isinstance(n, TierUnavailableError)]
        if down and len(down) == len(lens):
            raise down[0]           # no node answered: the tier is down for this probe
        # A down cluster node's chunks stay unknown (a miss); the other nodes' are adopted.
        present = {k for k, n in zip(wanted, lens, strict=True) if isinstance(n, int) and n}
        heads: dict[bytes, list[bytes]] = {}
        first = [k for k in wanted if k in present]
        if first:
            L = spec.n_layers
            got = tier.peek([("head", block_key(k, layer)) for k in first
                             for layer in range(L)], PROBE_BYTES)
            for j, k in enumerate(first):
                # (a layer on a node that went down in between: unusable, as if missing)
                heads[k] = [h if isinstance(h, bytes) else b"" for h in got[L * j:L * (j + 1)]]
        now = time.time_ns()
        out = []
        for keys, start, n_tokens in todo:
            bounds = chunk_bounds(n_tokens, chunk_tokens)
            metas: list[ChunkMeta] = []
            for i in range(start, len(keys)):
                meta = self._entry(tier, name, keys, i, bounds[i], heads.get(keys[i]), spec,
                                   fp, now)
                if meta is None:
                    break
                metas.append(meta)
            out.append((keys, start, metas))
        return out

    def _entry(self, tier: RedisTier, name: str, keys: list[bytes], i: int,
               bound: tuple[int, int], heads: list[bytes] | None,
               spec: ModelSpec, fp: bytes, now: int) -> ChunkMeta | None:
        """The index entry of chunk ``i`` from its layers' first bytes (None: not usable)."""
        if heads is None or keys[i] in self.bad:
            return None
        n = bound[1] - bound[0]
        blocks, written, pipes = [], [], []
        for layer, head in enumerate(heads):
            if not head:             # (GETRANGE of a missing key: empty)
                return None
            try:
                skip = (tier.macs.record_offset(block_key(keys[i], layer), head)
                        if tier.macs is not None else 0)
                header, size = peek_header(head[skip:])
                pipes.append(stages_label(*header_stages(header)))
            except RkvError:
                self.core.count(remote_probe_rejected=1)
                return None
            if (header.key != keys[i] or header.layer != layer or header.fingerprint != fp
                    or header.shape != spec.block_shape(n) or header.dtype != spec.dtype):
                return None
            blocks.append((name, size))
            written.append(header.written_ns or 0)
        return ChunkMeta(parent=keys[i - 1] if i else b"", pos=i, n_tokens=n,
                         fingerprint=fp, blocks=tuple(blocks), end=i == len(keys) - 1,
                         at=now, written=tuple(written), pipes=tuple(pipes))

    def _adopt(self, txn: Any, found: list[tuple[list[bytes], int, list[ChunkMeta]]],
               spec: ModelSpec) -> int:
        core = self.core
        ix, decide = core.index, core.decisions
        now = time.time()
        adopted = 0
        ix.put_model(txn, spec.fingerprint(), spec.stored_json())
        for keys, start, metas in found:
            for i, meta in enumerate(metas, start):
                key = keys[i]
                if ix.get_chunk(txn, key) is not None:
                    continue                # stored meanwhile (by a put, or another request)
                if i and not ix.has_chunk(txn, keys[i - 1]):
                    break                   # its parent went meanwhile
                ix.put_chunk(txn, key, meta, None)
                decide.inserted(key, meta, meta.blocks[0][0], now)
                adopted += 1
        return adopted

    # -- write-through ----------------------------------------------------------------------
    def write_through(self, pending: Pending, puts: Sequence[list[bytes]]) -> int:
        """Inside a put's mutation: copy the records of its new chunks that it places in a
        local tier to the first shared tier with ``write_through`` (the same records: they
        describe themselves). Best effort: a tier that fails is counted and logged, the put
        stands. Returns the records copied."""
        core = self.core
        self.bad.difference_update(k for keys in puts for k in keys)
        through = [n for n in self.names if core.config.tier(n).remote_settings().write_through]
        if not through:
            return 0
        name = through[0]
        chunks = {k for keys in puts for k in keys}
        already = pending.writes.get(name, {})
        items = [(bk, v) for tier, writes in pending.writes.items() if tier not in self.names
                 for bk, (v, _) in writes.items() if bk[:KEY_BYTES] in chunks
                 and bk not in already]
        if not items:
            return 0
        tier = core.tiers[name]
        try:
            for i in range(0, len(items), 64):
                tier.put_many(items[i:i + 64])
        except TierUnavailableError as exc:
            core.count(remote_write_errors=1)
            core.watch.failed(name, str(exc))      # the watch logs the outage, once
            return 0
        except RkvError as exc:
            core.count(remote_write_errors=1)
            if not self._warned:         # once per failure spell, not once per put
                self._warned = True
                log.warning("tier %s: write-through failed (%s); puts are kept locally "
                            "until it works again", name, exc)
            return 0
        self._warned = False
        core.watch.succeeded(name)
        core.count(remote_written_through=len(items))
        return len(items)

    # -- forget -----------------------------------------------------------------------------
    def forget_failed(self, reads: Sequence[tuple[list[bytes], Any, int, BlockLog]]) -> int:
        """After reads: forget the chunks whose block in a shared tier read as missing or
        failed verification (not those of a tier that was unreachable)."""
        core = self.core
        if not self.names or core.readonly:
            return 0
        names = set(self.names)
        gone: list[bytes] = []
        for keys, metas, _, log in reads:
            shared = [st for st in (*log.special.values(), *log.extra) if st.tier in names]
            failed = [st.chunk for st in shared if st.status in (MISSING, UNCORRECTABLE)
                      and not isinstance(st.error, TierUnavailableError)]
            if failed:     # that chunk, and those after it the read did not reach
                gone += keys[min(failed):max(len(metas), min(failed) + 1)]
            # A stale record on a shared tier is another node's write of the same block,
            # as valid as the one indexed here: forgotten, but adopted again by a probe.
            self.bad.update(keys[st.chunk] for st in shared
                            if st.status == UNCORRECTABLE and st.chunk < len(keys)
                            and not isinstance(st.error, StaleRecordError))
        if len(self.bad) > 65536:
            self.bad.clear()
        if not gone:
            return 0

        n = _forget(core, gone, lambda key, meta: bool(meta.tiers() & names))
        core.count(remote_forgotten=n)
        return n


def _forget(core: StoreCore, keys: Sequence[bytes],
            still: Callable[[bytes, ChunkMeta], bool]) -> int:
    """Drop the index entries of ``keys`` whose entry ``still`` holds what made them
    forgettable (read again under the writer lock); their local blocks go with them,
    nothing on the server. Returns how many were dropped."""

    def forget(txn: Any, pending: Any) -> int:
        n = 0
        for key in dict.fromkeys(keys):
            meta = core.index.read_chunk(txn, key)
            if meta is None or not still(key, meta):
                continue
            free_chunk(core.index, txn, key, meta, pending)
            core.decisions.removed(key, Reason.DELETED)
            n += 1
        return n

    return int(core.mutate(forget))


def announce(core: StoreCore, readers: Any, reads: Sequence[tuple[list[bytes], Sequence[ChunkMeta]]]
             ) -> None:
    """Tell the readers of remote tiers which blocks a get is about to read, in order, so
    they fetch them in batched MGETs instead of one round trip per block."""
    remote = {t.name for t in core.config.tiers if t.kind == "redis"}
    if not remote:
        return
    wants: dict[str, list[tuple[bytes, int]]] = {}
    for keys, metas in reads:
        for key, meta in zip(keys, metas, strict=False):
            for layer, (tier, size) in enumerate(meta.blocks):
                if tier in remote:
                    wants.setdefault(tier, []).append((block_key(key, layer), size))
    for tier, items in wants.items():
        if tier in core.tiers:
            want = getattr(readers(tier), "want", None)
            if want is not None:
                want(items)
