"""Expected reads and residency of a stored object, learned from the events policies see.

:class:`ReuseEstimator` is fed exactly what an :class:`~policies.base.EvictionPolicy` is told
(``on_insert(item, now)``, ``on_access(key, hit, now)``, ``on_remove(key, reason, now)``;
removals also carry ``now`` here, since residency is a time) and estimates, per *cell* (the
item's ``tier`` and a bucket of its ``depth``, by default depths 0, 1, 2-3, 4-7 and 8+):

* **reuse**: the expected number of hits an object gets while it lives in that tier
  (reads per residency);
* **residency**: the expected time from its insert into the tier to its removal from it,
  in the caller's units of ``now`` (seconds in the engine).

**How: Little's law on decayed totals.** For a population in steady state, mean residency =
mean occupancy / departure rate, and reads per residency = read rate / departure rate, for
*any* distribution of lifetimes. Per cell the estimator keeps three totals: the exposure
(the integral over time of the number of objects alive in the cell), the hits they received
and the departures (every removal, whatever its reason: eviction, demotion, promotion,
deletion or damage all end the object's stay in the tier). Then::

    residency = exposure / departures        reuse = hits / departures

Objects still alive are counted as they go (their exposure and hits so far), so nothing has
to wait for a lifetime to end and long-lived objects are not dropped: that is how censoring
is handled. Totals decay geometrically: at each departure in a cell the earlier totals are
multiplied by ``1 - decay`` (default 1/256), so the estimate follows the last few hundred
departures of that cell and tracks a workload shift within about ``1 / decay`` of them. The
clock of the decay is departures, not time, so no time scale has to be guessed.

**Bias.** Exact in steady state (up to a relative ``decay / 2`` from when between departures
it is asked). While a cell *fills* (more inserts than departures: a cold cache, or a tier
that has not started evicting) both estimates are too high, since the exposure of the
filling phase is divided by the few departures seen so far; while it *drains* they are too
low. Hits are counted for objects the estimator saw inserted only (an estimator started on a
populated cache learns from the objects inserted after it started, the rest are ignored
until they leave, see :meth:`forget`). A hit is credited to every tier holding the key.

**Trust.** A cell answers ``None`` until its decayed departure count reaches ``min_obs``
(default 32); the caller then uses its own default. Misses carry no information about stored
objects and are ignored. Never reads a clock; a ``now`` earlier than one given before counts
as that latest time (events reported late).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from itertools import pairwise

from policies.base import Item, PolicyError, Reason

#: Default depth buckets: the lower bound of each (0, 1, 2-3, 4-7, 8+).
DEPTH_BUCKETS = (0, 1, 2, 4, 8)


@dataclass(frozen=True, slots=True)
class Estimate:
    """What one cell says: expected ``reuse`` (hits per stay) and ``residency`` (in the
    caller's time units), and ``weight``, the decayed number of departures behind them."""

    reuse: float
    residency: float
    weight: float


class _Cell:
    """Totals of one (tier, depth bucket): see the module docstring."""

    __slots__ = ("alive", "departures", "exposure", "hits", "open_exposure", "open_hits", "t")

    def __init__(self, now: float) -> None:
        self.alive = 0               # objects in the cell now
        self.t = now                 # time the open exposure was last advanced to
        self.exposure = 0.0          # decayed totals, up to the last departure
        self.hits = 0.0
        self.departures = 0.0
        self.open_exposure = 0.0     # since the last departure (not yet decayed)
        self.open_hits = 0.0

    def advance(self, now: float) -> None:
        if now > self.t:
            self.open_exposure += self.alive * (now - self.t)
            self.t = now

    def depart(self, now: float, keep: float) -> None:
        self.advance(now)
        self.exposure = self.exposure * keep + self.open_exposure
        self.hits = self.hits * keep + self.open_hits
        self.departures = self.departures * keep + 1.0
        self.open_exposure = self.open_hits = 0.0
        self.alive -= 1

    def estimate(self, now: float) -> Estimate:
        exposure = self.exposure + self.open_exposure + self.alive * max(0.0, now - self.t)
        d = self.departures
        return Estimate((self.hits + self.open_hits) / d, exposure / d, d)


class ReuseEstimator:
    """Expected hits per stay and stay length per (tier, depth bucket); see the module
    docstring. ``buckets``: increasing lower bounds of the depth buckets, the first 0.
    ``decay``: weight lost by earlier totals at each departure, in (0, 1). ``min_obs``:
    decayed departures a cell needs before it answers (at most ``1 / decay``, the most a
    cell ever holds)."""

    def __init__(self, buckets: Sequence[int] = DEPTH_BUCKETS, decay: float = 1 / 256,
                 min_obs: float = 32.0) -> None:
        b = tuple(buckets)
        if (not b or b[0] != 0 or any(isinstance(x, bool) or not isinstance(x, int) for x in b)
                or any(x >= y for x, y in pairwise(b))):
            raise PolicyError(f"buckets must be increasing ints starting at 0, got {buckets!r}")
        if not 0.0 < decay < 1.0:
            raise PolicyError(f"decay must be in (0, 1), got {decay!r}")
        if not 1.0 <= min_obs <= 1.0 / decay:
            raise PolicyError(f"min_obs must be in [1, 1/decay], got {min_obs!r}")
        self.buckets, self.decay, self.min_obs = b, float(decay), float(min_obs)
        self._keep = 1.0 - self.decay
        self._cells: dict[tuple[str, int], _Cell] = {}
        self._alive: dict[Hashable, dict[str, _Cell]] = {}
        self.now = float("-inf")     # the latest time the caller gave

    # -- buckets -------------------------------------------------------------------------------
    def bucket(self, depth: int) -> int:
        """The index of the bucket holding ``depth`` (negative depths count as 0)."""
        return max(0, bisect_right(self.buckets, depth) - 1)

    def label(self, index: int) -> str:
        """A bucket's name: ``"0"``, ``"2-3"``, ``"8+"``."""
        lo = self.buckets[index]
        if index + 1 == len(self.buckets):
            return f"{lo}+"
        hi = self.buckets[index + 1] - 1
        return str(lo) if hi == lo else f"{lo}-{hi}"

    # -- told ----------------------------------------------------------------------------------
    def _tick(self, now: float) -> float:
        """``now``, never earlier than a time given before (events may come late)."""
        if now > self.now:
            self.now = now
        return self.now

    def on_insert(self, item: Item, now: float) -> None:
        """``item`` entered ``item.tier`` (a key already there stays, its stay goes on)."""
        now = self._tick(now)
        lives = self._alive.setdefault(item.key, {})
        if item.tier in lives:
            return
        ck = (item.tier, self.bucket(item.depth))
        cell = self._cells.get(ck)
        if cell is None:
            cell = self._cells[ck] = _Cell(now)
        cell.advance(now)
        cell.alive += 1
        lives[item.tier] = cell

    def on_access(self, key: Hashable, hit: bool, now: float) -> None:
        """A request for ``key``: a hit counts one read in every tier holding it."""
        self._tick(now)
        if hit:
            for cell in self._alive.get(key, {}).values():
                cell.open_hits += 1.0

    def on_remove(self, key: Hashable, reason: Reason, now: float,
                  tier: str | None = None) -> None:
        """``key`` left ``tier`` (None: every tier): its stay there ends, whatever the
        ``reason``. Keys the estimator never saw inserted are ignored."""
        now = self._tick(now)
        for cell in self._stop(key, tier):
            cell.depart(now, self._keep)

    def forget(self, key: Hashable, tier: str | None = None) -> None:
        """Stop following ``key`` without a departure (the caller lost track of it: its
        exposure so far stays counted, a small upward bias)."""
        for cell in self._stop(key, tier):
            cell.advance(self.now)
            cell.alive -= 1

    def _stop(self, key: Hashable, tier: str | None) -> list[_Cell]:
        """The cells of ``key``'s stays in ``tier`` (None: every tier), no longer followed."""
        lives = self._alive.get(key)
        if not lives:
            return []
        names = [tier] if tier is not None else list(lives)
        cells = [c for c in (lives.pop(n, None) for n in names) if c is not None]
        if not lives:
            del self._alive[key]
        return cells

    def retain(self, keep: Callable[[Hashable, str], bool]) -> int:
        """Forget every (key, tier) for which ``keep`` is false (after the caller rebuilt
        its view of what is stored); returns how many were forgotten."""
        gone = [(k, t) for k, lives in self._alive.items() for t in lives if not keep(k, t)]
        for k, t in gone:
            self.forget(k, t)
        return len(gone)

    # -- asked ---------------------------------------------------------------------------------
    def estimate(self, tier: str, depth: int, now: float | None = None) -> Estimate | None:
        """The cell's estimate at ``now`` (default: the latest time given), or None when it
        has fewer than ``min_obs`` decayed departures."""
        cell = self._cells.get((tier, self.bucket(depth)))
        if cell is None or cell.departures < self.min_obs:
            return None
        return cell.estimate(self.now if now is None else now)

    def snapshot(self, now: float | None = None) -> dict[str, dict[str, dict[str, float | None]]]:
        """Per tier and bucket label: ``reuse`` and ``residency`` (None: not trusted yet),
        ``weight`` (decayed departures) and ``alive``."""
        at = self.now if now is None else now
        out: dict[str, dict[str, dict[str, float | None]]] = {}
        for (tier, b), cell in sorted(list(self._cells.items())):
            row: dict[str, float | None] = {"reuse": None, "residency": None,
                                            "weight": round(cell.departures, 2),
                                            "alive": float(cell.alive)}
            if cell.departures >= self.min_obs:
                e = cell.estimate(at)
                row["reuse"], row["residency"] = e.reuse, e.residency
            out.setdefault(tier, {})[self.label(b)] = row
        return out

    def __len__(self) -> int:
        """Keys followed (alive in at least one tier)."""
        return len(self._alive)
