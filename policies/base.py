"""The policy interfaces: eviction, admission and prefetch over opaque keys with metadata.

One implementation serves two users: the KV engine (keys are chunk keys, ``group`` the prefix
chain, ``depth`` the chunk position, ``parent`` the previous chunk) and the MoE adapter (keys
are experts, ``group`` the layer). Policies never import ``rkv``.

The contract that makes a policy usable by a storage engine:

* **Told, never asked to guess.** The caller reports every insert, every access (hits *and*
  misses, so ghost lists work), and every removal with its reason.
* **Asking has no side effects.** :meth:`EvictionPolicy.victims` only reads policy state: the
  caller may ask, decide not to act (a write that fails, a speculative plan) and ask again.
  Policies with a "second chance" step (CLOCK, SIEVE, S3-FIFO) therefore plan their hand
  movement on a copy of what they would change, and apply it in :meth:`on_remove`.
* **All or nothing.** ``victims(need, protected)`` returns keys whose sizes add up to at least
  ``need`` bytes, none of them in ``protected``, or ``None`` when that is impossible; the
  caller then removes them (and reports each with :meth:`on_remove`). Callers ask through
  :func:`checked_victims`, the one check of this contract.
* **Time is the caller's.** ``now`` is a monotonic number chosen by the caller (seconds, or
  the index of the reference in a trace); policies never read a clock.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Container, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import filterfalse


class PolicyError(ValueError):
    """A policy was misused (unknown key, duplicate insert) or misconfigured."""


class Reason(enum.Enum):
    """Why an object left a cache."""

    EVICTED = "evicted"            # chosen by victims() and dropped
    DEMOTED = "demoted"            # chosen by victims() and moved to a lower tier
    DELETED = "deleted"            # removed by the user
    UNCORRECTABLE = "uncorrectable"  # its data was found damaged
    PROMOTED = "promoted"          # moved to a faster tier


@dataclass(frozen=True, slots=True)
class Item:
    """An object a policy manages: an opaque key and what the caller knows about it."""

    key: Hashable
    size: int = 1                  # bytes (1 for unit-size caches)
    tier: str = ""
    group: Hashable = None         # prefix chain root, request or MoE layer
    depth: int = 0                 # chunk position in its prefix, or layer index
    parent: Hashable = None        # previous chunk of the prefix chain (None: a root)
    miss_cost: float = 1.0         # seconds to recompute or load it on a miss
    priority: int = 0              # higher is kept longer by policies that use it
    deadline: float | None = None  # soft pin: kept until ``now`` passes it, if possible

    def __post_init__(self) -> None:
        if not isinstance(self.size, int) or self.size < 0:
            raise PolicyError(f"item size must be an int >= 0, got {self.size!r}")
        if not self.miss_cost >= 0:
            raise PolicyError(f"miss_cost must be >= 0, got {self.miss_cost!r}")


#: ``now`` before the caller has said anything: every deadline lies in its future.
NEVER = float("-inf")


def soft_pinned(item: Item, now: float) -> bool:
    """Whether ``item`` is soft-pinned at time ``now`` (its deadline has not passed)."""
    deadline = item.deadline
    return deadline is not None and deadline > now


def take_soft(order: Iterable[Hashable], items: Mapping[Hashable, Item], need: int,
              protected: Container[Hashable], now: float) -> list[Hashable] | None:
    """The shortest prefix of ``order`` (skipping ``protected``) that frees ``need`` bytes,
    soft-pinned keys deferred to a second pass; ``None`` if even they do not suffice.

    Walks ``order`` only as far as needed: when nothing is soft-pinned it costs what
    ``EvictionPolicy.take`` costs."""
    out: list[Hashable] = []
    if need <= 0:
        return out
    freed = 0
    deferred: list[Hashable] = []
    # Protected keys are stepped over in C (filterfalse): with a long queue most of the
    # cache can be protected, and a Python test per key made every eviction walk it slowly.
    for key in filterfalse(protected.__contains__, order):
        item = items[key]
        deadline = item.deadline
        if deadline is not None and deadline > now:
            deferred.append(key)
            continue
        out.append(key)
        freed += item.size
        if freed >= need:
            return out
    for key in deferred:
        out.append(key)
        freed += items[key].size
        if freed >= need:
            return out
    return None


class EvictionPolicy(ABC):
    """Chooses what leaves a cache of ``capacity`` bytes.

    The policy tracks the items inserted and not yet removed (``len``, ``in``, ``used``).
    ``capacity`` is the cache size the caller manages; policies that size internal queues by
    it (SLRU, ARC, S3-FIFO) use it, the others ignore it.
    """

    #: Registry name, e.g. "lru".
    name: str = ""

    def __init__(self, capacity: int) -> None:
        if not isinstance(capacity, int) or capacity < 0:
            raise PolicyError(f"capacity must be an int >= 0, got {capacity!r}")
        self.capacity = capacity
        self._items: dict[Hashable, Item] = {}
        self.used = 0
        self._now = NEVER        # the latest ``now`` the caller has given
        self._pinnable = 0       # items that carry a deadline (soft pins are possible)

    # -- told ----------------------------------------------------------------------------------
    def on_insert(self, item: Item, now: float) -> None:
        """``item`` entered the cache (after a miss, or a write)."""
        if item.key in self._items:
            raise PolicyError(f"{item.key!r} is already in the cache")
        self._items[item.key] = item
        self.used += item.size
        if now > self._now:
            self._now = now
        if item.deadline is not None:
            self._pinnable += 1
        self._insert(item, now)

    def on_access(self, key: Hashable, hit: bool, now: float, item: Item | None = None
                  ) -> None:
        """``key`` was requested; ``hit`` says whether it was in the cache. On a miss,
        ``item`` (when known) lets ghost-list policies remember its metadata."""
        if hit and key not in self._items:
            raise PolicyError(f"hit on {key!r}, which is not in the cache")
        if now > self._now:
            self._now = now
        self._access(key, hit, now, item)

    def on_remove(self, key: Hashable, reason: Reason) -> None:
        """``key`` left the cache."""
        item = self._items.pop(key, None)
        if item is None:
            raise PolicyError(f"{key!r} is not in the cache")
        self.used -= item.size
        if item.deadline is not None:
            self._pinnable -= 1
        self._remove(item, reason)

    # -- asked ---------------------------------------------------------------------------------
    @abstractmethod
    def victims(self, need: int, protected: Container[Hashable] = ()) -> list[Hashable] | None:
        """Keys to remove to free at least ``need`` bytes, none in ``protected``, in the order
        they should go; ``None`` if that is impossible. Must not change any state."""

    def admits(self, item: Item, now: float) -> bool:
        """Whether ``item`` may push others out of the full cache. Most policies leave that
        to the admission policy and say yes; one that also judges admission (``adaptive``,
        whose leading candidate may carry an admission rule) says no here. Callers ask it
        where they ask the admission policy, and admit only when both agree."""
        return True

    # -- for implementations ---------------------------------------------------------------------
    @abstractmethod
    def _insert(self, item: Item, now: float) -> None: ...

    @abstractmethod
    def _access(self, key: Hashable, hit: bool, now: float, item: Item | None) -> None: ...

    @abstractmethod
    def _remove(self, item: Item, reason: Reason) -> None: ...

    # -- inspection ----------------------------------------------------------------------------
    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def item(self, key: Hashable) -> Item:
        return self._items[key]

    def keys(self) -> Iterator[Hashable]:
        return iter(self._items)

    def __iter__(self) -> Iterator[Hashable]:
        return iter(self._items)

    @staticmethod
    def take(order: Iterator[Hashable], sizes: dict[Hashable, Item], need: int,
             protected: Container[Hashable]) -> list[Hashable] | None:
        """Helper: the shortest prefix of ``order`` (skipping protected keys) that frees
        ``need`` bytes, or None."""
        out: list[Hashable] = []
        freed = 0
        if need <= 0:
            return out
        for key in filterfalse(protected.__contains__, order):   # in C, as in take_soft
            out.append(key)
            freed += sizes[key].size
            if freed >= need:
                return out
        return None


def checked_victims(policy: EvictionPolicy, need: int, protected: Container[Hashable] = (),
                    where: str = "the cache") -> list[Hashable] | None:
    """``policy.victims(need, protected)`` held to the contract; what it answered (``None``
    when it cannot free ``need`` bytes without a protected key).

    Every caller that acts on victims asks through this function, so a policy that breaks
    the contract is caught before anything is removed, with a :class:`PolicyError` naming
    the policy and ``where`` (e.g. ``"tier dram"``): a victim it does not hold (or named
    twice), a protected victim, or victims that free less than ``need`` bytes (by the sizes
    it was told). That asking had no side effects one answer cannot show: the contract tests
    check it (``tests/policies/test_policy_contract.py``). ``need`` is > 0 (with nothing to
    free the caller does not ask)."""
    items = policy._items
    out = policy.victims(need, protected)
    if out is None:
        return None
    freed = 0
    for key in out:
        try:
            freed += items[key].size
        except KeyError:
            raise _broken(policy, f"victim {key!r} is not in {where} (the policy does not "
                          "hold it)") from None
        if key in protected:
            raise _broken(policy, f"victim {key!r} in {where} is protected")
    if len(out) > 1 and len(set(out)) < len(out):
        raise _broken(policy, f"a victim in {where} is named twice")
    if freed < need:
        raise _broken(policy, f"victims free less than the {need} bytes asked for in "
                      f"{where} ({freed})")
    return out


def _broken(policy: EvictionPolicy, what: str) -> PolicyError:
    return PolicyError(f"policy {policy.name or type(policy).__name__}: {what}")


class PlannedEviction(EvictionPolicy):
    """Base for policies whose eviction procedure moves things as it goes (a hand, second
    chances): :meth:`victims` runs :meth:`_plan` on a virtual copy of that state, first without
    soft-pinned keys, then, if that cannot free enough, continuing from there with them."""

    def victims(self, need: int, protected: Container[Hashable] = ()) -> list[Hashable] | None:
        if need <= 0:
            return []
        if self._pinnable:
            out, done = self._plan(need, protected, False, ())
            if not done:  # not enough without soft-pinned keys: continue from there with them
                out, done = self._plan(need, protected, True, out)
        else:
            out, done = self._plan(need, protected, True, ())
        return out if done else None

    @abstractmethod
    def _plan(self, need: int, protected: Container[Hashable], pins_ok: bool,
              forced: Sequence[Hashable]) -> tuple[list[Hashable], bool]:
        """The keys the procedure would evict, in order, until ``need`` bytes are freed
        (True) or nothing more can go (False); the first ``len(forced)`` are ``forced``."""


class AdmissionPolicy(ABC):
    """Decides whether a new object enters a tier at all (e.g. only after a second sighting).
    Told about every access, hit or miss."""

    name: str = ""

    @abstractmethod
    def admit(self, item: Item, now: float) -> bool: ...

    def on_access(self, key: Hashable, hit: bool, now: float) -> None:  # noqa: B027
        """Optional: learn from accesses."""


class PrefetchPolicy(ABC):
    """Chooses what to promote toward a faster tier ahead of use."""

    name: str = ""

    def on_access(self, key: Hashable, hit: bool, now: float) -> None:  # noqa: B027
        """Optional: learn from accesses."""

    @abstractmethod
    def hints(self, upcoming: Sequence[Item], budget: int) -> list[Hashable]:
        """Keys to promote, most urgent first, within ``budget`` bytes, given the requests the
        caller knows are coming (a scheduler's queue; may be empty)."""
