"""Detection-only codec ``xxh3``: the data followed by its 64-bit XXH3 hash (little-endian)."""

from __future__ import annotations

import xxhash

from rkv.ecc._checksum import DigestCodec
from rkv.ecc.base import U8


class Xxh3Codec(DigestCodec):
    """Appends ``xxh3_64(data)`` (seed 0). Detects corruption with probability ``1 - 2^-64``."""

    codec_id = "xxh3"
    digest_size = 8

    @staticmethod
    def digest(data: U8) -> int:
        return int(xxhash.xxh3_64_intdigest(data.data))
