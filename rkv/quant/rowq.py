"""Per-row symmetric integer quantization for weights: ``rowq(bits=8|4)``.

KIVI (:mod:`rkv.quant.kivi`) groups a KV block by token and channel; weight matrices want one
scale per row instead. A block ``[2, a, b, c]`` is read as ``2*a*b`` rows of ``c`` values (the
MoE adapter stores an expert's matrices as rows of ``d_model`` values, docs/moe.md). For each
row with largest magnitude ``m``:

* scale ``s = m / qmax`` in float32, ``qmax = 2**(bits-1) - 1`` (127 or 7);
* code ``q = clamp(rint(x / s), -qmax, qmax)`` (float32 arithmetic, ties to even; a zero row
  has ``s = 0`` and all codes 0);
* decoded ``x^ = q * s`` in float32, rounded to nearest even into the block's dtype (float16
  first clamped to +-65504). Hence ``|x - x^| <= s / 2`` up to float32 rounding, plus half a
  unit in the last place of the output dtype.

Inputs must be finite (``ShapeError`` otherwise).

Encoded layout (little-endian; ``R`` rows of ``C`` values)::

    0   4  magic b"RKVW"          4  1  layout version (1)      5  1  bits (4 or 8)
    6   1  dtype code             7  1  reserved, 0             8  4  R, u32     12  4  C, u32
    16     scales, R x float32
    16+4R  codes, C order: int8 (8 bits), or two's-complement nibbles (4 bits), element ``i``
           in the low nibble of byte ``i // 2`` when ``i`` is even; a final odd nibble is 0

The metadata is not replicated: in a record, the end-to-end checksum covers these bytes and
the record's ECC protects them, so a damaged encoding never reaches :meth:`decode`.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from rkv.errors import ConfigError, CorruptRecordError, ShapeError
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
    int_param,
)

MAGIC = b"RKVW"
VERSION = 1
BITS = (4, 8)
_HEADER = struct.Struct("<4sBBBBII")
_F16_MAX = float(np.finfo(np.float16).max)


def _rows(shape: tuple[int, int, int, int]) -> tuple[int, int]:
    return 2 * shape[1] * shape[2], shape[3]


class RowQuantizer(Quantizer):
    """Symmetric per-row quantization (module docstring)."""

    codec_id = "rowq"
    positional = ("bits",)

    def __init__(self, bits: int = 8) -> None:
        if isinstance(bits, bool) or bits not in BITS:
            raise ConfigError(f"rowq: bits must be 4 or 8, got {bits!r}")
        self.bits = bits

    @property
    def qmax(self) -> int:
        return (1 << (self.bits - 1)) - 1

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> Quantizer:
        check_keys(cfg, "rowq", ("bits",))
        bits = int_param(cfg, "rowq", "bits", lo=1, hi=16, default=8)
        if bits == 16:
            from rkv.quant.none import NoneQuantizer

            return NoneQuantizer()
        return cls(bits)

    def get_config(self) -> dict[str, Any]:
        return {"id": "rowq", "bits": self.bits}

    def encoded_size(self, shape: Iterable[int], dtype: str | np.dtype[Any]) -> int:
        dims = check_shape(shape)
        dtype_name(dtype)
        rows, cols = _rows(dims)
        return _HEADER.size + 4 * rows + -(-rows * cols * self.bits // 8)

    def encode(self, block: npt.NDArray[Any]) -> bytes:
        arr, name = check_block(block)
        rows, cols = _rows(arr.shape)  # type: ignore[arg-type]
        x = arr.astype(np.float32).reshape(rows, cols)
        if not np.isfinite(x).all():
            raise ShapeError("rowq: the block holds NaN or Inf values")
        amax = np.abs(x).max(axis=1) if cols else np.zeros(rows, np.float32)
        scale = (amax / np.float32(self.qmax)).astype(np.float32)
        safe = np.where(scale > 0, scale, np.float32(1.0)).astype(np.float32)
        q = np.clip(np.rint(x / safe[:, None]), -self.qmax, self.qmax).astype(np.int8)
        codes = q.reshape(-1)
        if self.bits == 4:
            nib = (codes.astype(np.uint8) & 0x0F)
            if nib.size % 2:
                nib = np.concatenate([nib, np.zeros(1, np.uint8)])
            packed = (nib[0::2] | (nib[1::2] << 4)).astype(np.uint8)
        else:
            packed = codes.view(np.uint8)
        head = _HEADER.pack(MAGIC, VERSION, self.bits, DTYPES[name].code, 0, rows, cols)
        return bytes(head + scale.astype("<f4").tobytes() + packed.tobytes())

    def decode_result(
        self, buf: BytesLike, shape: Iterable[int], dtype: str | np.dtype[Any]
    ) -> QuantDecodeResult:
        dims = check_shape(shape)
        name = dtype_name(dtype)
        b = as_u8(buf)
        want = self.encoded_size(dims, name)
        if b.shape[0] != want:
            raise CorruptRecordError(f"rowq: {b.shape[0]} bytes cannot hold a {name} block of "
                                     f"shape {list(dims)} ({want} bytes)")
        rows, cols = _rows(dims)
        magic, version, bits, dcode, _, r, c = _HEADER.unpack_from(b.tobytes()[:_HEADER.size])
        if (magic != MAGIC or version != VERSION or bits != self.bits
                or dcode != DTYPES[name].code or (r, c) != (rows, cols)):
            raise CorruptRecordError("rowq: the encoding's header does not match the block")
        off = _HEADER.size
        scale = b[off:off + 4 * rows].view("<f4").astype(np.float32)
        packed = b[off + 4 * rows:]
        n = rows * cols
        if self.bits == 4:
            nib = np.empty(2 * packed.size, dtype=np.uint8)
            nib[0::2] = packed & 0x0F
            nib[1::2] = packed >> 4
            codes = nib[:n].astype(np.int8)
            codes[codes > 7] -= 16
        else:
            codes = packed[:n].view(np.int8)
        x = codes.reshape(rows, cols).astype(np.float32) * scale[:, None]
        if name == "float16":
            x = np.clip(x, -_F16_MAX, _F16_MAX)
        return QuantDecodeResult(x.astype(numpy_dtype(name)).reshape(dims), CLEAN)
