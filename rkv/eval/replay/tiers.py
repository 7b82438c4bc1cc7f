"""Store-less replay through several tiers: demotion, promotion and scheduler prefetch.

Tiers are listed top (fastest) to bottom; each has a byte capacity, a read bandwidth, a
per-block latency and its own :class:`EvictionPolicy` (one instance per tier, built from the
same spec). For every block of every request, in order, as
:func:`rkv.eval.replay.simulate.simulate` does for one tier:

* a block in the top tier is a top-tier hit (``on_access(hit=True)`` there);
* a block in a lower tier ``j`` is a hit in ``j`` (told to ``j``'s policy), loaded at ``j``'s
  cost. With ``promote="hit"`` (the default) it then moves to the top tier: the top tier is told
  a miss (``on_access(hit=False, item)``, so ghost lists see it), ``j`` is told
  ``on_remove(PROMOTED)`` and the top tier ``on_insert``; ``promote="never"`` leaves it in ``j``;
* a block in no tier is a miss, told to the top tier, and stored in the top tier, or, when the
  top tier cannot make room (everything there is protected), in the highest lower tier that
  can. An admission policy guards the top tier as it guards :func:`simulate`'s one tier: asked
  when a new block would push others out of the top tier; a refused block is stored in the
  highest lower tier that can take it (with one tier: nowhere), and reaches the top tier
  when promoted on a later hit.

Making room in tier ``i`` asks its policy for ``victims(need, protected)`` and demotes them as a
batch into tier ``i + 1`` (``on_remove(DEMOTED)`` in ``i``, ``on_insert`` in ``i + 1``), which
makes room there the same way, and so on down; victims of the last tier, or victims that the
tier below cannot take, leave the cache (``on_remove(EVICTED)``). ``protected`` holds the
blocks of the current request touched so far (a block is never demoted out from under the
request reading it) and, with a look-ahead, the blocks of the queued requests, in every tier.

With a look-ahead of N requests the queue also drives prefetch: before request ``r`` runs, the
blocks of requests ``r+1 .. r+N`` that sit in lower tiers (and are not also request ``r``'s,
which it loads on demand) are promoted to the top tier in queue order, at most
``prefetch_budget`` bytes per request (default: a quarter of the top tier, at least one block),
protecting the blocks of requests ``r .. r+N``. A later hit on a prefetched block is a top-tier
hit: its load happened in the background while earlier requests ran, which is the point of
prefetching (and an assumption: the model has no link contention).

TTFT per request: the leading hit blocks, each at ``block_bytes / bandwidth + latency`` of the
tier it was read from, plus the remaining tokens at ``recompute_tps``. With one tier every
number equals :func:`simulate`'s (tested).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Container, Hashable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from policies.base import (
    AdmissionPolicy,
    EvictionPolicy,
    Item,
    PolicyError,
    PrefetchPolicy,
    Reason,
    checked_victims,
)
from policies.belady import Belady, InfiniteCache
from policies.prefetch import make_prefetch
from rkv.checks import as_float, as_int, one_of
from rkv.errors import ConfigError
from rkv.eval.replay.layout import Layout, budget_bytes
from rkv.eval.replay.queue import Lookahead, Pins, parse_lookahead
from rkv.eval.replay.simulate import (
    BELADY,
    DEFAULT_BANDWIDTH,
    DEFAULT_LATENCY,
    INFINITE,
    Capacity,
    CostModel,
    Result,
    TierStats,
    Trace,
    _result,
    check_specs,
    run_replay,
    simulate,
)

PROMOTE = ("hit", "never")
_COUNTERS = ("written", "demoted_in", "promoted_in", "prefetched_in", "demoted_out",
             "promoted_out", "prefetched_out", "evicted")
_DEMOTED, _EVICTED, _PROMOTED = Reason.DEMOTED, Reason.EVICTED, Reason.PROMOTED
_COST = CostModel()


# -- simulation ------------------------------------------------------------------------------------
@dataclass
class Tier:
    """One tier of a replay: a fresh, empty policy and what reading from the tier costs."""

    name: str
    policy: EvictionPolicy
    capacity: int                       # bytes
    bandwidth: float = DEFAULT_BANDWIDTH  # bytes per second
    latency: float = DEFAULT_LATENCY      # seconds per block

    def __post_init__(self) -> None:
        as_int(self.capacity, f"tier {self.name}: capacity (bytes)", lo=0)
        as_float(self.bandwidth, f"tier {self.name}: bandwidth", lo=0, lo_open=True,
                 plain=False)
        as_float(self.latency, f"tier {self.name}: latency", lo=0, plain=False)


class _Cascade:
    """Where every cached block is, and the moves between tiers (the cold path: misses,
    promotions, prefetches), with the contract checks and the byte counters."""

    def __init__(self, tiers: Sequence[Tier]) -> None:
        self.pols = [t.policy for t in tiers]
        self.caps = [t.capacity for t in tiers]
        self.names = [t.name for t in tiers]
        self.wheres = [f"tier {t.name}" for t in tiers]   # for the contract's messages
        self.n = len(tiers)
        self.where: dict[Hashable, int] = {}
        self.count = {c: [0] * self.n for c in _COUNTERS}   # bytes per tier
        (self.written, self.demoted_in, self.promoted_in, self.prefetched_in, self.demoted_out,
         self.promoted_out, self.prefetched_out, self.evicted) = self.count.values()
        self.evictions = 0
        #: Per tier, the smallest need its policy could not meet since :meth:`forget`:
        #: while the protected set only grows and nothing unprotected enters the tier, no
        #: larger need can be met either, and asking again would walk the whole tier.
        self.futile = [math.inf] * self.n

    def forget(self) -> None:
        """The protected set shrank (a new request): every tier may free more again."""
        self.futile = [math.inf] * self.n

    def ask(self, t: int, need: int, protected: Container[Hashable]
            ) -> tuple[list[Item], int] | None:
        """Tier ``t``'s victims for ``need`` bytes (> 0) and the bytes they free, checked
        (:func:`policies.base.checked_victims`). ``None``: the policy cannot."""
        if need >= self.futile[t]:
            return None
        pol = self.pols[t]
        out = checked_victims(pol, need, protected, self.wheres[t])
        if out is None:
            self.futile[t] = need
            return None
        item, found, freed = pol.item, [], 0
        for v in out:
            it = item(v)
            found.append(it)
            freed += it.size
        return found, freed

    def push_down(self, t: int, out: list[Item], size: int, protected: Container[Hashable],
                  now: float) -> None:
        """Take ``out`` (checked victims of ``size`` bytes) out of tier ``t``: into tier
        ``t + 1`` as a batch if it can make room for all of them (cascading), else out of the
        cache."""
        pol, where, nxt = self.pols[t], self.where, t + 1
        below: tuple[list[Item], int] | None = None
        if nxt < self.n:
            lower = self.pols[nxt]
            need = lower.used + size - self.caps[nxt]
            below = self.ask(nxt, need, protected) if need > 0 else ([], 0)
        remove = pol.on_remove
        if below is None:
            for it in out:
                remove(it.key, _EVICTED)
                del where[it.key]
            self.evicted[t] += size
            self.evictions += len(out)
            return
        for it in out:
            remove(it.key, _DEMOTED)
        self.demoted_out[t] += size
        if below[0]:
            self.push_down(nxt, below[0], below[1], protected, now)
        insert = lower.on_insert
        for it in out:
            insert(it, now)
            where[it.key] = nxt
        self.demoted_in[nxt] += size
        self.futile[nxt] = math.inf          # unprotected blocks entered the tier below

    def place(self, item: Item, protected: Container[Hashable], now: float, start: int = 0
              ) -> None:
        """Store a new block in the highest tier from ``start`` down that can make room for
        it, if any."""
        size = item.size
        for t in range(start, self.n):
            pol = self.pols[t]
            need = pol.used + size - self.caps[t]
            if need > 0:
                out = self.ask(t, need, protected)
                if out is None:
                    continue
                self.push_down(t, out[0], out[1], protected, now)
            pol.on_insert(item, now)
            self.where[item.key] = t
            self.written[t] += size
            return

    def lift(self, key: Hashable, t: int, protected: Container[Hashable], now: float,
             prefetch: bool = False) -> bool:
        """Move ``key`` from tier ``t`` to the top tier if it can make room (a promotion, or
        with ``prefetch`` a prefetch). ``key`` must be protected."""
        pol, top = self.pols[t], self.pols[0]
        item = pol.item(key)
        size = item.size
        need = top.used + size - self.caps[0]
        out = self.ask(0, need, protected) if need > 0 else ([], 0)
        if out is None:
            return False
        pol.on_remove(key, _PROMOTED)
        if out[0]:
            self.push_down(0, out[0], out[1], protected, now)
        top.on_insert(item, now)
        self.where[key] = 0
        if prefetch:
            self.prefetched_out[t] += size
            self.prefetched_in[0] += size
        else:
            self.promoted_out[t] += size
            self.promoted_in[0] += size
        return True

    def prefetch(self, cands: deque[Hashable], pins: Container[Hashable],
                 running: set[Hashable], budget: int, now: float,
                 policy: PrefetchPolicy) -> None:
        """Promote queued blocks sitting in lower tiers, those ``policy`` picks within
        ``budget`` bytes from the front of the queue (a window of candidates just over the
        budget), in its order. ``pins``: the blocks of the running and queued requests;
        ``running``: the running request's, which are loaded on demand, not prefetched.
        Candidates not moved stay at the front of ``cands`` for the next request."""
        where, pols = self.where, self.pols
        window: dict[Hashable, Item] = {}
        total = 0
        while cands and total <= budget:
            key = cands.popleft()
            t = where.get(key)
            if t and key in pins and key not in running and key not in window:
                item = window[key] = pols[t].item(key)
                total += item.size
        lifted = set()
        for key in policy.hints(list(window.values()), budget):
            t = where.get(key)
            if not t or not self.lift(key, t, pins, now, prefetch=True):
                break
            lifted.add(key)
        cands.extendleft(k for k in reversed(window) if k not in lifted)


def simulate_tiers(trace: Trace, tiers: Sequence[Tier], cost: CostModel = _COST, *,
                   label: str | None = None, capacity_text: str = "",
                   admission: AdmissionPolicy | None = None,
                   lookahead: int | str | Lookahead = 0, promote: str = "hit",
                   prefetch_budget: int | None = None, prefetch_policy: str = "queue") -> Result:
    """Replay ``trace`` through ``tiers`` (top first, fresh policies; see the module doc).
    ``cost`` gives the block size and the recompute throughput (its bandwidth and latency are
    the tiers'); ``prefetch_budget``: bytes per request (``None``: a quarter of the top tier,
    at least one block; 0: no prefetch); ``prefetch_policy``: a :mod:`policies.prefetch`
    spec choosing which queued blocks the budget moves."""
    try:
        prefetcher = make_prefetch(prefetch_policy)
    except PolicyError as exc:
        raise ConfigError(str(exc)) from exc
    if not 1 <= len(tiers) < 255:      # ``served`` keeps tier numbers in bytes
        raise ConfigError(f"a replay needs 1 to 254 tiers, got {len(tiers)}")
    one_of(promote, PROMOTE, "promote")
    ahead = parse_lookahead(lookahead)
    ends = trace.queue_ends(ahead)
    budget = as_int(max(tiers[0].capacity // 4, cost.block_bytes) if prefetch_budget is None
                    else prefetch_budget, "prefetch budget (bytes)", lo=0)
    top = tiers[0].policy
    name = label or top.name or type(top).__name__
    c = _Cascade(tiers)
    refs, items, starts, counted = trace.refs, trace.items, trace.starts, trace.counted
    nreq = trace.requests
    where, pols, place, lift = c.where, c.pols, c.place, c.lift
    access0, cap0 = top.on_access, tiers[0].capacity
    promoting = promote == "hit"
    if len(tiers) == 1 or not ahead:
        budget = 0                             # nothing below to prefetch from, or no queue
    served = bytearray(b"\xff") * len(refs)    # the tier each reference hit in; 255: a miss
    lead = [0] * nreq
    # With a queue, ``pins`` holds the blocks of requests r .. ends[r]-1 while request r's
    # prefetch runs, then those of r+1 .. ends[r]-1 plus the blocks r has touched so far.
    pins = Pins()
    cands: deque[Hashable] = deque()           # queued blocks in queue order, to prefetch
    tail = 0                                   # requests below ``tail`` have been pinned
    t0 = time.perf_counter()
    for r in range(nreq):
        s, e = starts[r], starts[r + 1]
        protected: set[Hashable] | Pins
        if ahead:
            if r >= tail:                       # r arrived after the queue was last seen
                pins.add_all(refs[s:e])
                tail = r + 1
            for q in range(tail, ends[r]):      # the new arrivals join the queue
                joining = refs[starts[q]:starts[q + 1]]
                pins.add_all(joining)
                cands.extend(joining)
            tail = max(tail, ends[r])
            c.forget()                          # request r - 1's blocks left the pins
            if budget and cands:                # request r's own blocks are not prefetched
                c.prefetch(cands, pins, set(refs[s:e]), budget, s, prefetcher)
            pins.drop_all(refs[s:e])            # request r leaves the queue
            protected = pins
        else:
            protected = set()
        c.forget()
        add = protected.add
        first_miss = -1
        for i in range(s, e):
            key = refs[i]
            queued = bool(ahead) and key in protected  # a queued request will read it too
            add(key)                            # the request's blocks stay while it runs
            t = where.get(key)
            if t == 0:
                access0(key, True, i)
                if admission is not None:
                    admission.on_access(key, True, i)
                served[i] = 0
            elif t is None:
                if first_miss < 0:
                    first_miss = i - s
                item = items[i]
                access0(key, False, i, item)
                if admission is not None:
                    admission.on_access(key, False, i)
                if top.used + item.size > cap0 and not queued and not (
                        (admission is None or admission.admit(item, i)) and top.admits(item, i)):
                    place(item, protected, i, 1)        # refused by the top tier only
                    continue
                place(item, protected, i)
            else:
                served[i] = t
                pols[t].on_access(key, True, i)
                if admission is not None:
                    admission.on_access(key, True, i)
                if promoting:
                    access0(key, False, i, items[i])   # the top tier did not have it
                    lift(key, t, protected, i)
        if ahead:
            pins.drop_all(refs[s:e])
        if counted[r]:
            lead[r] = e - s if first_miss < 0 else first_miss
    seconds = time.perf_counter() - t0
    return _tiered_result(trace, cost, tiers, c, served, lead, seconds, name, capacity_text,
                          lookahead=ahead.requests, lookahead_s=float(ahead.seconds),
                          promote=promote, prefetch_budget=budget if ahead else 0)


def _tiered_result(trace: Trace, cost: CostModel, tiers: Sequence[Tier], c: _Cascade,
                   served: bytearray, lead: list[int], seconds: float, label: str,
                   capacity_text: str, **extra: Any) -> Result:
    """Per-tier hits and leading hits from ``served``; TTFT loads each leading hit at the cost
    of the tier it came from (one tier: exactly :func:`simulate`'s arithmetic)."""
    import numpy as np

    starts = np.asarray(trace.starts, dtype=np.int64)
    mask = np.asarray(trace.counted, dtype=bool)
    tier_of = np.frombuffer(bytes(served), dtype=np.uint8)
    ref_counted = np.repeat(mask, starts[1:] - starts[:-1])
    first, end = starts[:-1], starts[:-1] + np.asarray(lead, dtype=np.int64)
    load: Any = None
    stats = []
    for t, tier in enumerate(tiers):
        here = tier_of == t
        cum = np.concatenate([[0], np.cumsum(here, dtype=np.int64)])
        k = (cum[end] - cum[first])[mask]
        part = k * (cost.block_bytes / tier.bandwidth + tier.latency)
        load = part if load is None else load + part
        stats.append(TierStats(
            tier.name, tier.capacity, tier.bandwidth, tier.latency,
            hits=int((here & ref_counted).sum()), prefix_hits=int(k.sum()),
            used_at_end=tier.policy.used, **{n: v[t] for n, v in c.count.items()}))
    hits = sum(s.hits for s in stats)
    capacity = sum(t.capacity for t in tiers)
    return _result(trace, cost, label, capacity, capacity_text, lead, hits, c.evictions,
                   seconds, load=load, tiers=tuple(stats), **extra)


# -- runs ------------------------------------------------------------------------------------------
def run_layouts(trace: Trace, policies: Sequence[str], layouts: Sequence[Layout],
                cost: CostModel = _COST, *, references: bool = True,
                progress: Callable[[str], None] | None = None,
                lookaheads: Sequence[int | str | Lookahead] = (0,),
                promote: str = "hit", prefetch_budget: Capacity | None = None,
                prefetch_policy: str = "queue") -> list[Result]:
    """Every policy spec on every layout (and look-ahead: ``spec +prefetch N`` with several
    tiers and a budget, ``spec +queue N`` otherwise; the prefetch policy is named when it is
    not ``queue``), then (with ``references``) Belady on
    one-tier layouts (it needs to be the only policy deciding, so it is skipped for several)
    and the infinite cache loaded at the top tier's cost. Bad input raises ConfigError first."""
    from policies import make_admission, make_policy, split_spec

    one_of(promote, PROMOTE, "promote")
    queues = [parse_lookahead(n) for n in lookaheads]
    resolved = [(lay, [t.capacity.resolve(trace, cost) for t in lay.tiers]) for lay in layouts]
    try:
        make_prefetch(prefetch_policy)
    except PolicyError as exc:
        raise ConfigError(str(exc)) from exc
    check_specs(policies, resolved[0][1][0] if resolved else 1)
    out: list[Result] = []
    for spec in policies:
        evict, admit = split_spec(spec)
        for ahead in queues:
            for lay, caps in resolved:
                budget = budget_bytes(prefetch_budget, caps[0])
                label = spec
                if ahead:
                    word = "prefetch" if len(caps) > 1 and budget != 0 else "queue"
                    label = f"{spec} +{word} {ahead.text}"
                    if word == "prefetch" and prefetch_policy != "queue":
                        label += f" {prefetch_policy}"
                if progress:
                    progress(f"{label} on {lay.text}")
                tiers = [Tier(ts.name, make_policy(evict, cap), cap, ts.bandwidth, ts.latency)
                         for ts, cap in zip(lay.tiers, caps, strict=True)]
                adm = None if admit == "all" else make_admission(admit)
                out.append(simulate_tiers(trace, tiers, cost, label=label,
                                          capacity_text=lay.text, admission=adm,
                                          lookahead=ahead, promote=promote,
                                          prefetch_budget=budget,
                                          prefetch_policy=prefetch_policy))
    if references:
        total = trace.unique * cost.block_bytes
        for lay, caps in resolved:
            top = replace(cost, bandwidth=lay.tiers[0].bandwidth, latency=lay.tiers[0].latency)
            if len(caps) == 1:
                if progress:
                    progress(f"{BELADY} on {lay.text}")
                out.append(simulate(trace, Belady(caps[0], trace.next_use), caps[0], top,
                                    label=BELADY, capacity_text=lay.text))
            if progress:
                progress(f"{INFINITE} on {lay.text}")
            inf = simulate(trace, InfiniteCache(total), total, top, label=INFINITE)
            out.append(replace(inf, capacity=lay.text, capacity_bytes=sum(caps),
                               capacity_blocks=sum(caps) // cost.block_bytes,
                               capacity_fraction=sum(caps) / total))
    return out


def replay_all(trace: Trace, policies: Sequence[str], capacities: Sequence[Capacity],
               layouts: Sequence[Layout], cost: CostModel = _COST, *,
               progress: Callable[[str], None] | None = None,
               lookaheads: Sequence[int | str | Lookahead] = (0,),
               promote: str = "hit", prefetch_budget: Capacity | None = None,
               prefetch_policy: str = "queue") -> list[Result]:
    """One-tier capacities (:func:`rkv.eval.replay.simulate.run_replay`) and tier layouts
    (:func:`run_layouts`) in one list, the reference rows (Belady, infinite) last."""
    out: list[Result] = []
    if capacities:
        out += run_replay(trace, policies, capacities, cost, progress=progress,
                          lookaheads=lookaheads)
    if layouts:
        out += run_layouts(trace, policies, layouts, cost, progress=progress,
                           lookaheads=lookaheads, promote=promote,
                           prefetch_budget=prefetch_budget, prefetch_policy=prefetch_policy)
    return sorted(out, key=lambda r: r.policy in (BELADY, INFINITE))
