"""Caching, prefetch and admission policies over opaque keys.

Shared by the KV engine and the MoE expert-offloading adapter; never imports rkv. See
``policies.base`` for the interfaces and ``docs/policies.md`` for how to write one.
"""

from policies.admission import AdmitAfter, AdmitAll, make_admission, split_spec
from policies.base import (
    AdmissionPolicy,
    EvictionPolicy,
    Item,
    PolicyError,
    PrefetchPolicy,
    Reason,
)
from policies.estimate import Estimate, ReuseEstimator
from policies.prefetch import (
    CoOccurrence,
    QueueOrder,
    ShallowFirst,
    available_prefetch,
    make_prefetch,
)
from policies.registry import available, make_policy, parse_spec, register

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
