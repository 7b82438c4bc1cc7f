"""The identity codec: no protection at all (``none``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from rkv.ecc.base import (
    U8,
    BytesLike,
    Codec,
    DecodeResult,
    Units,
    as_u8,
    check_keys,
    clean,
    normalize_erasures,
)


class NoneCodec(Codec):
    """``encode(data) == data``; decode always reports ``clean``. Detects nothing."""

    codec_id = "none"

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> NoneCodec:
        check_keys(cfg, "none", ())
        return cls()

    def get_config(self) -> dict[str, Any]:
        return {"id": "none"}

    def encode(self, data: BytesLike) -> bytes:
        return as_u8(data).tobytes()

    def encode_tail(self, data: U8) -> bytes:
        return b""

    def decode(self, buf: BytesLike, erasures: Iterable[int] | None = None) -> DecodeResult:
        b = as_u8(buf)
        normalize_erasures(erasures, b.shape[0])
        return clean(b.tobytes())

    def encoded_size(self, n: int) -> int:
        if n < 0:
            raise ValueError("negative size")
        return n

    def data_size(self, encoded_n: int) -> int:
        return encoded_n

    def systematic_data(self, buf: BytesLike) -> U8:
        return as_u8(buf)

    def units(self, data_bytes: int) -> Units:
        """No check of its own (rkv's end-to-end checksum is all there is)."""
        return Units("detect", 1, data_bytes, 0, 8, data_bytes)
