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
  for that layer), in their order, through ``queue`` (:class:`policies.prefetch.QueueOrder`).

A prefetched expert is inserted into the next layer's cache when issued (room made the same
way, protecting what this layer uses). **Timing** per step, from the start of layer ``l``'s
compute (``compute`` seconds): prefetches run back to back on the link, each taking ``bytes /
bandwidth + latency``, and one is issued only while the link would start it before
``compute`` ends. When the next router has run (at ``compute``), a prefetch still in flight
continues if its expert is needed and is dropped otherwise (its transferred bytes count as
moved, it leaves the cache with ``on_remove(DELETED)``): copies are assumed cancellable between
chunks. The next layer's demand misses then load back to back once the link is free. Its
stall is ``max(demand loads done, latest needed prefetch arrives, compute) - compute``; with
no prefetch, its miss bytes over the bandwidth plus a latency per miss. A prefetch can thus
save at most ``compute`` per step, and a wrong one costs a cached expert (evicted for it) and
link time only until the router runs.

Metrics per (policy, prefetch, budget, layout): expert hit ratio (an expert found in the cache
when its layer needs it, prefetched or not), bytes moved per token (demand loads and issued
prefetches), prefetch precision (prefetched experts hit before leaving the cache over
prefetched), and (:func:`summarize`):

* **recall**, a fraction in [0, 1] by definition: the loads the run needed that a prefetch
  served, ``used / (used + misses)`` (``used``: prefetched experts hit; ``misses``: the run's
  demand misses);
* **extra misses**: the prefetch's pollution, ``(misses + used - base) / base`` with ``base``
  the misses of the same policy and layout without prefetch: what the run had to load, over
  what it would have had to load without prefetching (0 when prefetch only moved misses
  earlier; positive when its insertions evicted experts that were needed);
* the modeled stall per token, and the **gap closed**, ``(S_lru - S) / (S_lru - S_belady)``
  with the stalls of LRU and Belady without prefetch *in the same layout*. Belady is the
  demand-only optimum, so the gap is only given for demand-only runs (at most 1; negative
  when worse than LRU); a prefetching run is not bounded by it (``None``, "—" in the table).

"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from policies.base import (
    EvictionPolicy,
    Item,
    PolicyError,
    PrefetchPolicy,
    Reason,
    checked_victims,
)
from policies.belady import Belady, next_use_positions
from policies.prefetch import CoOccurrence, QueueOrder, ShallowFirst
from rkv.errors import ConfigError
from rkv.moe.replay_trace import FORMAT, MoETrace, read_trace

BELADY = "belady"
NONE = "none"
HINTS = "hints"
PER_LAYER, GLOBAL = "per-layer", "global"
DEFAULT_BUDGETS = ("10%", "25%", "50%")
DEFAULT_POLICIES = ("lru", "lfu", "activation")
DEFAULT_PREFETCH = (NONE, "cooccur", HINTS)
DEFAULT_COMPUTE = 1e-3          # seconds of compute per layer (a decode step on a GPU)
__all__ = ["FORMAT", "MoEResult", "MoETrace", "Source", "read_trace", "run_matrix",
           "simulate", "source_tier", "summarize"]


# -- cost model and budgets ------------------------------------------------------------------------
@dataclass(frozen=True)
class Source:
    """The tier a missed expert loads from."""

    name: str = "dram"
    bandwidth: float = 20e9      # bytes per second
    latency: float = 1e-7        # seconds per expert load

    def __post_init__(self) -> None:
        if not (math.isfinite(self.bandwidth) and self.bandwidth > 0):
            raise ConfigError(f"source {self.name}: bandwidth must be a finite number > 0")
        if not (math.isfinite(self.latency) and self.latency >= 0):
            raise ConfigError(f"source {self.name}: latency must be a finite number >= 0")

    def load(self, nbytes: int, n: int = 1) -> float:
        return nbytes / self.bandwidth + n * self.latency


def source_tier(text: str) -> Source:
    """``dram``, ``cxl`` or ``nvme`` (rkv's default tiers' read bandwidth and latency) or
    ``NAME@GBPS/US``."""
    from rkv.store.config import default_tiers

    name, _, figures = str(text).partition("@")
    if figures:
        gbps, _, us = figures.partition("/")
        try:
            return Source(name, float(gbps) * 1e9, float(us or 0) * 1e-6)
        except ValueError:
            raise ConfigError(f"bad source tier {text!r} (expected NAME@GBPS/US)") from None
    for t in default_tiers():
        if t.name == name:
            return Source(name, t.read_gbps * 1e9, t.latency_us * 1e-6)
    raise ConfigError(f"unknown source tier {text!r} (dram, cxl, nvme or NAME@GBPS/US)")


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
@dataclass
class MoEResult:
    """One replay: a policy, a prefetcher, a budget and a layout."""

    policy: str
    prefetch: str
    layout: str                   # "per-layer" or "global"
    budget: str                   # as asked
    budget_experts: int
    budget_fraction: float        # of all experts
    tokens: int
    accesses: int
    hits: int
    demand_bytes: int             # bytes of experts loaded on a miss
    prefetched: int               # prefetches issued
    prefetch_bytes: int
    prefetch_used: int            # prefetched experts hit before leaving the cache
    evictions: int
    stall: float                  # modeled seconds, all tokens
    stall_no_hide: float          # what the same misses would cost without any overlap
    seconds: float                # wall time of the replay loop
    recall: float | None = None   # filled by :func:`summarize` (module docstring)
    extra_misses: float | None = None
    gap_closed: float | None = None

    @property
    def label(self) -> str:
        pf = "" if self.prefetch == NONE else f" +{self.prefetch}"
        return f"{self.policy}{pf} ({self.layout})"

    @property
    def misses(self) -> int:
        return self.accesses - self.hits

    @property
    def hit_ratio(self) -> float:
        return self.hits / self.accesses if self.accesses else 0.0

    @property
    def bytes_per_token(self) -> float:
        return (self.demand_bytes + self.prefetch_bytes) / self.tokens if self.tokens else 0.0

    @property
    def precision(self) -> float | None:
        return self.prefetch_used / self.prefetched if self.prefetched else None

    @property
    def stall_per_token(self) -> float:
        return self.stall / self.tokens if self.tokens else 0.0

    def row(self) -> dict[str, Any]:
        return {**asdict(self), "label": self.label, "misses": self.misses,
                "hit_ratio": self.hit_ratio, "bytes_per_token": self.bytes_per_token,
                "precision": self.precision, "stall_per_token": self.stall_per_token}


def _policies(spec: str, caps: Sequence[int], size: int, refs: list[Hashable]
              ) -> list[EvictionPolicy]:
    from policies import make_policy

    if spec == BELADY:
        nxt = next_use_positions(refs)
        return [Belady(c * size, nxt) for c in caps]
    return [make_policy(spec, c * size) for c in caps]


def _prefetcher(spec: str) -> PrefetchPolicy | None:
    from policies import make_prefetch

    if spec == NONE:
        return None
    return make_prefetch("queue" if spec == HINTS else spec)


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


def simulate(trace: MoETrace, policy: str, experts: int, *, per_layer: bool = True,
             prefetch: str = NONE, width: int | None = None, source: Source = Source(),
             compute: float = DEFAULT_COMPUTE, budget_text: str = "") -> MoEResult:
    """Replay ``trace`` with ``experts`` cached experts in all (module docstring)."""
    nl, ne, size = trace.layers, trace.experts, trace.expert_bytes
    if prefetch != NONE and policy == BELADY:
        raise ConfigError("Belady is replayed without prefetch (it is the demand-miss limit)")
    if prefetch == HINTS and trace.hints is None:
        raise ConfigError(f"{trace.path or 'the trace'} carries no hints: prefetch 'hints' "
                          "needs a trace with per-token \"hints\"")
    if not (math.isfinite(compute) and compute >= 0):
        raise ConfigError(f"compute must be a finite number of seconds >= 0, got {compute!r}")
    width = trace.top_k if width is None else width
    if width < 1:
        raise ConfigError(f"prefetch width must be at least 1 expert, got {width}")
    caps = split_budget(experts, nl) if per_layer else [experts]
    refs = trace.refs
    pols = _policies(policy, caps, size, refs)
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
    stall = no_hide = 0.0
    pbytes = 0
    inflight: list[tuple[Hashable, float, float]] = []   # last step's prefetches: start, end
    t0 = time.perf_counter()
    for t, route in enumerate(trace.routes):
        for layer, chosen in enumerate(route):
            c = layer if per_layer else 0
            pol, cap = pols[c], cap_bytes[c]
            step = t * nl + layer
            protected: set[Hashable] = {(layer, e) for e in chosen}   # all needed at once
            # Prefetches still in flight when the router runs: kept if needed, else dropped.
            late = link_free = compute
            for key, start, end in inflight:
                if key in protected:
                    late = max(late, end)
                    link_free = max(link_free, end)
                elif end > compute:
                    pol.on_remove(key, aborted)
                    cached.remove(key)
                    unused.discard(key)
                    pbytes -= size - int((compute - start) * source.bandwidth)
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
            # Prefetch for the next step while this layer computes.
            inflight = []
            if pf is None or (layer + 1 == nl and t + 1 == trace.tokens):
                continue
            nxt, nt = (layer + 1, t) if layer + 1 < nl else (0, t + 1)
            if prefetch == HINTS:
                assert trace.hints is not None
                cands = [item_of(nxt, e) for e in trace.hints[nt][nxt]]
            else:
                ids = range(ne) if cands_of is None else cands_of[nxt]
                cands = [item_of(nxt, e) for e in _uncached(ids, nxt, cached,
                                                            width if in_order else None)]
            cands = [it for it in cands if it.key not in cached]
            c = nxt if per_layer else 0
            tpol, tcap = pols[c], cap_bytes[c]
            pprot: set[Hashable] = set() if per_layer else set(protected)
            clock = 0.0
            for key in pf.hints(cands, width * size):
                if clock >= compute or not make_room(tpol, tcap, pprot):
                    break
                tpol.on_insert(items[key], pos)
                cached.add(key)
                unused.add(key)
                pprot.add(key)
                inflight.append((key, clock, clock + source.load(size)))
                clock += source.load(size)
                counts["prefetched"] += 1
                pbytes += size
    seconds = time.perf_counter() - t0
    total = sum(caps)
    return MoEResult(
        policy=policy, prefetch=prefetch, layout=PER_LAYER if per_layer else GLOBAL,
        budget=budget_text or str(total), budget_experts=total,
        budget_fraction=total / (nl * ne), tokens=trace.tokens, accesses=len(refs),
        hits=counts["hits"], demand_bytes=counts["demand"] * size,
        prefetched=counts["prefetched"], prefetch_bytes=pbytes,
        prefetch_used=counts["used"], evictions=counts["evictions"], stall=stall,
        stall_no_hide=no_hide, seconds=seconds)


# -- the matrix ------------------------------------------------------------------------------------
def run_matrix(trace: MoETrace, policies: Sequence[str] = DEFAULT_POLICIES,
               budgets: Sequence[str] = DEFAULT_BUDGETS,
               prefetches: Sequence[str] = DEFAULT_PREFETCH,
               layouts: Sequence[str] = (PER_LAYER,), *, width: int | None = None,
               source: Source = Source(), compute: float = DEFAULT_COMPUTE,
               progress: Callable[[str], None] | None = None) -> list[MoEResult]:
    """Every policy x prefetch x budget x layout, then Belady in every layout; LRU without
    prefetch in every layout and per-layer LRU and Belady are always included (the gap's
    ends). Prefetch
    ``hints`` is skipped on a trace without hints. Recall and the gap are filled in."""
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
        if spec not in (NONE, HINTS):
            try:
                make_prefetch(spec)
            except PolicyError as exc:
                raise ConfigError(str(exc)) from exc
    sizes = [(b, budget_experts(b, trace)) for b in budgets]
    pfs = [p for p in prefetches if p != HINTS or trace.hints is not None]
    runs = [(p, f, lay) for lay in layouts for p in policies for f in pfs]
    for ref in [("lru", NONE, lay) for lay in (PER_LAYER, *layouts)]:
        if ref not in runs:
            runs.append(ref)
    runs += [(BELADY, NONE, lay) for lay in layouts]
    if (BELADY, NONE, PER_LAYER) not in runs:
        runs.append((BELADY, NONE, PER_LAYER))
    out: list[MoEResult] = []
    for pol, pf, lay in runs:
        for text, n in sizes:
            if progress:
                progress(f"{pol} +{pf} {lay} at {text}")
            out.append(simulate(trace, pol, n, per_layer=lay == PER_LAYER, prefetch=pf,
                                width=width, source=source, compute=compute,
                                budget_text=text))
    return summarize(out)


def summarize(results: Sequence[MoEResult]) -> list[MoEResult]:
    """Fill recall and extra misses (against the same policy and layout without prefetch) and
    the gap closed of demand-only runs (between LRU and Belady without prefetch, same layout,
    where both ends exist): the definitions are in the module docstring."""
    by = {(r.policy, r.prefetch, r.layout, r.budget): r for r in results}
    out = []
    for r in results:
        base = by.get((r.policy, NONE, r.layout, r.budget))
        lru = by.get(("lru", NONE, r.layout, r.budget))
        opt = by.get((BELADY, NONE, r.layout, r.budget))
        recall = extra = gap = None
        if r.prefetch != NONE:
            need = r.prefetch_used + r.misses
            recall = r.prefetch_used / need if need else None
            if base is not None and base.misses:
                extra = (need - base.misses) / base.misses
        elif lru is not None and opt is not None and lru.stall - opt.stall > 1e-12:
            gap = (lru.stall - r.stall) / (lru.stall - opt.stall)
        out.append(replace(r, recall=recall, extra_misses=extra, gap_closed=gap))
    return out
