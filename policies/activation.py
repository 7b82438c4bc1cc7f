"""Activation-aware eviction for MoE experts, in the spirit of MoE-Infinity (Xue et al. 2024).

A MoE layer's router picks a few experts per token, and which ones it picks drifts slowly with
the request. MoE-Infinity keeps the experts with the highest *recent activation frequency*,
and favours the experts of early layers (later layers' experts can be prefetched while the
early layers compute). This policy does the same over opaque keys:

* every access (hit or miss) adds one activation to its key's score, and every score decays
  with a half-life of ``halflife`` accesses (default ``window`` times the number of cached items,
  so the memory scales with the cache). Scores outlive eviction (a history of every key seen,
  the expert universe of a model being small), so an expert that comes back returns with its
  past activations; an expert inserted without being accessed (a prefetch) starts from its
  history alone;
* the victim is the cached key with the lowest ``score * w(depth)``, where ``w(depth) = (1 +
  depth) ** -depth_weight`` (``Item.depth`` is the layer; ``depth_weight=0``, the default,
  weighs every layer alike), ties to the least recently accessed;
* scores are kept in a shared "inflated" unit (an access adds ``g``, which grows by ``2 **
  (1 / halflife)`` per access) so that decay never touches the stored scores; they are
  rescaled when ``g`` grows large.

O(log n) per event (a sorted index); ``victims`` walks it from the lowest score and changes
nothing. Soft pins (``Item.deadline``) are deferred as in :func:`policies.base.take_soft`.
"""

from __future__ import annotations

import math
from collections.abc import Container, Hashable

from sortedcontainers import SortedList  # type: ignore[import-untyped]

from policies.base import EvictionPolicy, Item, PolicyError, Reason, take_soft
from policies.table import register

_RESCALE = 1e150     # rescale every score when the unit grows past this


@register("activation")
class ActivationAware(EvictionPolicy):
    """Keeps the keys with the highest decayed activation count, optionally weighted by depth
    (module docstring). O(log n) per event."""

    def __init__(self, capacity: int, halflife: float | None = None, window: float = 32.0,
                 depth_weight: float = 0.0) -> None:
        super().__init__(capacity)
        if halflife is not None and (isinstance(halflife, bool)
                                     or not isinstance(halflife, int | float)
                                     or not halflife > 0 or not math.isfinite(halflife)):
            raise PolicyError(f"activation: halflife must be a number > 0, got {halflife!r}")
        for name, v in (("window", window), ("depth_weight", depth_weight)):
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) \
                    or v < 0:
                raise PolicyError(f"activation: {name} must be a number >= 0, got {v!r}")
        if window == 0 and halflife is None:
            raise PolicyError("activation: window must be > 0 when halflife is not given")
        self.halflife = None if halflife is None else float(halflife)
        self.window = float(window)
        self.depth_weight = float(depth_weight)
        self._unit = 1.0                            # what one activation adds now
        self._score: dict[Hashable, float] = {}    # every key seen, in the inflated unit
        self._entry: dict[Hashable, tuple[float, int, Hashable]] = {}   # cached keys
        self._index = SortedList()
        self._seq = 0

    def score(self, key: Hashable) -> float:
        """The key's decayed activation count, in activations (0 for an unknown key)."""
        return self._score.get(key, 0.0) / self._unit

    def _weight(self, item: Item) -> float:
        if not self.depth_weight:
            return 1.0
        return float((1 + max(item.depth, 0)) ** -self.depth_weight)

    def _place(self, key: Hashable) -> None:
        self._seq += 1
        entry = (self._score.get(key, 0.0) * self._weight(self._items[key]), self._seq, key)
        self._entry[key] = entry
        self._index.add(entry)

    def _insert(self, item: Item, now: float) -> None:
        self._place(item.key)

    def _access(self, key: Hashable, hit: bool, now: float, item: Item | None) -> None:
        half = self.halflife if self.halflife is not None \
            else self.window * max(1, len(self._items))
        self._unit *= 2.0 ** (1.0 / half)
        self._score[key] = self._score.get(key, 0.0) + self._unit
        if hit:
            self._index.remove(self._entry[key])
            self._place(key)
        if self._unit > _RESCALE:
            self._rescale()

    def _rescale(self) -> None:
        unit = self._unit
        # Forget keys whose score decayed below a millionth of an activation (not cached).
        self._score = {k: s / unit for k, s in self._score.items()
                       if k in self._items or s / unit > 1e-6}
        self._unit = 1.0
        self._index = SortedList()
        for key, (_, seq, _) in self._entry.items():
            entry = (self._score.get(key, 0.0) * self._weight(self._items[key]), seq, key)
            self._entry[key] = entry
            self._index.add(entry)

    def _remove(self, item: Item, reason: Reason) -> None:
        self._index.remove(self._entry.pop(item.key))

    def victims(self, need: int, protected: Container[Hashable] = ()) -> list[Hashable] | None:
        order = (entry[2] for entry in self._index)
        return take_soft(order, self._items, need, protected, self._now)
