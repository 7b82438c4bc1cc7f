"""What the store counts per tier and model, and what it knows of each tier's availability.

:class:`Tally` holds this session's counters keyed by ``(counter, tier, model)`` (model: the
first 12 hex digits of the model's fingerprint; ``""`` where a count has no model, such as a
scrub's); :class:`TierWatch` keeps each tier's last seen state and logs a change of it (a tier
going down, coming back, found damaged) at WARNING, once per change. Both live on the
:class:`~rkv.store.core.StoreCore` and are read by ``stats()`` (and so by the Prometheus
exporter, :mod:`rkv.store.metrics`): there is one set of counters.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from typing import Any

log = logging.getLogger("rkv.store")

__all__ = ["DOWN_STATES", "Tally", "TierWatch", "model_label"]

#: Tier states (``Tier.state``) that mean the tier cannot be used.
DOWN_STATES = frozenset({"damaged", "missing"})


def model_label(fingerprint: bytes) -> str:
    """A model's short label: the first 12 hex digits of its fingerprint."""
    return fingerprint.hex()[:12]


class Tally:
    """Per-tier, per-model session counters (cheap: a dict update under a lock)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[tuple[str, str, str]] = Counter()
        #: The last scrub pass of this session: when it ended (ns, the engine's clock), the
        #: blocks it planned to read and read, whether it was stopped early; or None.
        self.last_scrub: dict[str, Any] | None = None

    def add(self, counts: Counter[tuple[str, str, str]]) -> None:
        """Add ``counts`` keyed ``(counter, tier, model)``."""
        if counts:
            with self._lock:
                self._counts.update(counts)

    def scrubbed(self, at_ns: int, total: int, scanned: int, interrupted: bool) -> None:
        """A scrub pass ended at ``at_ns`` having read ``scanned`` of ``total`` blocks."""
        with self._lock:
            self.last_scrub = {"at_ns": at_ns, "blocks": total, "scanned": scanned,
                               "interrupted": interrupted}

    def nested(self) -> dict[str, dict[str, dict[str, int]]]:
        """``{tier: {model: {counter: n}}}`` (a tier-less count is under tier ``""``)."""
        with self._lock:
            items = list(self._counts.items())
        out: dict[str, dict[str, dict[str, int]]] = {}
        for (name, tier, model), n in items:
            out.setdefault(tier, {}).setdefault(model, {})[name] = n
        return out


class TierWatch:
    """Each tier's availability as this process last saw it, with one WARNING log line per
    change. A failed call (:meth:`failed`) takes a tier as down until a call to it succeeds
    (:meth:`succeeded`); a polled state (:meth:`observe`: a tier's ``state``) of
    ``"damaged"`` does too, and a polled ``"ok"`` brings back only a tier that the poll
    itself took down (a remote tier reads ``"ok"`` again as soon as its retry delay ends,
    before anything has reached it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._down: dict[str, tuple[str, str]] = {}    # tier -> (how: "call"/"state", why)
        self.changes = 0

    def failed(self, tier: str, why: str) -> None:
        """A call to ``tier`` failed with a typed unavailability (``why``)."""
        self._mark(tier, "call", why)

    def succeeded(self, tier: str) -> None:
        """A call to ``tier`` got an answer."""
        with self._lock:
            was = self._down.pop(tier, None)
            if was is not None:
                self.changes += 1
        if was is not None:
            log.warning("tier %s is available again (it was down: %s)", tier, was[1])

    def observe(self, tier: str, state: str, why: str | None = None) -> None:
        """The tier's polled ``state``: ``"damaged"`` and ``"missing"`` (a tier that could not
        be opened) are down (``why``: what is known of it); ``"ok"`` and ``"new"`` (created
        empty at open) are not."""
        if state in DOWN_STATES:
            self._mark(tier, "state", why or f"state {state}")
            return
        with self._lock:
            was = self._down.get(tier)
            if was is None or was[0] != "state":
                return
            del self._down[tier]
            self.changes += 1
        log.warning("tier %s is available again (it was: %s)", tier, was[1])

    def _mark(self, tier: str, how: str, why: str) -> None:
        with self._lock:
            if tier in self._down:
                return
            self._down[tier] = (how, why)
            self.changes += 1
        log.warning("tier %s is unavailable: %s", tier, why)

    def down(self) -> dict[str, str]:
        """The tiers taken as down, with why."""
        with self._lock:
            return {t: why for t, (_, why) in self._down.items()}

    def summary(self, tiers: list[str]) -> dict[str, Any]:
        """``{tier: 1 or 0}`` availability of ``tiers``, and the reasons of those down."""
        down = self.down()
        return {"available": {t: int(t not in down) for t in tiers}, "down": down,
                "changes": self.changes}
