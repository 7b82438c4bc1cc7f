"""The device cache of :mod:`rkv.adapters.moe`: decoded experts within a byte budget, run by the
same ``policies`` objects the KV engine uses (``make_policy``, ``make_admission``).

Not thread-safe by itself: :class:`~rkv.adapters.moe.RkvExperts` holds its lock around every
call. Keys are ``(layer, expert)``; an :class:`~policies.base.Item` carries the decoded size,
the tier the record lives in, the layer as ``group`` and ``depth``, and the load's nominal
seconds as ``miss_cost``.
"""

from __future__ import annotations

from collections.abc import Container, Hashable
from dataclasses import dataclass

from policies import make_admission, make_policy
from policies.base import AdmissionPolicy, EvictionPolicy, Item, Reason, checked_victims
from rkv.moe.experts import ExpertWeights

Key = tuple[int, int]


@dataclass
class Entry:
    weights: ExpertWeights
    size: int
    prefetched: bool          # inserted by a prefetch and not used yet


class DeviceCache:
    """Decoded experts in memory. ``per_layer``: one eviction policy per layer with an equal
    share of the budget (a layer's experts never push out another layer's); otherwise one
    policy over every expert."""

    def __init__(self, budget: int, n_layers: int, eviction: str = "lru",
                 per_layer: bool = False, admission: str | None = None) -> None:
        self.budget = int(budget)
        self.per_layer = per_layer
        share = self.budget // max(1, n_layers) if per_layer else self.budget
        groups = range(n_layers) if per_layer else [None]
        self.policies: dict[int | None, EvictionPolicy] = {
            g: make_policy(eviction, share) for g in groups}
        self.admission: AdmissionPolicy | None = (
            make_admission(admission) if admission else None)
        self.entries: dict[Key, Entry] = {}
        self.evictions = 0
        self.refused = 0
        self.prefetch_wasted = 0

    def policy(self, layer: int) -> EvictionPolicy:
        return self.policies[layer if self.per_layer else None]

    @property
    def used(self) -> int:
        return sum(p.used for p in self.policies.values())

    def lookup(self, key: Key, item: Item, now: float) -> Entry | None:
        """The entry (a hit) or None (a miss); either way the policies are told."""
        entry = self.entries.get(key)
        hit = entry is not None
        self.policy(key[0]).on_access(key, hit, now, None if hit else item)
        if self.admission is not None:
            self.admission.on_access(key, hit, now)
        return entry

    def admit(self, item: Item, weights: ExpertWeights, now: float,
              protected: Container[Hashable] = (), prefetched: bool = False) -> bool:
        """Insert a loaded expert, making room through the eviction policy; False when it is
        not cached (too large, refused by admission, or no victims outside ``protected``)."""
        key = item.key
        assert isinstance(key, tuple)
        if key in self.entries:
            return True
        pol = self.policy(key[0])
        need = pol.used + item.size - pol.capacity
        if item.size > pol.capacity:
            self.refused += 1
            return False
        if need > 0:
            if self.admission is not None and not self.admission.admit(item, now):
                self.refused += 1
                return False
            victims = checked_victims(pol, need, protected, "the device cache")
            if victims is None:
                self.refused += 1
                return False
            for v in victims:
                self.remove(v, Reason.EVICTED)  # type: ignore[arg-type]
                self.evictions += 1
        pol.on_insert(item, now)
        self.entries[key] = Entry(weights, item.size, prefetched)  # type: ignore[index]
        return True

    def remove(self, key: Key, reason: Reason) -> None:
        entry = self.entries.pop(key, None)
        if entry is None:
            return
        if entry.prefetched and reason is Reason.EVICTED:
            self.prefetch_wasted += 1
        self.policy(key[0]).on_remove(key, reason)

    def clear(self) -> None:
        for key in list(self.entries):
            self.remove(key, Reason.DELETED)
