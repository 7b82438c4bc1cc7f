"""Prefetch policies: which of the objects a caller will soon need to move up, in what order.

The caller (the engine's :meth:`prefetch`, the multi-tier replay) knows what is coming: the
requests in a scheduler's queue. It hands a policy the upcoming objects that sit below the
fast tier, in queue order, and a byte budget; the policy answers the keys to move, most
urgent first, whose sizes fit the budget. Asking changes nothing.

* ``queue``: in queue order, stopping at the first object that does not fit (the next
  request's data first; nothing is skipped, so a later object never overtakes an earlier).
* ``shallow``: a KV cache's order. A request reads its prefix from the first chunk on and
  every leading chunk saves its load, while a chunk behind a missing one saves nothing; so
  with a budget too small for the whole queue, the first chunks of every queued request go
  before the tails of the first ones (by depth, then queue order), skipping what does not
  fit. ``max_depth`` bounds how deep it looks.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from policies.base import Item, PolicyError, PrefetchPolicy
from policies.registry import build


class QueueOrder(PrefetchPolicy):
    """Upcoming objects in queue order until the budget runs out."""

    name = "queue"

    def hints(self, upcoming: Sequence[Item], budget: int) -> list[Hashable]:
        out: list[Hashable] = []
        seen: set[Hashable] = set()
        for item in upcoming:
            if item.key in seen:
                continue
            if item.size > budget:
                break
            seen.add(item.key)
            budget -= item.size
            out.append(item.key)
        return out


class ShallowFirst(PrefetchPolicy):
    """Shallow chunks of every queued request before deep ones (module docstring)."""

    name = "shallow"

    def __init__(self, max_depth: int | None = None) -> None:
        if max_depth is not None and (isinstance(max_depth, bool)
                                      or not isinstance(max_depth, int) or max_depth < 0):
            raise PolicyError(f"max_depth must be an int >= 0 or None, got {max_depth!r}")
        self.max_depth = max_depth

    def hints(self, upcoming: Sequence[Item], budget: int) -> list[Hashable]:
        first: dict[Hashable, tuple[int, int, Item]] = {}
        for pos, item in enumerate(upcoming):
            if item.key not in first and (self.max_depth is None
                                          or item.depth <= self.max_depth):
                first[item.key] = (item.depth, pos, item)
        out: list[Hashable] = []
        for _, _, item in sorted(first.values(), key=lambda e: (e[0], e[1])):
            if item.size <= budget:
                budget -= item.size
                out.append(item.key)
        return out


_PREFETCH: dict[str, type[PrefetchPolicy]] = {"queue": QueueOrder, "shallow": ShallowFirst}


def make_prefetch(spec: str) -> PrefetchPolicy:
    """A prefetch policy from its spec: ``"queue"`` or ``"shallow(max_depth=8)"``."""
    return build(spec, _PREFETCH, "prefetch")


def available_prefetch() -> list[str]:
    return sorted(_PREFETCH)
