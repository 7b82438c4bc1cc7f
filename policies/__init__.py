"""Caching, prefetch and admission policies over opaque keys.

Shared by the KV engine and the MoE expert-offloading adapter; never imports rkv. See
``policies.base`` for the interfaces and ``docs/policies.md`` for how to write one.
"""

from policies.base import (
    AdmissionPolicy,
    EvictionPolicy,
    Item,
    PolicyError,
    PrefetchPolicy,
    Reason,
)
from policies.registry import available, make_policy, parse_spec, register

# Built-in policies register themselves on import.
from policies import arc, fifo, gdsf, lfu, lru, prefix, s3fifo, sieve, slru  # noqa: F401  isort: skip
from policies import activation  # noqa: F401  isort: skip
from policies.admission import AdmitAfter, AdmitAll, make_admission, split_spec
from policies.estimate import Estimate, ReuseEstimator
from policies.prefetch import (
    CoOccurrence,
    QueueOrder,
    ShallowFirst,
    available_prefetch,
    make_prefetch,
)

__all__ = [
    "AdmissionPolicy",
    "AdmitAfter",
    "AdmitAll",
    "CoOccurrence",
    "Estimate",
    "EvictionPolicy",
    "Item",
    "PolicyError",
    "PrefetchPolicy",
    "QueueOrder",
    "Reason",
    "ReuseEstimator",
    "ShallowFirst",
    "available",
    "available_prefetch",
    "make_admission",
    "make_policy",
    "make_prefetch",
    "parse_spec",
    "register",
    "split_spec",
]
