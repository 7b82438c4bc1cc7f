"""Policies by name: ``make_policy("s3fifo(small=0.1)", capacity)``.

A spec is a registered name, optionally followed by keyword arguments in parentheses whose
values are Python literals (numbers, strings, booleans). Parameters are validated once, by
the policy's constructor; an unknown name or argument raises :class:`PolicyError`.

The lookup side of :mod:`policies.table`: this module imports every built-in policy (each
registers itself there on import), so a lookup always sees them. ``register``, ``parse_spec``
and ``build`` are :mod:`policies.table`'s, here too for callers that import them from here.
"""

from __future__ import annotations

from policies.base import EvictionPolicy, PolicyError
from policies.table import REGISTERED, build, parse_spec, register

# The built-in policies, imported in their registration order.
from policies.arc import ARC  # isort: skip
from policies.fifo import FIFO  # isort: skip
from policies.lfu import LFU  # isort: skip
from policies.gdsf import GDSF  # isort: skip
from policies.lru import LRU  # isort: skip
from policies.prefix import PrefixAware  # isort: skip
from policies.reuse import ReusePredicting  # isort: skip
from policies.adaptive import Adaptive  # isort: skip
from policies.s3fifo import S3FIFO  # isort: skip
from policies.sieve import SIEVE  # isort: skip
from policies.slru import SLRU  # isort: skip
from policies.activation import ActivationAware  # isort: skip

#: The built-in eviction policies, in registration order.
BUILTIN: tuple[type[EvictionPolicy], ...] = (
    ARC, FIFO, LFU, GDSF, LRU, PrefixAware, ReusePredicting, Adaptive, S3FIFO, SIEVE, SLRU,
    ActivationAware)

__all__ = ["BUILTIN", "available", "build", "make_policy", "parse_spec", "register"]


def make_policy(spec: str, capacity: int) -> EvictionPolicy:
    """A fresh eviction policy from its spec, for a cache of ``capacity`` bytes."""
    name, params = parse_spec(spec)
    cls = REGISTERED.get(name)
    if cls is None:
        raise PolicyError(f"unknown policy {name!r} (known: {', '.join(available())})")
    try:
        return cls(capacity, **params)  # type: ignore[call-arg]
    except TypeError as exc:
        raise PolicyError(f"bad parameters for policy {name!r}: {exc}") from exc


def available() -> list[str]:
    """The registered eviction policies' names, sorted."""
    return sorted(REGISTERED)
