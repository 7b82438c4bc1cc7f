"""The one table of the dtypes a KV block (or an expert's weights) may have.

Each dtype has one canonical name (what configs, model specs and record headers say), the
code a record header stores (docs/format.md), its size in bytes and its numpy and torch
types. Everything that needs any of these asks here: the record format, the quantizers,
tensor conversion, the planner's block sizes, the CLI's choices.

numpy and ml_dtypes (numpy's bfloat16) load on the first :func:`numpy_dtype` call, so that
checking a name (a model spec, a config) costs no numpy import.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rkv.errors import ConfigError

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True)
class KvDtype:
    """One dtype: its canonical name, record header code, bytes per value, torch name."""

    name: str
    code: int
    itemsize: int
    torch: str


#: By canonical name, in the order they are listed to users.
DTYPES: dict[str, KvDtype] = {d.name: d for d in (
    KvDtype("float16", 1, 2, "float16"),
    KvDtype("bfloat16", 2, 2, "bfloat16"),
    KvDtype("float32", 3, 4, "float32"),
)}
#: The canonical names.
NAMES: tuple[str, ...] = tuple(DTYPES)
#: By record header code.
BY_CODE: dict[int, KvDtype] = {d.code: d for d in DTYPES.values()}


def check_dtype(name: Any, what: str = "dtype") -> KvDtype:
    """The dtype named ``name``; a :class:`ConfigError` naming ``what`` for anything else."""
    d = DTYPES.get(name) if isinstance(name, str) else None
    if d is None:
        raise ConfigError(f"{what} must be one of {', '.join(NAMES)}, got {name!r}")
    return d


def itemsize(name: str) -> int:
    """Bytes per value of the dtype ``name`` (a KeyError for an unknown name)."""
    return DTYPES[name].itemsize


def numpy_dtype(name: str) -> np.dtype[Any]:
    """The numpy dtype of ``name`` (bfloat16 is ``ml_dtypes.bfloat16``)."""
    return _numpy_dtypes()[name]


_NUMPY: dict[str, np.dtype[Any]] = {}


def _numpy_dtypes() -> dict[str, np.dtype[Any]]:
    if not _NUMPY:
        # Imported here, not at the top, for start-up time: a name check needs no numpy.
        import ml_dtypes
        import numpy as np

        _NUMPY.update(float16=np.dtype(np.float16), bfloat16=np.dtype(ml_dtypes.bfloat16),
                      float32=np.dtype(np.float32))
        assert set(_NUMPY) == set(DTYPES)
    return _NUMPY
