"""The expert replay's simulation as it was before link contention, interference and the
oracle: rkv/moe/replay.py at commit 43fbf0b, ``simulate`` and its helpers, unchanged but for
this docstring, the default source and a dict for a result. The reference of the
differential tests in test_moe_replay_link.py: ``simulate(cancel_chunk=0, interference=0)``
of the current module must reproduce its stall exactly. Frozen: do not edit."""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Sequence
from typing import Any

from policies.base import EvictionPolicy, Item, PrefetchPolicy, Reason, checked_victims
from policies.belady import Belady, next_use_positions
from policies.prefetch import CoOccurrence, QueueOrder, ShallowFirst
from rkv.errors import ConfigError
from rkv.moe.replay import BELADY, HINTS, NONE, Source, split_budget
from rkv.moe.replay_trace import MoETrace

DEFAULT_COMPUTE = 1e-3


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
             prefetch: str = NONE, width: int | None = None, source: Source | None = None,
             compute: float = DEFAULT_COMPUTE) -> dict[str, Any]:
    """Replay ``trace`` with ``experts`` cached experts in all (the old module docstring)."""
    source = source or Source()
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
    return {"hits": counts["hits"], "demand_bytes": counts["demand"] * size,
            "prefetched": counts["prefetched"], "prefetch_bytes": pbytes,
            "prefetch_used": counts["used"], "evictions": counts["evictions"],
            "stall": stall, "stall_no_hide": no_hide}
