"""The engine's one decision site: admit, place, evict, demote and promote, through policies.

Each tier has an eviction policy and an admission policy from ``policies/`` (``[[tiers]]
policy = "prefix+after(n=2)"``). Everything the engine decides about where a chunk lives
happens here, inside one index write transaction under the store's writer lock
(:mod:`rkv.store.txn`):

* **place**: a new chunk enters the first usable tier with room; a tier that is full takes it
  only if its admission policy agrees and room can be made, else the next tier is tried. A
  chunk no tier takes is not stored (``PutResult.chunks_refused``): a cache put is best
  effort, and the result says what was left out.
* **make room**: the tier's policy names victims (a side-effect-free query); in an upper tier
  they are *demoted* (removed from its policy, inserted into the next tier's, records moved
  and re-encoded with the destination's ECC), in the last tier *evicted*.
* **promote**: a chunk moves up (a read's promotion policy or :meth:`Engine.prefetch`).

What the policies must never touch is the *protected* set: the chunks of the put in progress,
chunks being read by this process, and pinned chunks (looked up lazily, only for candidates).
A policy's victims are held to its contract (:func:`policies.base.checked_victims`) before any
is acted on; a policy that fails makes the whole mutation fail with ``PolicyContractError``
(:meth:`Decisions.run`), rolled back like any failed mutation.

**Policy state is rebuilt, not persisted.** Policies live in memory. They are built from the
index (every chunk inserted in the order of its last access, ``ChunkMeta.at``) when a
mutation first needs them, and rebuilt whenever the index's generation counter shows that
another process (or a failed transaction) changed the index since. An LRU policy comes back
exactly; frequency-based policies restart from recency order. Hits are reported by reads
as events and applied at the start of the next mutation, so a read never waits for a writer.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from typing import Any, TypeVar

from policies import make_admission, make_policy, make_prefetch, split_spec
from policies.base import (
    AdmissionPolicy,
    EvictionPolicy,
    Item,
    PolicyError,
    Reason,
    checked_victims,
)
from rkv.errors import IntegrityError, PolicyContractError, TierFullError
from rkv.format.keys import block_key
from rkv.store.config import EngineConfig
from rkv.store.demotion import Transcode
from rkv.store.index import ChunkMeta, Index
from rkv.store.txn import Pending
from rkv.tiers import Tier

log = logging.getLogger("rkv")
T = TypeVar("T")
#: Victim rounds per call before giving up (each round must free bytes).
MAX_ROUNDS = 256
#: Prefill tokens per second used as a chunk's miss cost (SmolLM2-135M on 2 CPU threads).
RECOMPUTE_TPS = 530.0
#: Chunks a read reported that the next put will not report again (bounded memory).
_REPORTED = 1 << 16
#: Access times kept in memory before a mutation writes them to the index.
TOUCH_FLUSH = 4096


def item_for(key: bytes, meta: ChunkMeta, tier: str) -> Item:
    """What a policy knows about a chunk's part in ``tier``."""
    return Item(key, size=meta.bytes_in(tier), tier=tier, group=meta.fingerprint,
                depth=meta.pos, parent=meta.parent or None,
                miss_cost=meta.n_tokens / RECOMPUTE_TPS)


def free_chunk(ix: Index, txn: Any, key: bytes, meta: ChunkMeta | None, pending: Pending) -> None:
    """Remove one chunk from the index; its records are deleted after the commit. A damaged
    entry (``meta`` None) leaves its records as unreferenced ones for verify to reclaim."""
    ix.del_chunk(txn, key, meta)
    if meta is None:
        return
    for layer, (tier, _) in enumerate(meta.blocks):
        pending.drop(tier, block_key(key, layer))


class Protected:
    """``key in protected``: keys given, chunks being read or held for a queued request by
    this process, or pinned chunks (looked up in the transaction only when a policy asks
    about a candidate, once per chunk)."""

    __slots__ = ("decide", "keys", "pinned", "txn")

    def __init__(self, keys: set[bytes], decide: Decisions, txn: Any,
                 pinned: dict[bytes, bool] | None = None) -> None:
        self.keys, self.decide, self.txn = keys, decide, txn
        #: Pin lookups made in this transaction. Pins change only in a mutation of their own
        #: (pin/unpin), never in one that asks for victims, so an answer holds to its end;
        #: it spares the index read when the contract check asks about a victim again.
        self.pinned: dict[bytes, bool] = {} if pinned is None else pinned

    def __contains__(self, key: object) -> bool:
        d = self.decide
        if key in self.keys or key in d.inflight or key in d.queued:
            return True
        if not isinstance(key, bytes):
            return False
        pinned = self.pinned.get(key)
        if pinned is None:
            meta = d.ix.read_chunk(self.txn, key)
            pinned = self.pinned[key] = meta is not None and meta.pins > 0
        return pinned

    def plus(self, key: bytes) -> Protected:
        return Protected(self.keys | {key}, self.decide, self.txn, self.pinned)


class Decisions:
    """Policies per tier and every decision that uses them (see the module docstring)."""

    def __init__(self, ix: Index, tiers: dict[str, Tier], config: EngineConfig,
                 codecs: dict[str, Any], placement: Any = None,
                 clock: Callable[[], int] = time.time_ns) -> None:
        self.ix, self.tiers, self.config, self.codecs = ix, tiers, config, codecs
        #: Write times of moved records (ns since the epoch; the engine's clock).
        self.clock = clock
        #: Plans a moving block's code for its new tier (None: the tier's codec).
        self.placement = placement
        #: Learns expected reuse and residency for placement (policies.estimate), or None.
        self.estimator = getattr(placement, "estimator", None)
        self.fallbacks = 0
        self.lossy = 0                 # blocks re-quantized to fewer bits by a demotion
        self.lossy_plans: Any = None   # rkv.store.demotion.LossyPlans, when needed
        self.order = [t.name for t in config.tiers]
        self.caps = {t.name: t.capacity_bytes for t in config.tiers}
        self.policies: dict[str, EvictionPolicy] = {}
        self.admission: dict[str, AdmissionPolicy] = {}
        self.promoter: AdmissionPolicy | None = None
        #: Orders what a prefetch moves when its budget does not cover everything.
        self.prefetcher = make_prefetch(config.prefetch)
        self._built = False
        self._gen = -1            # the index generation the policies reflect
        self._next = 0
        self._events: deque[tuple[bytes, float]] = deque()   # hits reported by reads
        self._reported: OrderedDict[bytes, None] = OrderedDict()
        self._lock = threading.Lock()
        #: Chunks being read by this process (protected from eviction and demotion).
        self.inflight: Counter[bytes] = Counter()
        #: Chunks of requests a scheduler has queued (:meth:`Engine.prefetch`): key ->
        #: [requests holding it, time the hold expires]. Protected until read or expired.
        self.queued: dict[bytes, list[float]] = {}
        self.rebuilds = 0
        #: Access times (ns) not yet written to the index, and the last one handed out.
        self.touched: dict[bytes, int] = {}
        self._last_at = 0

    # -- staying in step with the index -------------------------------------------------------
    def begin(self, txn: Any) -> None:
        """Start of a mutation: rebuild if the index changed behind the policies' back, then
        apply the hits reads reported since the last mutation."""
        gen = self.ix.meta_or_none(txn, "gen")
        gen = gen if isinstance(gen, int) else 0
        if not self._built or gen != self._gen:
            self._rebuild(txn)
        self._next = gen + 1
        self._expire(time.time())
        while self._events:
            key, now = self._events.popleft()
            self._hit(key, now)

    def end(self, txn: Any) -> None:
        self.ix.set_meta(txn, "gen", self._next)

    def run(self, txn: Any, fn: Callable[[], T]) -> T:
        """One mutation's decisions: :meth:`begin`, ``fn()`` (which decides through this
        object), :meth:`end`. A policy's ``PolicyError`` (a broken contract, caught by
        :func:`policies.base.checked_victims`, or one the policy raised) leaves as
        :class:`~rkv.errors.PolicyContractError`, a typed rkv error; the caller's
        transaction then rolls back (:meth:`invalidate`)."""
        try:
            self.begin(txn)
            out = fn()
        except PolicyError as exc:
            raise PolicyContractError(f"a policy failed: {exc}") from exc
        self.end(txn)
        return out

    def committed(self) -> None:
        self._gen = self._next

    def invalidate(self) -> None:
        """The transaction failed: the policies may hold changes the index does not."""
        self._built = False

    def _rebuild(self, txn: Any) -> None:
        self.policies, self.admission = {}, {}
        for t in self.config.tiers:
            evict, admit = split_spec(t.policy)
            self.policies[t.name] = make_policy(evict, t.capacity_bytes)
            self.admission[t.name] = make_admission(admit)
        self.promoter = (None if self.config.promote == "never"
                         else make_admission(self.config.promote))
        entries = [(m.at, k, m) for k, m in self.ix.chunks(txn) if m is not None]
        entries.sort(key=lambda e: (e[0], e[2].pos))
        for at, key, meta in entries:
            for tier in meta.tiers():
                if tier in self.policies:
                    self.policies[tier].on_insert(item_for(key, meta, tier), at / 1e9)
        self._events.clear()      # their access times are in the index already
        if self.estimator is not None:   # forget what another process (or a rollback) removed
            self.estimator.retain(lambda key, tier: key in self.policies.get(tier, ()))
        self._built = True
        self.rebuilds += 1

    # -- what reads and writes tell the policies ----------------------------------------------
    def served(self, keys: list[bytes], now: float) -> bool:
        """A read served these chunks (applied at the next mutation). True when so many hits
        wait that a mutation should apply them now (reads of a few hot chunks would otherwise
        queue events without bound)."""
        with self._lock:
            for k in keys:
                self._events.append((k, now))
                self._reported[k] = None
                self._reported.move_to_end(k)
            while len(self._reported) > _REPORTED:
                self._reported.popitem(last=False)
            return len(self._events) >= _REPORTED

    def used(self, keys: list[bytes], now: float) -> list[bytes]:
        """A put met these stored chunks without a mutation: hits, except those a read
        already reported (the same access). Returns the hits: the chunks whose access time
        the put moves (a policy rebuilt from access times then sees what this one saw)."""
        hits = []
        with self._lock:
            for k in keys:
                if self._reported.pop(k, 0) is not None:
                    self._events.append((k, now))
                    hits.append(k)
        return hits

    def reading(self, keys: list[bytes], delta: int) -> None:
        """Mark chunks as being read by this process (+1) or done (-1)."""
        with self._lock:
            for k in keys:
                n = self.inflight[k] + delta
                if n > 0:
                    self.inflight[k] = n
                else:
                    del self.inflight[k]

    # -- access times: what a rebuild orders the policies by ---------------------------------
    def touch(self, keys: list[bytes]) -> bool:
        """Record access times, strictly increasing in call and key order (so policies
        rebuilt from them see the accesses in the order they happened). True when enough
        are pending that a mutation should write them."""
        now = self.stamps(len(keys))
        with self._lock:
            for i, k in enumerate(keys):
                self.touched[k] = now + i
            return len(self.touched) >= TOUCH_FLUSH

    def stamps(self, n: int) -> int:
        """The first of ``n`` access times after every one handed out so far (a put stamps
        the entries it writes with them, in key order, instead of touching them after)."""
        with self._lock:
            now = max(time.time_ns(), self._last_at + 1)
            self._last_at = now + n
            return now

    def touch_at(self, key: bytes, at: int) -> None:
        """Record access time ``at`` (from :meth:`stamps`) for a stored chunk."""
        with self._lock:
            self.touched[key] = max(at, self.touched.get(key, 0))

    def take_touches(self) -> dict[bytes, int]:
        with self._lock:
            touched, self.touched = self.touched, {}
        return touched

    def write_touches(self, txn: Any, touched: dict[bytes, int]) -> None:
        """Write access times into the chunks' index entries (first thing in a mutation)."""
        for key, at in touched.items():
            meta = self.ix.read_chunk(txn, key)
            if meta is not None and at > meta.at:
                self.ix.put_chunk(txn, key, meta.with_(at=at), meta)

    def hold(self, keys: list[bytes], until: float) -> None:
        """A queued request will read these chunks: protect them until it does (one
        :meth:`release` per hold) or until ``until`` (seconds since the epoch)."""
        with self._lock:
            for k in keys:
                entry = self.queued.get(k)
                if entry is None:
                    self.queued[k] = [1.0, until]
                else:
                    entry[0] += 1
                    entry[1] = max(entry[1], until)

    def release(self, keys: list[bytes]) -> None:
        """A request ran: drop one hold on each of its chunks."""
        if not self.queued:
            return
        with self._lock:
            for k in keys:
                entry = self.queued.get(k)
                if entry is not None:
                    entry[0] -= 1
                    if entry[0] <= 0:
                        del self.queued[k]

    def _expire(self, now: float) -> None:
        if self.queued:
            with self._lock:
                for k in [k for k, (_, until) in self.queued.items() if until < now]:
                    del self.queued[k]

    def _hit(self, key: bytes, now: float) -> None:
        if self.estimator is not None:
            self.estimator.on_access(key, True, now)
        for name, pol in self.policies.items():
            if key in pol:
                pol.on_access(key, True, now)
            self.admission[name].on_access(key, True, now)
        if self.promoter is not None:
            self.promoter.on_access(key, True, now)

    def seen_stored(self, key: bytes, now: float) -> bool:
        """A put met a stored chunk: a hit (True), unless a read already reported it."""
        with self._lock:
            if self._reported.pop(key, 0) is None:
                return False
        self._hit(key, now)
        return True

    def missed(self, key: bytes, item: Item, now: float) -> None:
        """A put is about to store a chunk the store did not have: a miss in every tier."""
        for name, pol in self.policies.items():
            pol.on_access(key, False, now, item)
            self.admission[name].on_access(key, False, now)

    def want_promotion(self, key: bytes, item: Item, now: float) -> bool:
        """The read promotion policy: should a chunk hit below the top tier move up?"""
        return self.promoter is not None and self.promoter.admit(item, now)

    # -- placing, making room, moving ----------------------------------------------------------
    def usable(self, name: str) -> bool:
        tier = self.tiers[name]
        if tier.state != "damaged":
            tier.ensure_checked()      # once per process, under the writer lock
        return tier.state != "damaged"

    def place(self, txn: Any, item: Item, size: Callable[[str], int],
              protect: Protected, pending: Pending, stats: Counter[str], now: float
              ) -> str | None:
        """The tier a new chunk enters (``size(tier)`` bytes there), room made. None when
        no tier took it: every full tier's admission refused it, or room could only be
        made by evicting protected chunks (pinned, being read, or earlier in this put).
        Raises TierFullError when no usable tier could hold it even empty."""
        fits = False
        for name in self.order:
            if not self.usable(name) or (need := size(name)) > self.caps[name]:
                continue
            fits = True
            if self._room(txn, item, name, need, protect, pending, stats, now):
                return name
        if fits:
            return None
        usable = [n for n in self.order if self.usable(n)]
        raise TierFullError(
            f"no tier can take a chunk of {size(usable[-1] if usable else self.order[-1])} "
            f"bytes: it is larger than every usable tier's capacity"
            + ("" if len(usable) == len(self.order) else " (some tiers are damaged)")
        )

    def place_parts(self, txn: Any, item: Item, needs: dict[str, int], protect: Protected,
                    pending: Pending, stats: Counter[str], now: float) -> bool:
        """Room for a chunk planned into several tiers (``needs``: bytes per tier, with
        ``place_tiers``), each part as a chunk of its size there. False when some part
        cannot be (the caller places the chunk whole); room made for others stays made."""
        return all(self.usable(n) and needs[n] <= self.caps[n] and self._room(
            txn, item, n, needs[n], protect, pending, stats, now)
            for n in sorted(needs, key=self.order.index))

    def _room(self, txn: Any, item: Item, name: str, need: int, protect: Protected,
              pending: Pending, stats: Counter[str], now: float) -> bool:
        """Whether ``need`` bytes of ``item`` enter tier ``name``: admitted when the tier is
        full (a chunk held for a queued request always is: it is wanted), and room made."""
        full = self.ix.live_usage(txn).bytes(name) + need > self.caps[name]
        if full and item.key not in self.queued:
            here = Item(item.key, need, name, item.group, item.depth, item.parent, item.miss_cost)
            pol = self.policies[name]
            if not (self.admission[name].admit(here, now) and pol.admits(here, now)):
                return False
        return self.make_room(txn, self.order.index(name), need, protect, pending, stats)

    def inserted(self, key: bytes, meta: ChunkMeta, tier: str, now: float) -> None:
        item = item_for(key, meta, tier)
        self.policies[tier].on_insert(item, now)
        if self.estimator is not None:
            self.estimator.on_insert(item, now)

    def removed(self, key: bytes, reason: Reason) -> None:
        """A chunk left the store (deleted, evicted, dropped): every tier's policy forgets it."""
        if self.estimator is not None:
            self.estimator.on_remove(key, reason, time.time())
        for pol in self.policies.values():
            if key in pol:
                pol.on_remove(key, reason)

    def _below(self, level: int) -> int | None:
        for lower in range(level + 1, len(self.order)):
            if self.usable(self.order[lower]):
                return lower
        return None

    def make_room(self, txn: Any, level: int, need: int, protect: Protected,
                  pending: Pending, stats: Counter[str]) -> bool:
        """Demote (upper tiers) or evict (the last usable tier) the policy's victims until
        ``need`` more bytes fit in tier ``level``; False when that is impossible."""
        name = self.order[level]
        cap = self.caps[name]
        if need > cap or not self.usable(name):
            return False
        below = self._below(level)
        policy = self.policies[name]
        usage = self.ix.live_usage(txn)    # kept current by the index as chunks come and go
        for _ in range(MAX_ROUNDS):
            if usage.bytes(name) + need <= cap:
                return True
            if below is None and self.config.on_full == "error":
                raise TierFullError(f"tier {name} is full ({usage.bytes(name)} of {cap} "
                                    "bytes) and on_full='error'")
            victims = checked_victims(policy, usage.bytes(name) + need - cap, protect,
                                      f"tier {name}")
            if victims is None:
                return False
            before = usage.bytes(name)
            for key in victims:
                assert isinstance(key, bytes)   # the policy holds it: this module put it there
                meta = self.ix.read_chunk(txn, key)
                if meta is None or meta.bytes_in(name) == 0:
                    policy.on_remove(key, Reason.DELETED)   # out of step: forget it
                    self._built = False                    # and rebuild at the next begin
                    continue
                if below is None:
                    free_chunk(self.ix, txn, key, meta, pending)
                    self.removed(key, Reason.EVICTED)
                    stats["evicted"] += 1
                elif not self.move(txn, key, meta, name, self.order[below], protect,
                                   pending, stats, Reason.DEMOTED):
                    return False
            if usage.bytes(name) >= before:
                return False  # no progress: never loop on the same victims
        return usage.bytes(name) + need <= cap

    def move(self, txn: Any, key: bytes, meta: ChunkMeta, src: str, dst: str,
             protect: Protected, pending: Pending, stats: Counter[str], reason: Reason
             ) -> bool:
        """Move a chunk's blocks from ``src`` to ``dst`` (demotion or promotion), making room
        in ``dst`` first. A block that cannot be read drops the whole chunk."""
        level = self.order.index(dst)
        if not self.make_room(txn, level, meta.bytes_in(src), protect.plus(key), pending, stats):
            return False
        meta = self.ix.read_chunk(txn, key) or meta   # making room may not touch it, but be sure
        blocks, moved = [], []
        pipes = [meta.pipe(layer) for layer in range(len(meta.blocks))]
        written = [meta.written_at(layer) for layer in range(len(meta.blocks))]
        xform = Transcode(self, dst, stats, txn, key, meta, reason is Reason.DEMOTED)
        try:
            for layer, (tier, size) in enumerate(meta.blocks):
                if tier == src:
                    bkey = block_key(key, layer)
                    new_size = pending.move(bkey, src, dst, xform)
                    moved.append(bkey)
                    tier, size, pipes[layer] = dst, new_size, xform.label
                    written[layer] = xform.written or written[layer]
                blocks.append((tier, size))
        except IntegrityError as exc:
            # A record that cannot be read (missing, damaged page) makes the chunk useless:
            # drop it rather than wedge every later put behind it.
            for bkey in moved:
                pending.drop(dst, bkey)
            log.warning("dropping chunk %s: a block cannot be moved (%s)", key.hex()[:16], exc)
            free_chunk(self.ix, txn, key, meta, pending)
            self.removed(key, Reason.UNCORRECTABLE)
            stats["dropped_damaged"] += 1
            return True
        new = meta.with_(blocks=tuple(blocks), pipes=tuple(pipes), written=tuple(written))
        self.ix.put_chunk(txn, key, new, meta)
        self.policies[src].on_remove(key, reason)
        if key in self.policies[dst]:
            self.policies[dst].on_remove(key, reason)
        item, now = item_for(key, new, dst), time.time()
        self.policies[dst].on_insert(item, now)
        if self.estimator is not None:
            self.estimator.on_remove(key, reason, now, src)
            self.estimator.on_insert(item, now)
        stats["demoted" if reason is Reason.DEMOTED else "promoted"] += 1
        return True
