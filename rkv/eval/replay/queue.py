"""The scheduler's queue in a replay: what a serving engine knows of the requests to come.

A replay with a look-ahead models a scheduler that has requests waiting: their cached
blocks are not evicted (and with several tiers they are prefetched). The queue is given
either as a request count (``256``: the next 256 requests of the trace, whatever their
arrival times) or as a time (``75s``: every request that arrives within 75 seconds of the
one being served, which is the queue of an engine whose requests wait 75 s). A count fixes
the queue's length; a time lets it follow the arrival rate, which is how a real engine's
queue behaves under bursts and lulls.

:meth:`Lookahead.ends` turns either into one array the drivers share: while request ``r``
is served the queue holds requests ``r + 1 .. ends[r] - 1``. ``ends`` never decreases, so a
request joins the queue once and leaves it when it is served.
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from rkv.errors import ConfigError

#: ``256`` (requests) or ``75s`` / ``1.5min`` / ``500ms`` (time), nothing else.
_TEXT = re.compile(r"^\s*([0-9]{1,12}(?:\.[0-9]{1,9})?)\s*(ms|s|min)?\s*$")
_UNIT_SECONDS = {"ms": 1e-3, "s": 1.0, "min": 60.0}
#: The longest time window accepted (a day): longer says the trace is queued whole.
MAX_WINDOW_S = 86_400.0


@dataclass(frozen=True)
class Lookahead:
    """A replay's queue: the next ``requests`` requests, or every request arriving within
    ``seconds`` of the one being served. Both 0: no queue."""

    requests: int = 0
    seconds: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.requests, bool) or not isinstance(self.requests, int) \
                or self.requests < 0:
            raise ConfigError(f"a look-ahead in requests must be a whole number >= 0, got "
                              f"{self.requests!r}")
        s = self.seconds
        if isinstance(s, bool) or not isinstance(s, int | float) or not math.isfinite(s) \
                or not 0 <= s <= MAX_WINDOW_S:
            raise ConfigError(f"a look-ahead in seconds must be in [0, {MAX_WINDOW_S:g}], "
                              f"got {s!r}")
        if self.requests and s:
            raise ConfigError("a look-ahead is a request count or a time, not both")

    def __bool__(self) -> bool:
        return bool(self.requests or self.seconds)

    @property
    def text(self) -> str:
        """``"256"``, ``"75s"``, or ``""`` for no queue (as the results' labels show it)."""
        if self.seconds:
            return f"{self.seconds:g}s"
        return str(self.requests) if self.requests else ""

    def ends(self, n: int, times: Sequence[float] = ()) -> list[int]:
        """For each request ``r`` of a trace of ``n`` requests whose arrival times (seconds)
        are ``times`` (a time window needs them), the end (exclusive) of the queue while
        ``r`` is served: it holds ``r + 1 .. ends[r] - 1``.

        A time window takes the requests after ``r`` up to the first that arrives more than
        ``seconds`` after ``r`` (times that step back count as the latest time before them),
        so the result never decreases and each request is queued once."""
        if not self:
            return [r + 1 for r in range(n)]
        if self.requests:
            return [min(r + 1 + self.requests, n) for r in range(n)]
        if len(times) != n:
            raise ConfigError("a look-ahead in seconds needs the trace's arrival times")
        # An access log's times may step back; a running maximum keeps them in order (a
        # request logged later cannot have been queued earlier), which bisect needs.
        clock: list[float] = []
        latest = -math.inf
        for t in times:
            latest = max(latest, t)
            clock.append(latest)
        out: list[int] = []
        for r in range(n):
            out.append(bisect.bisect_right(clock, clock[r] + self.seconds, lo=r + 1))
        return out


def parse_lookahead(value: object) -> Lookahead:
    """A :class:`Lookahead` from a count (``256``, ``"256"``), a time (``"75s"``, ``"500ms"``,
    ``"2min"``) or a :class:`Lookahead`; anything else is a :class:`ConfigError`."""
    if isinstance(value, Lookahead):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return Lookahead(requests=value)
    if isinstance(value, str):
        m = _TEXT.match(value)
        if m is not None:
            number, unit = m.group(1), m.group(2)
            if unit is None:
                if "." not in number:
                    return Lookahead(requests=int(number))
            else:
                return Lookahead(seconds=float(number) * _UNIT_SECONDS[unit])
    raise ConfigError(f"a look-ahead is a request count (256) or a time (75s, 500ms, 2min), "
                      f"got {value!r}")


def queue_lengths(ends: Sequence[int]) -> list[int]:
    """Requests queued while each request is served (for reporting a time window)."""
    return [e - r - 1 for r, e in enumerate(ends)]


class Pins(dict[Hashable, int]):
    """Protected keys with their multiplicity (a block may be in several queued requests,
    and in the request under way as well). ``in`` stays a plain dict lookup, done in C:
    policies test it for every key they step over, and with a long queue most of the cache
    is pinned."""

    def add(self, key: Hashable) -> None:
        self[key] = self.get(key, 0) + 1

    def add_all(self, keys: Sequence[Hashable]) -> None:
        get = self.get
        for key in keys:
            self[key] = get(key, 0) + 1

    def drop_all(self, keys: Sequence[Hashable]) -> None:
        for key in keys:
            n = self[key] - 1
            if n:
                self[key] = n
            else:
                del self[key]
