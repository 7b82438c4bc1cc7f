"""A typed wrapper around ``numba.njit`` for the quantization kernels.

Kernels are compiled lazily on first call and cached on disk (``cache=True``). They use
numpy's error model (a float division never raises, so loops vectorize) and release the GIL.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

import numba

F = TypeVar("F", bound=Callable[..., Any])


def jit(fn: F) -> F:
    """Compile ``fn`` with numba in nopython mode, cached on disk, GIL released."""
    return cast(F, numba.njit(cache=True, nogil=True, error_model="numpy")(fn))
