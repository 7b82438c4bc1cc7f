"""The store's clock: ns since the Unix epoch (UTC), stamped on every record written.

The engine's clock (:attr:`rkv.store.engine.Engine.clock`) is settable, so a simulation may
run it faster or fake it; :func:`now_ns` checks what it returns before it becomes a write
time.
"""

from __future__ import annotations

from collections.abc import Callable

from rkv.errors import InputError

#: Ns since the epoch (settable on the engine: fake or fast time in tests and campaigns).
Clock = Callable[[], int]


def now_ns(clock: Clock) -> int:
    """``clock()`` checked: an int in 1 .. 2**64 - 1 (0 means "unknown" in a record), else
    InputError rather than a write time that reads back as something else."""
    t = clock()
    if type(t) is not int or not 0 < t < 1 << 64:
        raise InputError(f"the engine clock returned {t!r}: it must be ns since the epoch, "
                         "a positive int below 2**64")
    return t
