"""When each fault of a block arrives: a fault model's errors over a block's life, in time.

A ``faultmodels`` model answers "what does a read see after ``h`` hours?" (:meth:`sample`).
A store over days needs more: the errors present at *every* age of one block, consistently,
so that a scrub at age 10 h and a read at age 30 h see the same faults plus the ones that
arrived in between. :func:`draw_timeline` gives that: it draws a block's events up to a
horizon ``H`` and gives each one its arrival time, so the errors present at age ``a`` are
the events with time <= ``a``.

For every event class of the model (each is Poisson with mean ``mu(h)`` or binomial over
units with probability ``p(h)``, both non-decreasing in ``h``), the number of events by
``H`` is drawn from the class's law at ``H``, and each event's time from the distribution
``mu(t) / mu(H)`` (``p(t) / p(H)``), by inverting it on a grid. The count of events with
time <= ``a`` is then exactly Poisson(``mu(a)``) (thinning) or Binomial(units, ``p(a)``), for
every ``a`` at once: the same marginals as ``sample(nbytes, a)``. Classes whose mean is
already positive at age 0 (latent faults present before the write) put that share of their
events at time 0. Each event is realized alone (one unit: its sector, its line, its bits);
two events of a binomial class may then hit the same unit, which only merges their errors.

Transient events (link errors) apply to the first read after their time, not to the stored
record. A class with no count law (the beta-binomial raw bits of NAND without device ECC)
cannot be put in time: :class:`TimelineError`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from rkv.errors import ConfigError

#: Ages at which the classes' cumulative means are evaluated (the inverse is linear between
#: them), log-spaced from ``horizon / 10**GRID_DECADES`` to the horizon, plus 0.
GRID_POINTS = 96
GRID_DECADES = 6


class TimelineError(ConfigError):
    """The model has a class whose events cannot be put in time."""


@dataclass(frozen=True)
class TimedEvent:
    """One fault of a block: its arrival (hours after the write) and its errors."""

    hours: float
    pattern: Any            # faultmodels.ErrorPattern


@dataclass(frozen=True)
class _ClassTimes:
    law: str
    grid: np.ndarray        # ages (hours), increasing, grid[0] = 0
    cum: np.ndarray         # mu(age) (Poisson) or p(age) (binomial), non-decreasing
    units: int
    index: int


def _grid(horizon: float) -> np.ndarray:
    ages = horizon * np.logspace(-GRID_DECADES, 0, GRID_POINTS)
    return np.concatenate([[0.0], ages])


_CACHE: dict[tuple[str, int, float], tuple[_ClassTimes, ...]] = {}


def _class_times(key: str, model: Any, nbytes: int, horizon: float) -> tuple[_ClassTimes, ...]:
    """Per class of ``model`` (keyed by its parameters), its cumulative mean on the grid."""
    hit = _CACHE.get((key, nbytes, horizon))
    if hit is not None:
        return hit
    grid = _grid(horizon)
    per_age = [model.event_classes(nbytes, float(t)) for t in grid]
    top = per_age[-1]
    out = []
    for i, c in enumerate(top):
        if c.law not in ("poisson", "binomial"):
            raise TimelineError(
                f"{getattr(model, 'name', model)}: event class "
                f"{c.rate.label or c.rate.kind!r} has no count law, so its faults cannot be "
                "put in time (use device ECC, or a model of Poisson/binomial classes)")
        cum = []
        for classes in per_age:
            same = [x for x in classes if x.rate.label == c.rate.label and x.law == c.law]
            if len(classes) == len(top):
                x = classes[i]
            elif len(same) == 1:
                x = same[0]
            else:       # a class absent at this age has had no events yet
                cum.append(0.0)
                continue
            cum.append(x.mu if c.law == "poisson" else x.p)
        arr = np.maximum.accumulate(np.asarray(cum, dtype=np.float64))
        out.append(_ClassTimes(c.law, grid, arr, c.units, i))
    if len(_CACHE) >= 64:
        _CACHE.clear()
    _CACHE[(key, nbytes, horizon)] = got = tuple(out)
    return got


def _times(ct: _ClassTimes, k: int, rng: np.random.Generator) -> np.ndarray:
    """``k`` arrival times from ``cum(t) / cum(H)``."""
    u = rng.random(k) * ct.cum[-1]
    return np.asarray(np.interp(u, ct.cum, ct.grid, left=0.0), dtype=np.float64)


def draw_timeline(model: Any, nbytes: int, horizon_hours: float, rng: np.random.Generator
                  ) -> list[TimedEvent]:
    """The faults a block of ``nbytes`` bytes meets in its first ``horizon_hours`` after a
    write, each with its arrival time, sorted by time."""
    if not (isinstance(horizon_hours, int | float) and 0 < horizon_hours < math.inf):
        raise ConfigError(f"horizon_hours must be a positive number, got {horizon_hours!r}")
    key = json.dumps(model.params(), sort_keys=True, default=str)
    classes = model.event_classes(nbytes, float(horizon_hours))
    events: list[TimedEvent] = []
    for ct in _class_times(key, model, int(nbytes), float(horizon_hours)):
        c = classes[ct.index]
        if ct.cum[-1] <= 0.0 or c.realize is None:
            continue
        k = int(rng.poisson(ct.cum[-1]) if ct.law == "poisson"
                else rng.binomial(ct.units, min(1.0, ct.cum[-1])))
        if k == 0:
            continue
        for t in _times(ct, k, rng):
            events.append(TimedEvent(float(t), c.realize(1, rng)))
    events.sort(key=lambda e: e.hours)
    return events


def present(events: list[TimedEvent], age_hours: float) -> list[TimedEvent]:
    """The events that have arrived by ``age_hours``."""
    return [e for e in events if e.hours <= age_hours]
