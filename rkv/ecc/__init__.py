"""Error-detecting and error-correcting codes for rkv records.

Codecs (``get_codec(spec)``; all systematic, data first and unchanged in the encoding):

* ``none``: identity, detects nothing.
* ``xxh3`` / ``crc32c``: data + 64-bit XXH3 / CRC-32C, detection only.
* ``rs(n,k[,interleave=I])``: Reed-Solomon over GF(2^8); corrects ``(n-k)//2`` byte errors
  per codeword (with erasures: ``2e + f <= n-k``), bursts of ``I*(n-k)//2`` bytes.
* ``bch(m=M,t=T[,chunk_bytes=C])``: binary BCH over GF(2^M); corrects ``T`` bit errors per
  chunk (parity identical to bchlib / the Linux kernel).
* ``shardrs(k=K,m=M[,checksum=xxh3|crc32c])``: RS across ``K`` data + ``M`` parity shards,
  each with a checksum; rebuilds up to ``M`` lost shards.
* ``planes(high=CODE,low=CODE[,tolerant=1])``: the high and low byte planes of the values
  under their own codes; a tolerant low plane that fails reads back as ``degraded``. For a
  quantized block the same spec becomes ``qplanes(meta=CODE,codes=CODE,...)``: the
  quantizer's metadata strict, its packed codes tolerant (bound per block by the pipeline).

See ``docs/ecc.md`` for guarantees, layouts, performance and how to choose.
"""

from __future__ import annotations

from rkv.ecc.base import CLEAN, CORRECTED, UNCORRECTABLE, Codec, DecodeResult, as_u8
from rkv.ecc.bch import BCHCodec
from rkv.ecc.crc32c import Crc32cCodec
from rkv.ecc.none import NoneCodec
from rkv.ecc.planes import PlanesCodec
from rkv.ecc.qplanes import QuantPlanesCodec
from rkv.ecc.registry import available_codecs, codec_class, get_codec, parse_spec, register_codec
from rkv.ecc.rs import RSCodec
from rkv.ecc.shardrs import ShardRSCodec
from rkv.ecc.xxh3 import Xxh3Codec

for _cls in (NoneCodec, Xxh3Codec, Crc32cCodec, RSCodec, BCHCodec, ShardRSCodec,
             PlanesCodec, QuantPlanesCodec):
    register_codec(_cls)
del _cls

__all__ = [
    "CLEAN",
    "CORRECTED",
    "UNCORRECTABLE",
    "BCHCodec",
    "Codec",
    "Crc32cCodec",
    "DecodeResult",
    "NoneCodec",
    "PlanesCodec",
    "QuantPlanesCodec",
    "RSCodec",
    "ShardRSCodec",
    "Xxh3Codec",
    "as_u8",
    "available_codecs",
    "codec_class",
    "get_codec",
    "parse_spec",
    "register_codec",
]
