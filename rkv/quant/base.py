"""The interface shared by every KV-cache quantizer in rkv.

A :class:`Quantizer` turns one KV block, a numpy array shaped ``[2, tokens, kv_heads,
head_dim]`` (index 0 = keys, 1 = values) of dtype float16, bfloat16 (``ml_dtypes.bfloat16``) or
float32, into a byte string and back. The encoded length is a pure function of the shape, the
dtype and the quantizer's configuration (:meth:`Quantizer.encoded_size`); the caller keeps the
shape, dtype and config (rkv stores them in the record header) and passes them to
:meth:`Quantizer.decode`.

Errors: a bad block (shape, dtype, NaN / Inf where the quantizer needs finite values) is a
:class:`~rkv.errors.ShapeError`; a bad configuration a :class:`~rkv.errors.ConfigError`; an
encoded buffer that cannot be decoded (impossible length, unrecoverable metadata) a
:class:`~rkv.errors.CorruptRecordError`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import numpy.typing as npt

from rkv.buffers import as_u8 as as_u8  # re-exported for the kernels
from rkv.buffers import readonly as readonly
from rkv.errors import ShapeError
from rkv.format.dtypes import DTYPES, NAMES
from rkv.specs import Configured
from rkv.specs import check_keys as check_keys  # re-exported for the implementations
from rkv.specs import int_param as int_param

U8 = npt.NDArray[np.uint8]
BytesLike = bytes | bytearray | memoryview | npt.NDArray[Any]
Shape = tuple[int, int, int, int]
Status = Literal["clean", "corrected"]

CLEAN: Status = "clean"
CORRECTED: Status = "corrected"


_MAX_DIM = (1 << 32) - 1


@dataclass(frozen=True)
class QuantDecodeResult:
    """The outcome of :meth:`Quantizer.decode_result`.

    ``array`` is the dequantized block. ``status`` is ``"clean"`` when the encoding needed no
    repair and ``"corrected"`` when damaged metadata was repaired from its other copies;
    ``detail`` says what was repaired (empty when clean).
    """

    array: npt.NDArray[Any]
    status: Status
    detail: str = ""


# ---------------------------------------------------------------------- validation helpers
def dtype_name(dtype: str | np.dtype[Any] | type) -> str:
    """The canonical name (``float16``, ``bfloat16``, ``float32``) of a block dtype."""
    if isinstance(dtype, str):
        name = dtype
    else:
        try:
            name = np.dtype(dtype).name
        except TypeError:
            name = repr(dtype)
    if name not in DTYPES:
        raise ShapeError(
            f"unsupported KV dtype {name!r}; expected one of {', '.join(NAMES)}"
        )
    return name


def check_shape(shape: Iterable[int]) -> Shape:
    """``shape`` as a validated ``(2, tokens, kv_heads, head_dim)`` tuple."""
    try:
        raw = tuple(shape)
    except TypeError as exc:
        raise ShapeError(f"a KV block shape must be a tuple of integers, got {shape!r}") from exc
    if not all(isinstance(d, int | np.integer) and not isinstance(d, bool) for d in raw):
        raise ShapeError(f"a KV block shape must be a tuple of integers, got {shape!r}")
    dims = tuple(int(d) for d in raw)
    if len(dims) != 4 or dims[0] != 2:
        raise ShapeError(
            f"a KV block has shape [2, tokens, kv_heads, head_dim], got {list(dims)}"
        )
    if min(dims) < 1 or max(dims) > _MAX_DIM:
        raise ShapeError(f"KV block dimensions must lie in [1, 2**32), got {list(dims)}")
    return dims  # type: ignore[return-value]


def check_block(block: Any) -> tuple[npt.NDArray[Any], str]:
    """A C-contiguous, aligned, native-endian array of a valid block, and its dtype name."""
    if not isinstance(block, np.ndarray):
        raise ShapeError(f"a KV block must be a numpy array, got {type(block).__name__}")
    name = dtype_name(block.dtype)
    check_shape(block.shape)
    arr = np.ascontiguousarray(block)
    if not arr.dtype.isnative:  # big-endian input: the stored layout is little-endian
        arr = arr.astype(arr.dtype.newbyteorder("="))
    if not arr.flags.aligned:
        arr = arr.copy()
    return arr, name


class Quantizer(Configured, ABC):
    """Base class of every quantizer. Subclasses are immutable and compare equal by config."""

    codec_id: ClassVar[str]
    #: parameter names that a string spec may give positionally, e.g. ``kivi(4)``
    positional: ClassVar[tuple[str, ...]] = ()
    #: bits per stored element (16: not quantized); for KV blocks the keys' bits
    bits: int

    @property
    def widths(self) -> tuple[int, int]:
        """(key bits, value bits) of a KV block (equal unless the quantizer splits them)."""
        return self.bits, self.bits

    @abstractmethod
    def encode(self, block: npt.NDArray[Any]) -> bytes:
        """Encode a block ``[2, tokens, kv_heads, head_dim]``; raises ``ShapeError``."""

    def decode(
        self, buf: BytesLike, shape: Iterable[int], dtype: str | np.dtype[Any]
    ) -> npt.NDArray[Any]:
        """The block (a new array of ``shape`` and ``dtype``) from an encoded buffer.

        Raises :class:`~rkv.errors.CorruptRecordError` if ``len(buf)`` is impossible for this
        shape, dtype and config, or if the buffer's metadata cannot be recovered.
        """
        return self.decode_result(buf, shape, dtype).array

    @abstractmethod
    def decode_result(
        self, buf: BytesLike, shape: Iterable[int], dtype: str | np.dtype[Any]
    ) -> QuantDecodeResult:
        """Like :meth:`decode`, and says whether damaged metadata was repaired."""

    @abstractmethod
    def encoded_size(self, shape: Iterable[int], dtype: str | np.dtype[Any]) -> int:
        """Exact length of the encoding of a block of ``shape`` and ``dtype``."""

    def bits_per_element(self, shape: Iterable[int], dtype: str | np.dtype[Any]) -> float:
        """Encoded bits per block element, everything included."""
        dims = check_shape(shape)
        return 8.0 * self.encoded_size(dims, dtype) / float(np.prod(dims))

    def tolerant_span(self, shape: Iterable[int], dtype: str | np.dtype[Any]
                      ) -> tuple[int, int, int] | None:
        """``(start, end, total)``: the bytes ``[start, end)`` of the ``total``-byte encoding
        of a block of ``shape`` and ``dtype`` where *any* content still decodes within the
        quantizer's bounds (packed codes), so they may be read back unverified; every other
        byte (metadata) must be exact. None (the default): no such bytes."""
        return None

    @property
    def lossless(self) -> bool:
        """True when ``decode(encode(x))`` always equals ``x``."""
        return False

    # ---------------------------------------------------------------- config
    @abstractmethod
    def get_config(self) -> dict[str, Any]:
        """A JSON-able dict, including ``"id"``, that :func:`rkv.quant.get_quantizer` accepts."""

    @classmethod
    @abstractmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> Quantizer:
        """Build a quantizer from a config dict; raises :class:`~rkv.errors.ConfigError`."""
