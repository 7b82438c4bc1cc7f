"""The identity quantizer (``none``, also ``kivi(bits=16)``): the block's raw bytes."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from rkv.errors import ConfigError, CorruptRecordError
from rkv.format.dtypes import DTYPES, numpy_dtype
from rkv.quant.base import (
    CLEAN,
    BytesLike,
    QuantDecodeResult,
    Quantizer,
    as_u8,
    check_block,
    check_keys,
    check_shape,
    dtype_name,
)


class NoneQuantizer(Quantizer):
    """``encode(x) == x.tobytes()`` (C order, native little-endian). Lossless; stores any
    value, NaN and Inf included."""

    codec_id = "none"
    bits = 16

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> NoneQuantizer:
        check_keys(cfg, "none", ("bits",))
        if "bits" in cfg and (isinstance(cfg["bits"], bool) or cfg["bits"] != 16):
            raise ConfigError(f"none: bits must be 16 if given, got {cfg['bits']!r}")
        return cls()

    def get_config(self) -> dict[str, Any]:
        return {"id": "none"}

    @property
    def lossless(self) -> bool:
        return True

    def encode(self, block: npt.NDArray[Any]) -> bytes:
        arr, _ = check_block(block)
        return arr.tobytes()

    def decode_result(
        self, buf: BytesLike, shape: Iterable[int], dtype: str | np.dtype[Any]
    ) -> QuantDecodeResult:
        dims = check_shape(shape)
        dt = numpy_dtype(dtype_name(dtype))
        b = as_u8(buf)
        want = self.encoded_size(dims, dt)
        if b.shape[0] != want:
            raise CorruptRecordError(
                f"none: {b.shape[0]} bytes cannot hold a {dt.name} block of shape "
                f"{list(dims)} ({want} bytes)"
            )
        return QuantDecodeResult(b.view(dt).reshape(dims).copy(), CLEAN)

    def encoded_size(self, shape: Iterable[int], dtype: str | np.dtype[Any]) -> int:
        dims = check_shape(shape)
        return int(np.prod(dims)) * DTYPES[dtype_name(dtype)].itemsize
