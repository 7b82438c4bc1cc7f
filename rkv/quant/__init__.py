"""KV-cache quantization codecs for rkv blocks ``[2, tokens, kv_heads, head_dim]``.

Quantizers (``get_quantizer(spec)``):

* ``none`` (also ``kivi(bits=16)``): identity, the block's raw bytes.
* ``kivi(bits=2|4|8, group=32)``: KIVI asymmetric min/max quantization, keys per channel
  (groups of ``group`` tokens), values per token (groups of ``min(group, head_dim)``
  elements); bit-packed codes and three checksummed copies of the scales and zero points.
* ``rowq(bits=8|4)``: symmetric per-row int8/int4 for weight matrices (the MoE adapter's
  experts, docs/moe.md): one float32 scale per row of the last dimension.

See ``docs/quantization.md`` for the scheme, the byte layout, error bounds and speed.
"""

from __future__ import annotations

from rkv.quant.base import CLEAN, CORRECTED, QuantDecodeResult, Quantizer
from rkv.quant.kivi import KiviLayout, KiviQuantizer
from rkv.quant.none import NoneQuantizer
from rkv.quant.registry import (
    available_quantizers,
    get_quantizer,
    parse_spec,
    quantizer_class,
    register_quantizer,
)
from rkv.quant.rowq import RowQuantizer

for _cls in (NoneQuantizer, KiviQuantizer, RowQuantizer):
    register_quantizer(_cls)
del _cls

__all__ = [
    "CLEAN",
    "CORRECTED",
    "KiviLayout",
    "KiviQuantizer",
    "NoneQuantizer",
    "QuantDecodeResult",
    "Quantizer",
    "RowQuantizer",
    "available_quantizers",
    "get_quantizer",
    "parse_spec",
    "quantizer_class",
    "register_quantizer",
]
