"""Which stage objects a spec or a record names: a tier's ``ecc`` and ``quant`` specs to a
codec and a quantizer, and a record header's codec list back to the stages that wrote it.

"No stage" is ``None`` (``"none"``, ``"fp16"``, ``"16"`` and 16-bit quantizers all fold to it).
The codec families load on first use (numba compiles their kernels), so a store whose tiers
use no code never pays for them.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from rkv.errors import ConfigError, UnknownFormatError
from rkv.format.dtypes import numpy_dtype
from rkv.format.record import RecordHeader

if TYPE_CHECKING:
    from rkv.ecc.base import Codec
    from rkv.quant import Quantizer

# Quantizer configs and ECC configs share the record's codec list: the quantizer comes first
# (array -> bytes), the ECC second (bytes -> bytes).
NO_ECC = "none"


@lru_cache(maxsize=64)
def codec_for(spec: str) -> Codec | None:
    """The codec for a tier's ``ecc`` spec; None for ``"none"`` (raw payload)."""
    if spec.strip().lower() == NO_ECC:
        return None
    from rkv.ecc import get_codec

    return get_codec(spec)


@lru_cache(maxsize=64)
def quantizer_for(spec: str) -> Quantizer | None:
    """The quantizer for a tier's ``quant`` spec; None for ``"none"`` (values as stored)."""
    if spec.strip().lower() in (NO_ECC, "fp16", "16"):
        return None
    from rkv.quant import get_quantizer

    q = get_quantizer(spec)
    return None if q.bits >= 16 else q


@lru_cache(maxsize=256)
def _stage_from_json(text: str) -> tuple[str, Any]:
    cfg = json.loads(text)
    cid = str(cfg.get("id", ""))
    try:
        from rkv.ecc import available_codecs, get_codec

        if cid in available_codecs():
            return "ecc", get_codec(cfg)
        from rkv.quant import get_quantizer

        return "quant", get_quantizer(cfg)
    except (ConfigError, ImportError) as exc:
        raise UnknownFormatError(f"record uses a codec this build cannot decode: {exc}") from exc


def header_stages(header: RecordHeader) -> tuple[Quantizer | None, Codec | None]:
    """(quantizer, ECC) a record was written with: at most one of each, quantizer first."""
    quant: Any = None
    ecc: Any = None
    for i, cfg in enumerate(header.codecs):
        kind, stage = _stage_from_json(json.dumps(cfg, sort_keys=True))
        if kind == "quant" and i == 0 and quant is None:
            quant = stage
        elif kind == "ecc" and ecc is None:
            ecc = stage
        else:
            raise UnknownFormatError(f"record codec list {list(header.codecs)} is not valid")
    return quant, ecc


def header_codec(header: RecordHeader) -> Codec | None:
    """The ECC a record was written with (None: raw payload)."""
    return header_stages(header)[1]


def block_codec(codec: Codec, quant: Quantizer | None, shape: tuple[int, ...],
                dtype: str) -> Codec:
    """The code a block of ``shape`` and ``dtype`` actually gets from ``codec``: a layout
    by value (byte planes) set to the dtype's width, or for a quantized block bound to the
    quantizer's strict metadata and tolerant codes (:meth:`rkv.ecc.base.Codec.for_quantized`,
    :meth:`rkv.quant.base.Quantizer.tolerant_span`). Other codes are returned as they are."""
    if quant is None:
        return codec.for_itemsize(numpy_dtype(dtype).itemsize)
    return codec.for_quantized(quant.tolerant_span(shape, dtype))
