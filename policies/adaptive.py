"""``adaptive``: several policies rank the cache, the one that would have served it best leads.

No single policy wins on every trace and at every size. Measured on a multi-turn
conversation trace, ``prefix`` beats LRU by a third at 2 % of the unique blocks and falls
below it at 20 %; ``reuse`` beats both at 10-20 %; second-sighting admission
(``prefix+after(n=2)``) is best of all at 2 % and caps the hit ratio far below LRU's at 10-20 %,
while on two other traces it is best at every size. This policy runs its candidates side by
side (``lru``, ``prefix``, ``reuse`` and ``prefix+after(n=2)`` by default; a candidate is an
eviction spec, optionally with ``+`` an admission rule) and does what the current leader says:

* **Rankers.** Every candidate's eviction policy is told every event of this cache (inserts,
  accesses, removals), so each knows the cache's contents in its own order and any can lead
  at once: :meth:`victims` is the leader's answer, :meth:`admits` its admission rule's.
* **Shadows.** Every candidate also runs a shadow cache of the same capacity that holds keys
  only: it is told every access, admits a miss when its admission rule lets it and it can make
  room, and evicts by its own choice. A shadow hit scores the block's miss cost, counted the
  way a prefix cache is served: only while every earlier block of the request hit in that
  shadow too (a hit after a miss serves nothing).
* **Leader.** Scores fade by ``exp(-1/window)`` per reference, ``window`` = ``horizon`` x the
  cache's block count (at least 1024), so the leader is the candidate that served the recent
  past best. A challenger takes the lead only when its score is ``margin`` above the leader's
  (no flapping between equals).

Because LRU is a candidate, the cache is never far below LRU: it follows the best shadow,
less what the switches cost (a new leader inherits contents chosen by the old one). Costs
about twice the candidates' work per reference and their keys twice over (the shadows hold no
data). In a tiered store each tier's policy sees its own tier's hits only, so a shadow does
not learn of hits its own contents would have served from a lower tier.
"""

from __future__ import annotations

import math
from collections.abc import Container, Hashable

from policies.admission import make_admission, split_spec
from policies.base import (
    AdmissionPolicy,
    EvictionPolicy,
    Item,
    PolicyError,
    Reason,
    soft_pinned,
    take_soft,
)
from policies.lru import LRU
from policies.prefix import PrefixAware
from policies.reuse import ReusePredicting
from policies.spec import SpecError, parse_call
from policies.table import REGISTERED, register

#: The candidates when none are given.
DEFAULT_CANDIDATES = "lru|prefix|reuse|prefix+after(n=2)"
_BUILT_IN: dict[str, type[EvictionPolicy]] = {
    "lru": LRU, "prefix": PrefixAware, "reuse": ReusePredicting}
#: Rescale the scores before the per-reference increment overflows.
_RESCALE_AT = 1e150
#: Removals that take a block away from every cache (its data is gone), not a choice.
_GONE = (Reason.DELETED, Reason.UNCORRECTABLE)


def _candidate(spec: str, capacity: int) -> EvictionPolicy:
    """One candidate's eviction policy built from its spec (a registered name with keyword
    arguments)."""
    try:
        call = parse_call(spec, "candidate policy")
    except SpecError as exc:
        raise PolicyError(str(exc)) from None
    cls = _BUILT_IN.get(call.name) or REGISTERED.get(call.name)
    if cls is None or cls is Adaptive:
        raise PolicyError(f"unknown candidate policy {call.name!r} for adaptive "
                          f"(known: {', '.join(sorted(set(REGISTERED) - {'adaptive'}))})")
    if call.args:
        raise PolicyError(f"candidate arguments must be key=value pairs: {spec!r}")
    try:
        return cls(capacity, **call.kwargs)
    except TypeError as exc:
        raise PolicyError(f"bad parameters for candidate {call.name!r}: {exc}") from exc


class _Shadow:
    """A keys-only cache run by one candidate policy, scoring what it would have served."""

    def __init__(self, policy: EvictionPolicy, gate: AdmissionPolicy) -> None:
        self.policy = policy
        self.gate = gate             # the candidate's admission rule (shared with its ranker)
        self.score = 0.0
        self.broken = False          # a miss earlier in the request under way
        #: The smallest need this request could not free: the request's blocks only join
        #: the protected set, so no larger need can be freed until the next request (each
        #: failing ask walks the whole shadow; a request longer than the cache asked it
        #: once per block).
        self.futile = math.inf

    def access(self, key: Hashable, now: float, item: Item | None, start: bool,
               gain: float, request: Container[Hashable]) -> None:
        pol = self.policy
        if start:
            self.broken = False
            self.futile = math.inf
        if key in pol:
            pol.on_access(key, True, now)
            if not self.broken:
                self.score += gain
            return
        self.broken = True
        pol.on_access(key, False, now, item)
        if item is not None:
            self.admit(item, now, request)

    def admit(self, item: Item, now: float, request: Container[Hashable]) -> None:
        """Store ``item``, evicting by the candidate's choice but never a block of the
        request under way (``request``), as the cache itself does."""
        pol = self.policy
        need = pol.used + item.size - pol.capacity
        if need > 0:
            if not self.gate.admit(item, now):
                return
            out = pol.victims(need, request) if need < self.futile else None
            if out is None:
                self.futile = min(self.futile, need)
                return
            for v in out:
                pol.on_remove(v, Reason.EVICTED)
        pol.on_insert(item, now)


@register("adaptive")
class Adaptive(EvictionPolicy):
    """The candidates' leader decides (see the module docstring). ``candidates``: policy
    specs separated by ``|`` (``adaptive(candidates=lru|prefix|reuse(weight=0.25))``), the
    first leading until a shadow proves better."""

    def __init__(self, capacity: int, candidates: str = DEFAULT_CANDIDATES,
                 horizon: float = 4.0, margin: float = 0.02) -> None:
        super().__init__(capacity)
        if not isinstance(candidates, str):
            raise PolicyError(f"candidates must be a string of policy specs, got "
                              f"{candidates!r}")
        for name, v in (("horizon", horizon), ("margin", margin)):
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) \
                    or v < 0:
                raise PolicyError(f"{name} must be a finite number >= 0, got {v!r}")
        if horizon <= 0:
            raise PolicyError("horizon must be > 0")
        specs = [s.strip() for s in candidates.split("|")]
        if not specs or any(not s for s in specs):
            raise PolicyError(f"candidates must name at least one policy: {candidates!r}")
        self.specs = tuple(specs)
        parts = [split_spec(s) for s in specs]
        # One ranker per distinct eviction spec: two candidates that differ only in their
        # admission rule (``prefix`` and ``prefix+after(n=2)``) are told the same events of
        # this cache, so their rankers would hold the same order twice.
        evictions = list(dict.fromkeys(e for e, _ in parts))
        self.rankers = [_candidate(e, capacity) for e in evictions]
        #: Candidate i ranks with ``rankers[ranker_of[i]]``.
        self.ranker_of = [evictions.index(e) for e, _ in parts]
        #: Each candidate's admission rule: what it has seen depends on the accesses only,
        #: so its shadow and its ranker share one.
        self.gates = [make_admission(a) for _, a in parts]
        self.shadows = [_Shadow(_candidate(e, capacity), g)
                        for (e, _), g in zip(parts, self.gates, strict=True)]
        self.horizon = float(horizon)
        self.margin = float(margin)
        self.leader = 0
        self.switches = 0
        self._gain = 1.0              # the weight of a hit now (grows instead of decaying all)
        self._prev: Hashable = None   # the key accessed last (requests start at depth 0)
        self._request: set[Hashable] = set()     # keys of the request under way

    # -- told ----------------------------------------------------------------------------------
    def _insert(self, item: Item, now: float) -> None:
        for r in self.rankers:
            r.on_insert(item, now)
        self._request.add(item.key)
        for sh in self.shadows:
            # A write that did not come from a miss (the engine stores a computed prefix):
            # every shadow would have stored it too.
            if item.key not in sh.policy:
                sh.admit(item, now, self._request)

    def _access(self, key: Hashable, hit: bool, now: float, item: Item | None) -> None:
        for r in self.rankers:
            r.on_access(key, hit, now, item)
        known = self._items.get(key) if hit else item
        if known is None:
            known = next((sh.policy.item(key) for sh in self.shadows if key in sh.policy), None)
        depth = known.depth if known is not None else 0
        parent = known.parent if known is not None else None
        if depth == 0 or parent != self._prev:
            self._request = set()
            start = True
        else:
            start = False
        self._prev = key
        self._request.add(key)
        gain = self._gain * (known.miss_cost if known is not None else 1.0)
        for g in self.gates:
            g.on_access(key, hit, now)
        for sh in self.shadows:
            sh.access(key, now, known, start, gain, self._request)
        self._fade()
        self._elect()

    def _remove(self, item: Item, reason: Reason) -> None:
        for r in self.rankers:
            r.on_remove(item.key, reason)
        if reason in _GONE:
            for sh in self.shadows:
                if item.key in sh.policy:
                    sh.policy.on_remove(item.key, reason)

    def _fade(self) -> None:
        window = max(1024.0, self.horizon * len(self._items))
        self._gain *= math.exp(1.0 / window)
        if self._gain > _RESCALE_AT:
            for sh in self.shadows:
                sh.score /= self._gain
            self._gain = 1.0

    def _elect(self) -> None:
        best = max(range(len(self.shadows)), key=lambda i: self.shadows[i].score)
        if best != self.leader and \
                self.shadows[best].score > self.shadows[self.leader].score * (1 + self.margin):
            self.leader = best
            self.switches += 1

    # -- asked ---------------------------------------------------------------------------------
    def victims(self, need: int, protected: Container[Hashable] = ()) -> list[Hashable] | None:
        lead = self.rankers[self.ranker_of[self.leader]]
        out = lead.victims(need, protected)
        if out and self._pinnable and any(soft_pinned(self._items[k], self._now) for k in out):
            # Soft pins go last whoever leads (LRU itself ignores them): the leader's whole
            # order, re-taken with pinned keys deferred. Only while pins exist.
            free = sum(it.size for k, it in self._items.items() if k not in protected)
            order = lead.victims(free, protected) or []
            out = take_soft(order, self._items, need, protected, self._now)
        return out

    def admits(self, item: Item, now: float) -> bool:
        """The leading candidate's admission rule (``prefix+after(n=2)``: a second sighting)."""
        return self.gates[self.leader].admit(item, now)

    def scores(self) -> dict[str, float]:
        """Each candidate's faded shadow score, relative to the leader's (1.0)."""
        top = self.shadows[self.leader].score or 1.0
        return {spec: sh.score / top for spec, sh in zip(self.specs, self.shadows, strict=True)}
