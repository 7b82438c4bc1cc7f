"""The scrub schedule from the fault model: refresh age, scrub interval, P(DUE) per block-day.

For a tier's fault model, a code (a codec spec as :func:`~rkv.reliability.analytic.predict`
takes it), a block's data bytes and a target P(DUE) per block, with ``P(h)`` the P(DUE) that
``predict`` gives a block read ``h`` hours after its write:

* **Refresh age** ``R``: the largest age at which a block written once and never touched still
  reads with ``P(R) <= target``. ``P`` grows with the age (retention errors, faults
  accumulating), so ``R`` is the boundary of ``{h : P(h) <= target}``, found by a bracketing
  search over ``predict`` (below). ``inf``: the target holds for a century (`MAX_HOURS`);
  already above it at age 0 (latent faults present at the write): :class:`InfeasibleTarget`.
* **Scrub interval** ``I``: a patrol scrub reads the block every ``I`` hours, corrects it and
  rewrites it when its errors are correctable (its accumulated errors start again from zero)
  and finds latent permanent faults, so a fault waits for at most one pass, ``I / 2`` on
  average (Little's law, a uniform phase): a scrubbed block sees each interval as a fresh
  block of age ``I`` whose latent window is ``min(latent_hours, I / 2)``. ``I`` is the largest
  interval with ``P_I(I) <= target`` for that model. Without latent faults ``P_I = P`` and
  ``I = R``: the scrub must come before the block reaches its refresh age, and a scrub earlier
  than that buys nothing in this model (``predict`` ignores combinations of several
  individually correctable clustered events, so only background bit errors and the latent
  window make ``P`` grow faster than linearly); with latent faults ``I >= R``.
* **P(DUE) per block-day**: the stored data's risk. A block read after ``T`` hours fails
  with ``P(T)``, of which ``P0`` = ``P`` at age 0 without latent faults is what any read pays
  (transient errors of one read: the CXL link), scrubbed or not (reported as
  ``p_due_per_read``; a scrub read that sees one reads again); the rest, spread over the
  ``T / 24`` days, is ``1 - (1 - (P(T) - P0))^(24 / T)``. Unscrubbed: a block kept
  ``horizon`` hours (default a year) under the model's own latent window. Scrubbed every
  ``T = min(I, horizon)``: each interval adds ``P(T)`` without latent faults (the scrub that
  rewrites the block has just read its memory, so only new faults count), and the write
  itself the latent faults of memory last scrubbed ``T / 2`` ago on average, once over the
  horizon. (The interval is judged by its worst case, the first interval with its latent
  window; the per-day figure by the average.)

The search: ``P`` is close to a power law in the age (linear for Poisson fault classes, steep
for NAND retention past the device ECC), so the bracket ``[lo, hi]`` (``P(lo) <= target <
P(hi)``) is found by extrapolating from ``P(1 h)`` and refined by secant steps in log-log space,
each followed by a probe ``rel_tol`` beyond it on the other side, with a bisection whenever a
step did not halve the bracket; it stops when ``hi <= lo (1 + rel_tol)`` and returns ``lo``,
so ``P(result) <= target < P(result (1 + rel_tol))`` by construction. ``predict`` takes seconds
(the fatality of clustered classes is sampled), so its values are memoized per (model
parameters, code, data bytes, hours); a schedule costs a handful of calls.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from rkv.checks import as_float, as_int
from rkv.errors import ConfigError

__all__ = [
    "DEFAULT_BLOCK_BYTES",
    "DEFAULT_HORIZON_HOURS",
    "MAX_HOURS",
    "InfeasibleTarget",
    "ScrubSchedule",
    "check_target",
    "p_due",
    "per_day",
    "refresh_age",
    "schedule",
    "scrub_interval",
]

#: A SmolLM2-135M block: K and V of 256 tokens x 3 KV heads x 64 dims in float16.
DEFAULT_BLOCK_BYTES = 2 * 256 * 3 * 64 * 2
DEFAULT_HORIZON_HOURS = 8766.0
#: Beyond a century a refresh age or scrub interval is reported as never needed (inf).
MAX_HOURS = 100 * 8766.0
#: The shortest age searched (one second): a boundary below it is infeasible.
MIN_HOURS = 1.0 / 3600.0
DEFAULT_REL_TOL = 1e-3
_MAX_EVALS = 80


class InfeasibleTarget(ConfigError):
    """The target P(DUE) is exceeded already at age 0 (latent faults present at the write)."""


def check_target(target: Any) -> float:
    """``target`` as a float if it is a probability in (0, 1), else :class:`ConfigError`."""
    if isinstance(target, bool) or not isinstance(target, int | float) or not (
            0.0 < float(target) < 1.0):
        raise ConfigError(f"target P(DUE) per block must be a number in (0, 1), got {target!r}")
    return float(target)


# -- memoized predict ----------------------------------------------------------------------------

_CACHE: dict[tuple[str, str, int, float], float] = {}
_CACHE_MAX = 4096


def as_model(model: Any) -> Any:
    """A fault model, or a preset name (``"nvme-tlc"``) or parameter table made into one;
    anything else is a ConfigError (not an AttributeError deep in the search)."""
    import faultmodels

    if isinstance(model, faultmodels.FaultModel):
        return model
    if isinstance(model, str | dict):
        try:
            return faultmodels.get_model(model)
        except faultmodels.FaultModelError as exc:
            raise ConfigError(f"fault model: {exc}") from exc
    raise ConfigError(f"fault model must be a FaultModel, a preset name or a table, got "
                      f"{type(model).__name__}")


def _model_key(model: Any) -> str:
    return json.dumps(model.params(), sort_keys=True, default=str)


def p_due(model: Any, code: str, data_bytes: int, hours: float) -> float:
    """``predict(code, data_bytes, model, hours, exact_counts=True).p_due``, memoized."""
    model = as_model(model)
    from rkv.reliability.analytic import predict

    key = (_model_key(model), code, int(data_bytes), float(hours))
    got = _CACHE.get(key)
    if got is None:
        got = float(predict(code, data_bytes, model, hours, exact_counts=True).p_due)
        if len(_CACHE) >= _CACHE_MAX:
            _CACHE.clear()
        _CACHE[key] = got
    return got


def per_day(p: float, hours: float) -> float:
    """P(DUE) per block-day of a block that fails with ``p`` when read after ``hours``:
    ``1 - (1 - p)^(24 / hours)`` (accurate for tiny ``p``)."""
    if p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    return -math.expm1(24.0 / hours * math.log1p(-p))


# -- the boundary search ----------------------------------------------------------------------


def _boundary(f: Callable[[float], float], target: float, rel_tol: float,
              max_hours: float) -> float:
    """sup {h in [0, max_hours] : f(h) <= target} for a non-decreasing ``f``: the ``lo`` of a
    bracket with ``f(lo) <= target < f(hi)``, ``hi <= lo (1 + rel_tol)``; ``inf`` when
    ``f(max_hours) <= target``; `MIN_HOURS` when ``f`` passes the target before it."""
    if f(0.0) > target:
        raise InfeasibleTarget(f"P(DUE) {f(0.0):.3g} exceeds the target {target:g} already "
                               "at age 0")
    evals = 0

    def at(h: float) -> float:
        nonlocal evals
        evals += 1
        return f(h)

    x = min(1.0, max_hours)
    px = at(x)
    if px <= target:  # expand upwards
        lo, plo = x, px
        while True:
            step = 1e3 if plo <= 0.0 else min(max(target / plo, 2.0), 1e4)
            x = min(lo * step, max_hours)
            px = at(x)
            if px > target:
                hi, phi = x, px
                break
            lo, plo = x, px
            if x >= max_hours:
                return math.inf
    else:  # expand downwards
        hi, phi = x, px
        while True:
            x = max(hi * min(max(target / phi, 1e-4), 0.5), MIN_HOURS)
            px = at(x)
            if px <= target:
                lo, plo = x, px
                break
            hi, phi = x, px
            if x <= MIN_HOURS:
                raise InfeasibleTarget(f"P(DUE) {px:.3g} exceeds the target {target:g} within "
                                       "one second of the write")
    bisect = False
    while hi > lo * (1.0 + rel_tol) and evals < _MAX_EVALS:
        width = math.log(hi / lo)
        secant = not bisect and plo > 0.0 and phi > plo
        if secant:
            t = (math.log(target) - math.log(plo)) / (math.log(phi) - math.log(plo))
            x = lo * math.exp(t * width)
        else:
            x = math.sqrt(lo * hi)
        x = min(max(x, lo * (1.0 + rel_tol / 2)), hi / (1.0 + rel_tol / 2))
        px = at(x)
        if px <= target:
            lo, plo = x, px
            probe = x * (1.0 + rel_tol)
        else:
            hi, phi = x, px
            probe = x / (1.0 + rel_tol)
        if secant and lo < probe < hi:
            pp = at(probe)
            if pp <= target:
                lo, plo = probe, pp
            else:
                hi, phi = probe, pp
        bisect = math.log(hi / lo) > 0.5 * width
    return lo


def refresh_age(model: Any, code: str, data_bytes: int, target: float, *,
                rel_tol: float = DEFAULT_REL_TOL, max_hours: float = MAX_HOURS) -> float:
    """Hours after its write at which a never-touched block still reads with
    P(DUE) <= ``target`` (the largest such age, within ``rel_tol``); ``inf`` if the target
    holds for ``max_hours``; :class:`InfeasibleTarget` if it fails at age 0 (or within a
    second)."""
    model = as_model(model)
    target = check_target(target)

    def f(h: float) -> float:
        return p_due(model, code, data_bytes, h)

    return _boundary(f, target, rel_tol, max_hours)


def _scrubbed_model(model: Any, interval: float) -> Any:
    lat = float(getattr(model, "latent_hours", 0.0))
    if lat <= 0.0:
        return model
    return model.with_latent_hours(min(lat, interval / 2.0))


def scrub_interval(model: Any, code: str, data_bytes: int, target: float, *,
                   rel_tol: float = DEFAULT_REL_TOL, max_hours: float = MAX_HOURS) -> float:
    """The longest patrol interval at which a scrubbed block keeps P(DUE) <= ``target`` per
    interval: a fresh block of age ``I`` whose latent window is ``min(latent_hours, I / 2)``;
    ``inf`` if the target holds for ``max_hours``."""
    model = as_model(model)
    target = check_target(target)

    def f(h: float) -> float:
        return p_due(_scrubbed_model(model, h), code, data_bytes, h)

    return _boundary(f, target, rel_tol, max_hours)


@dataclass(frozen=True)
class ScrubSchedule:
    """The schedule for one (model, code, block size, target).

    ``refresh_hours``: the refresh age (``inf``: never needed; 0: the target fails at age 0,
    see ``note``). ``scrub_hours``: the patrol interval (``inf``: never needed; 0: no
    interval meets the target, see ``note``).
    ``p_due_per_block_day_scrubbed``: scrubbing every ``min(scrub_hours, horizon_hours)``
    (the unscrubbed figure when no interval meets the target);
    ``p_due_per_block_day_unscrubbed``: a block kept ``horizon_hours`` without a scrub.
    ``latent_hours``: the model's own latent window (the scrub bounds it by half its interval).
    ``p_due_per_read``: the transient part every read pays (not in the per-day figures).
    """

    model: str
    code: str
    data_bytes: int
    target: float
    refresh_hours: float
    scrub_hours: float
    p_due_per_block_day_scrubbed: float
    p_due_per_block_day_unscrubbed: float
    horizon_hours: float
    latent_hours: float
    p_due_per_read: float = 0.0
    note: str = ""

    @property
    def feasible(self) -> bool:
        """Whether a scrubbed block meets the target (a positive interval exists)."""
        return self.scrub_hours > 0.0

    def to_dict(self) -> dict[str, Any]:
        return {k: (None if isinstance(v, float) and math.isinf(v) else v)
                for k, v in asdict(self).items()}


def model_label(model: Any) -> str:
    """A short name for a model: its preset-like name (``model.name``) and latent window."""
    lat = float(getattr(model, "latent_hours", 0.0))
    return str(getattr(model, "name", type(model).__name__)) + (
        f" (latent {lat:g} h)" if lat > 0 else "")


def schedule(model: Any, code: str, data_bytes: int, target: float, *,
             horizon_hours: float = DEFAULT_HORIZON_HOURS, rel_tol: float = DEFAULT_REL_TOL,
             max_hours: float = MAX_HOURS, name: str | None = None) -> ScrubSchedule:
    """Refresh age, scrub interval and P(DUE) per block-day with and without scrubbing for
    a block of ``data_bytes`` under ``code`` in a tier with fault ``model`` (a
    :class:`faultmodels.FaultModel`, or a preset name / spec for ``faultmodels.get_model``).
    Never raises :class:`InfeasibleTarget`: a refresh age or interval that fails at age 0
    is 0, with a ``note``."""
    import faultmodels

    target = check_target(target)
    as_int(data_bytes, "data_bytes", lo=1)
    horizon = as_float(horizon_hours, "horizon_hours", lo=0, lo_open=True)
    if not isinstance(model, faultmodels.FaultModel):
        label = name or str(model)
        model = as_model(model)
    else:
        label = name or model_label(model)
    notes: list[str] = []

    def boundary(fn: Callable[..., float], why: str) -> float:
        """``fn``'s age, or 0 with a note when the target fails at age 0."""
        try:
            return fn(model, code, data_bytes, target, rel_tol=rel_tol, max_hours=max_hours)
        except InfeasibleTarget as exc:
            notes.append(f"{why}: {exc}")
            return 0.0

    refresh = boundary(refresh_age, "unscrubbed")
    interval = boundary(scrub_interval, "no scrub interval meets the target")
    p0 = p_due(_scrubbed_model(model, 0.0), code, data_bytes, 0.0)
    unscrubbed = per_day(max(p_due(model, code, data_bytes, horizon) - p0, 0.0), horizon)
    if interval > 0.0:
        t_scrub = min(interval, horizon)
        scrubbed = per_day(
            max(p_due(_scrubbed_model(model, 0.0), code, data_bytes, t_scrub) - p0, 0.0),
            t_scrub)
        at_write = _scrubbed_model(model, t_scrub)
        if at_write.latent_hours > 0.0:
            scrubbed += per_day(max(p_due(at_write, code, data_bytes, 0.0) - p0, 0.0), horizon)
    else:  # even a fresh block misses the target: scrubbing cannot help
        scrubbed = unscrubbed
    note = "; ".join(notes)
    return ScrubSchedule(label, code, data_bytes, target, refresh, interval, scrubbed,
                         unscrubbed, horizon, float(getattr(model, "latent_hours", 0.0)), p0,
                         note)
