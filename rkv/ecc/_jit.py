"""A typed wrapper around ``numba.njit`` so that mypy (strict) keeps kernel signatures.

Every kernel in :mod:`rkv.ecc` is compiled lazily on its first call and cached on disk
(``cache=True``), so a process pays the compile cost once per machine, not once per run.
Kernels take only 1-D/2-D C-contiguous arrays of a fixed dtype and ``int`` scalars, so each
compiles to exactly one specialisation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

import numba

F = TypeVar("F", bound=Callable[..., Any])


def jit(fn: F) -> F:
    """Compile ``fn`` with numba in nopython mode, cached on disk, GIL released."""
    return cast(F, numba.njit(cache=True, nogil=True)(fn))


def jit_inline(fn: F) -> F:
    """Like :func:`jit`, for small helpers that must be inlined into their callers."""
    return cast(F, numba.njit(cache=True, nogil=True, inline="always")(fn))
