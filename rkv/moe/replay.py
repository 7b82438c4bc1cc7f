"""Replay of MoE routing traces through the shared ``policies``: expert caching and prefetch.

The access sequence is, for each token, for each layer in order, the experts the router chose
(key ``(layer, expert)``, ``Item.group`` and ``Item.depth`` = the layer). A fast device cache of
a byte budget holds experts; a miss loads the expert from a slower *source* tier (bandwidth and
per-load latency), a hit costs nothing. The cache is run by any registered eviction policy
(:func:`policies.make_policy`), either as one global cache or as one cache per layer (the
budget split evenly in whole experts, as Mixtral-offloading does); Belady's MIN
(:class:`policies.belady.Belady`) over the same sequence is the offline limit. The driver
follows :func:`rkv.eval.replay.simulate.simulate`: a hit is ``on_access(hit=True)``; a miss is
``on_access(hit=False, item)``, then ``victims(need, protected)`` (``protected``: the experts
of the current layer already touched), ``on_remove(EVICTED)`` for each and ``on_insert``; when
``victims`` answers ``None`` the expert streams through uncached.

**Prefetch** (one layer ahead). After layer ``l``'s experts are resolved, a
:class:`policies.PrefetchPolicy` picks experts of the next step (layer ``l + 1``, or layer 0 of
the next token) to load while layer ``l`` computes, at most ``width`` experts:

* ``cooccur`` (:class:`policies.prefetch.CoOccurrence`): learned online from the accesses
  (``now`` = the step index), ranks every expert of the next layer not cached;
* ``hints``: the trace's ``"hints"`` (the experts the model's speculative router predicted
  for that layer), in their order, through ``queue`` (:class:`policies.prefetch.QueueOrder`);
* ``oracle``: the next step's routed experts themselves (not cached, in router order), through
  ``queue``: a prefetcher that is never wrong, for the reference below.

A prefetched expert is inserted into the next layer's cache when issued (room made the same
way, protecting what this layer uses). **Timing** per step, from the start of layer ``l``'s
compute (``compute`` seconds): prefetches run back to back on the link (never two at once),
each taking ``latency + bytes / bandwidth``, and one is issued only while the link would start
it before ``compute`` ends. When the next router has run (at ``compute``), a prefetch still in
flight continues if its expert is needed and is dropped otherwise (it leaves the cache with
``on_remove(DELETED)``). **Link contention**: a copy is cancelled only between chunks of
``cancel_chunk`` bytes, so a dropped prefetch keeps the link busy to the end of the chunk in
progress (the first chunk once it was issued), and the bytes up to there count as moved. The
default is the whole expert (one DMA copy of an expert cannot be cancelled: a dropped prefetch
still moves all of it); ``0`` cancels at once (the model before link contention). The next
layer's demand misses then load back to back once the link is free; if no demand needs it,
the link stays busy into the next layer's compute, and that layer's prefetches queue behind
it. The stall is ``max(demand loads done, latest needed prefetch arrives, compute) -
compute``; with no prefetch, its miss bytes over the bandwidth plus a latency per miss. A
prefetch can thus save at most ``compute`` per step, and a wrong one costs a cached expert
(evicted for it) and link time. **Interference** (copies share the device's memory bandwidth
with compute): each second of prefetch copy (bytes over bandwidth, not the latency) that
overlaps a layer's compute adds ``interference`` seconds to that step's stall (default 0). The
slowdown is only added: the link does not use the longer compute to move more. Interference
changes no decision, so it only adds stall; a coarser ``cancel_chunk`` (a multiple of the
finer) only adds stall between runs that issue the same prefetches, but a link held longer
issues fewer of them, and where those were wrong the run can stall less (a test shows one).

Metrics per (policy, prefetch, budget, layout): expert hit ratio (an expert found in the cache
when its layer needs it, prefetched or not), bytes moved per token (demand loads and issued
prefetches, dropped ones' parts), prefetch precision (prefetched experts hit before leaving
the cache over prefetched), and (:func:`summarize`, :mod:`rkv.moe.replay_metrics`):

* **recall**, a fraction in [0, 1] by definition: the loads the run needed that a prefetch
  served, ``used / (used + misses)`` (``used``: prefetched experts hit; ``misses``: the run's
  demand misses);
* **extra misses**: the prefetch's pollution, ``(misses + used - base) / base`` with ``base``
  the misses of the same policy and layout without prefetch: what the run had to load, over
  what it would have had to load without prefetching (0 when prefetch only moved misses
  earlier; positive when its insertions evicted experts that were needed);
* **traffic**: the link bytes of the run (demand and prefetch) over the demand bytes of LRU
  without prefetch in the same layout and budget (1.0 for that LRU; 7.0: seven times its
  traffic);
* the modeled stall per token, and two gaps, both ``(S_lru - S) / (S_lru - S_ref)`` with the
  stall of LRU without prefetch *in the same layout and budget*: the **gap closed** against
  Belady without prefetch (the demand-only optimum; given for demand-only runs only, at most
  1, negative when worse than LRU), and **gap_prefetch** against the prefetch-aware
  reference, Belady's eviction with the oracle prefetch (every run). The oracle keeps the
  experts the next step hits from being evicted for its prefetches; with Belady in one global
  cache it also stops where making room would evict an expert used sooner than one of the
  running layer's (which cannot be evicted while it computes, but would be by Belady on
  demand a step later): without that rule, prefetching into a tight cache made Belady miss
  more than without prefetch. So the reference never stalls more than Belady without
  prefetch (a property test), but it is not a proven optimum of this timing model (an oracle
  of this width, in router order, one layer ahead): a run can stall less than it, and a gap
  above 1 means that.

"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable, Iterable, Sequence

from policies.base import (
    EvictionPolicy,
    Item,
    PolicyError,
    PrefetchPolicy,
    Reason,
    checked_victims,
)
from policies.belady import Belady, next_use_after, next_use_positions
from policies.prefetch import CoOccurrence, QueueOrder, ShallowFirst
from rkv.errors import ConfigError
from rkv.moe.replay_link import Source, cancel_bytes, cut, overlap, source_tier
from rkv.moe.replay_metrics import (
    BELADY,
    GLOBAL,
    HINTS,
    NONE,
    ORACLE,
    PER_LAYER,
    MoEResult,
    gap,
    summarize,
)
from rkv.moe.replay_trace import FORMAT, MoETrace, read_trace

DEFAULT_BUDGETS = ("10%", "25%", "50%")
DEFAULT_POLICIES = ("lru", "lfu", "activation")
DEFAULT_PREFETCH = (NONE, "cooccur", HINTS)
DEFAULT_COMPUTE = 1e-3          # seconds of compute per layer (a decode step on a GPU)
__all__ = ["BELADY", "FORMAT", "GLOBAL", "HINTS", "NONE", "ORACLE", "PER_LAYER", "MoEResult",
           "MoETrace", "Source", "cancel_bytes", "gap", "read_trace", "run_matrix", "simulate",
           "source_tier", "summarize"]


# -- budgets ------------------------------------------------------------------------
def budget_experts(text: str, trace: MoETrace) -> int:
    """A budget in whole experts: ``10%`` or ``0.1`` of all experts, or bytes (``4GiB``)."""
    from rkv.eval.replay.simulate import parse_capacity

    cap = parse_capacity(text)
    if cap.fraction is not None:
        return max(1, round(cap.fraction * trace.layers * trace.experts))
    assert cap.nbytes is not None
    n = cap.nbytes // trace.expert_bytes
    if n < 1:
        raise ConfigError(f"budget {text!r} holds no expert of {trace.expert_bytes} bytes")
    return int(n)


def split_budget(total: int, layers: int) -> list[int]:
    """``total`` experts over ``layers`` caches: equal shares, the remainder to the first."""
    base, extra = divmod(total, layers)
    return [base + (1 if j < extra else 0) for j in range(layers)]


# -- simulation ------------------------------------------------------------------------------------
def _policies(spec: str, caps: Sequence[int], size: int, refs: list[Hashable],
              ahead: bool = False) -> list[EvictionPolicy]:
    """The caches' policies; Belady reads next uses from an array, or with ``ahead`` (a run
    that inserts prefetched experts before their reference) from a lookup by key."""
    from policies import make_policy

    if spec == BELADY:
        nxt = next_use_after(refs) if ahead else next_use_positions(refs)
        return [Belady(c * size, nxt) for c in caps]
    return [make_policy(spec, c * size) for c in caps]


def _prefetcher(spec: str) -> PrefetchPolicy | None:
    from policies import make_prefetch

    if spec == NONE:
        return None
    return make_prefetch("queue" if spec in (HINTS, ORACLE) else spec)


def _uncached(ids: Iterable[int], layer: int, cached: set[Hashable], most: int | None
              ) -> list[int]:
    """The experts of ``ids`` not cached in ``layer``, in order (at most ``most``)."""
    out = []
    for e in ids:
        if (layer, e) not in cached:
            out.append(e)
            if most is not None and len(out) >= most:
                break
    return out


def _costlier(pol: EvictionPolicy, cap: int, size: int, protected: set[Hashable],
              pinned: set[Hashable]) -> bool:
    """Whether Belady, making room now for a prefetch, would evict an expert used sooner
    than one of ``pinned`` (the running layer's experts, which a demand load in the next
    step could evict instead): the reference then leaves the load to demand."""
    need = pol.used + size - cap
    if need <= 0 or not isinstance(pol, Belady):
        return False
    out = pol.victims(need, protected)
    if not out:
        return False
    far = max(pol.next_use(k) for k in pinned)
    return min(pol.next_use(k) for k in out) < far


def _check(trace: MoETrace, policy: str, prefetch: str, compute: float, width: int,
           interference: float) -> None:
    if prefetch not in (NONE, ORACLE) and policy == BELADY:
        raise ConfigError("Belady is replayed without prefetch (the demand-miss limit) or "
                          "with the oracle prefetch (the prefetch-aware reference)")
    if prefetch == HINTS and trace.hints is None:
        raise ConfigError(f"{trace.path or 'the trace'} carries no hints: prefetch 'hints' "
                          "needs a trace with per-token \"hints\"")
    if not (math.isfinite(compute) and compute >= 0):
        raise ConfigError(f"compute must be a finite number of seconds >= 0, got {compute!r}")
    if width < 1:
        raise ConfigError(f"prefetch width must be at least 1 expert, got {width}")
    if isinstance(interference, bool) or not isinstance(interference, int | float) or not (
            math.isfinite(interference) and interference >= 0):
        raise ConfigError(f"interference must be a finite number >= 0, got {interference!r}")


def simulate(trace: MoETrace, policy: str, experts: int, *, per_layer: bool = True,
             prefetch: str = NONE, width: int | None = None, source: Source | None = None,
             compute: float = DEFAULT_COMPUTE, cancel_chunk: str | int | None = None,
             interference: float = 0.0, budget_text: str = "") -> MoEResult:
    """Replay ``trace`` with ``experts`` cached experts in all (module docstring).
    ``cancel_chunk``: bytes, or None for the whole expert (:func:`cancel_bytes`)."""
    source = source or Source()
    nl, ne, size = trace.layers, trace.experts, trace.expert_bytes
    width = trace.top_k if width is None else width
    _check(trace, policy, prefetch, compute, width, interference)
    chunk = cancel_bytes(cancel_chunk, size)
    assert chunk is not None
    caps = split_budget(experts, nl) if per_layer else [experts]
    refs = trace.refs
    pols = _policies(policy, caps, size, refs, ahead=prefetch != NONE)
    cap_bytes = [c * size for c in caps]
    pf = _prefetcher(prefetch)
    miss = source.load(size)

    items: dict[Hashable, Item] = {}

    def item_of(layer: int, e: int) -> Item:
        """Expert ``e`` of ``layer``'s Item, made on first use: never one per declared
        expert up front (a header may declare far more experts than any token uses)."""
        key = (layer, e)
        it = items.get(key)
        if it is None:
            it = items[key] = Item(key, size=size, group=layer, depth=layer, miss_cost=miss)
        return it

    # A co-occurrence prefetcher ranks only experts it has seen accessed (the others have
    # probability 0): its candidates are the layer's routed experts, in expert order, the
    # same ranking as over all experts at a fraction of the cost. Queue order (and shallow
    # first, every candidate of a layer being equally deep) takes the first ``width``
    # uncached experts: the walk over the layer's experts stops there. Others see them all.
    in_order = isinstance(pf, QueueOrder | ShallowFirst)
    cands_of: list[list[int]] | None = None
    if isinstance(pf, CoOccurrence):
        seen: list[set[int]] = [set() for _ in range(nl)]
        for route in trace.routes:
            for layer, chosen in enumerate(route):
                seen[layer].update(chosen)
        cands_of = [sorted(ids) for ids in seen]
    cached: set[Hashable] = set()
    unused: set[Hashable] = set()        # prefetched, not yet hit
    counts = {"hits": 0, "demand": 0, "prefetched": 0, "used": 0, "evictions": 0}
    evicted, aborted = Reason.EVICTED, Reason.DELETED

    def make_room(pol: EvictionPolicy, cap: int, protected: set[Hashable]) -> bool:
        need = pol.used + size - cap
        if need <= 0:
            return True
        out = checked_victims(pol, need, protected, "the expert cache")
        if out is None:
            return False
        for v in out:
            pol.on_remove(v, evicted)
            cached.remove(v)
            unused.discard(v)
        counts["evictions"] += len(out)
        return True

    pos = 0
    stall = no_hide = slowed = 0.0
    pbytes = 0
    load, lat = source.load(size), source.latency
    inflight: list[tuple[Hashable, float, float]] = []   # last step's prefetches: start, end
    # A dropped copy still on the link when its frame's layer began computing: when its
    # bytes began moving and when the link is free, in the current frame (0: none).
    carry = (0.0, 0.0)
    t0 = time.perf_counter()
    for t, route in enumerate(trace.routes):
        for layer, chosen in enumerate(route):
            c = layer if per_layer else 0
            pol, cap = pols[c], cap_bytes[c]
            step = t * nl + layer
            protected: set[Hashable] = {(layer, e) for e in chosen}   # all needed at once
            # Prefetches still in flight when the router runs: kept if needed, else dropped
            # (the link busy to the end of the chunk in progress).
            late, link_free, busy = compute, max(compute, carry[1]), carry
            for key, start, end in inflight:
                if key in protected:
                    late = max(late, end)
                    link_free = max(link_free, end)
                elif end > compute:
                    pol.on_remove(key, aborted)
                    cached.remove(key)
                    unused.discard(key)
                    free, moved = cut(start, compute, size, chunk, source)
                    pbytes -= size - moved
                    link_free = max(link_free, free)
                    busy = (start + lat, free)
            nmiss = 0
            for e in chosen:
                key = (layer, e)
                if key in cached:
                    pol.on_access(key, True, pos)
                    counts["hits"] += 1
                    hit = True
                    if key in unused:
                        unused.remove(key)
                        counts["used"] += 1
                else:
                    hit = False
                    nmiss += 1
                    item = item_of(layer, e)
                    pol.on_access(key, False, pos, item)
                    if make_room(pol, cap, protected):
                        pol.on_insert(item, pos)
                        cached.add(key)
                if pf is not None:
                    pf.on_access(key, hit, step)
                pos += 1
            counts["demand"] += nmiss
            done = compute
            if nmiss:
                done = link_free + source.load(nmiss * size, nmiss)
                no_hide += source.load(nmiss * size, nmiss)
            stall += max(done, late) - compute
            # This layer computes from ``origin``: the frame of its prefetches starts there,
            # behind what still holds the link (only a dropped copy can, without demand).
            origin = max(done, late)
            carry = ((busy[0] - origin, link_free - origin)
                     if not nmiss and link_free > origin else (0.0, 0.0))
            copying = overlap(*carry, compute)
            # Prefetch for the next step while this layer computes.
            inflight = []
            if pf is not None and not (layer + 1 == nl and t + 1 == trace.tokens):
                nxt, nt = (layer + 1, t) if layer + 1 < nl else (0, t + 1)
                if prefetch in (HINTS, ORACLE):
                    src = trace.hints if prefetch == HINTS else trace.routes
                    assert src is not None
                    cands = [item_of(nxt, e) for e in src[nt][nxt]]
                else:
                    ids = range(ne) if cands_of is None else cands_of[nxt]
                    cands = [item_of(nxt, e) for e in _uncached(ids, nxt, cached,
                                                                width if in_order else None)]
                cands = [it for it in cands if it.key not in cached]
                c = nxt if per_layer else 0
                tpol, tcap = pols[c], cap_bytes[c]
                pprot: set[Hashable] = set() if per_layer else set(protected)
                pinned: set[Hashable] = set()
                if prefetch == ORACLE:      # it knows what the next step will hit
                    needs = {(nxt, e) for e in trace.routes[nt][nxt]}
                    pprot |= needs & cached
                    pinned = (pprot - needs) & cached if policy == BELADY else pinned
                # Belady's next use of a prefetched key: its first reference after the last
                # one replayed (policies.belady); the other policies keep their clock.
                pnow = pos - 1 if policy == BELADY else pos
                clock = max(0.0, carry[1])
                for key in pf.hints(cands, width * size):
                    if clock >= compute or (pinned and _costlier(tpol, tcap, size, pprot,
                                                                 pinned)):
                        break
                    if not make_room(tpol, tcap, pprot):
                        break
                    tpol.on_insert(items[key], pnow)
                    cached.add(key)
                    unused.add(key)
                    pprot.add(key)
                    inflight.append((key, clock, clock + load))
                    copying += overlap(clock + lat, clock + load, compute)
                    clock += load
                    counts["prefetched"] += 1
                    pbytes += size
            if interference and copying:
                slowed += interference * copying
    seconds = time.perf_counter() - t0
    total = sum(caps)
    return MoEResult(
        policy=policy, prefetch=prefetch, layout=PER_LAYER if per_layer else GLOBAL,
        budget=budget_text or str(total), budget_experts=total,
        budget_fraction=total / (nl * ne), tokens=trace.tokens, accesses=len(refs),
        hits=counts["hits"], demand_bytes=counts["demand"] * size,
        prefetched=counts["prefetched"], prefetch_bytes=pbytes,
        prefetch_used=counts["used"], evictions=counts["evictions"], stall=stall + slowed,
        stall_no_hide=no_hide, seconds=seconds, cancel_chunk=chunk,
        interference=float(interference), interference_stall=slowed)


# -- the matrix ------------------------------------------------------------------------------------
def run_matrix(trace: MoETrace, policies: Sequence[str] = DEFAULT_POLICIES,
               budgets: Sequence[str] = DEFAULT_BUDGETS,
               prefetches: Sequence[str] = DEFAULT_PREFETCH,
               layouts: Sequence[str] = (PER_LAYER,), *, width: int | None = None,
               source: Source | None = None, compute: float = DEFAULT_COMPUTE,
               cancel_chunk: str | int | None = None, interference: float = 0.0,
               progress: Callable[[str], None] | None = None) -> list[MoEResult]:
    """Every policy x prefetch x budget x layout, then the references in every layout
    replayed and per layer: LRU without prefetch, Belady without prefetch (the demand-only
    gap's ends) and Belady + oracle (the prefetch-aware reference). Prefetch ``hints`` is
    skipped on a trace without hints. The metrics of :func:`summarize` are filled in."""
    from policies import make_policy, make_prefetch

    for lay in layouts:
        if lay not in (PER_LAYER, GLOBAL):
            raise ConfigError(f"layout must be {PER_LAYER} or {GLOBAL}, got {lay!r}")
    for spec in policies:
        try:
            make_policy(spec, 1)
        except PolicyError as exc:
            raise ConfigError(str(exc)) from exc
    for spec in prefetches:
        if spec not in (NONE, HINTS, ORACLE):
            try:
                make_prefetch(spec)
            except PolicyError as exc:
                raise ConfigError(str(exc)) from exc
    _check(trace, "lru", NONE, compute, 1 if width is None else width, interference)
    cancel_bytes(cancel_chunk)
    sizes = [(b, budget_experts(b, trace)) for b in budgets]
    pfs = [p for p in prefetches if p != HINTS or trace.hints is not None]
    runs = [(p, f, lay) for lay in layouts for p in policies for f in pfs]
    every = list(dict.fromkeys((*layouts, PER_LAYER)))
    for ref in [*(("lru", NONE, lay) for lay in (PER_LAYER, *layouts)),
                *((BELADY, NONE, lay) for lay in every),
                *((BELADY, ORACLE, lay) for lay in every)]:
        if ref not in runs:
            runs.append(ref)
    out: list[MoEResult] = []
    for pol, pf, lay in runs:
        for text, n in sizes:
            if progress:
                progress(f"{pol} +{pf} {lay} at {text}")
            out.append(simulate(trace, pol, n, per_layer=lay == PER_LAYER, prefetch=pf,
                                width=width, source=source, compute=compute,
                                cancel_chunk=cancel_chunk, interference=interference,
                                budget_text=text))
    return summarize(out)
