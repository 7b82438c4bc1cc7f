"""Shared implementation of the detection-only codecs: data followed by a fixed-size digest."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

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
    uncorrectable,
)
from rkv.errors import CorruptRecordError


class DigestCodec(Codec):
    """``encode(data) = data || digest(data)`` (little-endian); decode: clean or uncorrectable."""

    digest_size: ClassVar[int]

    @staticmethod
    @abstractmethod
    def digest(data: U8) -> int:
        """The checksum of ``data`` as an unsigned integer of ``digest_size`` bytes."""

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> Codec:
        check_keys(cfg, cls.codec_id, ())
        return cls()

    def get_config(self) -> dict[str, Any]:
        return {"id": self.codec_id}

    def encode(self, data: BytesLike) -> bytes:
        d = as_u8(data)
        return b"".join((d.data, self.encode_tail(d)))

    def encode_tail(self, data: U8) -> bytes:
        return self.digest(data).to_bytes(self.digest_size, "little")

    def encoded_size(self, n: int) -> int:
        if n < 0:
            raise ValueError("negative size")
        return n + self.digest_size

    def data_size(self, encoded_n: int) -> int:
        if encoded_n < self.digest_size:
            raise CorruptRecordError(
                f"{self.codec_id}: {encoded_n} bytes is shorter than the "
                f"{self.digest_size}-byte checksum"
            )
        return encoded_n - self.digest_size

    def systematic_data(self, buf: BytesLike) -> U8:
        b = as_u8(buf)
        return b[: self.data_size(b.shape[0])]

    def units(self, data_bytes: int) -> Units:
        """One check over the data; a wrong block passes with P = 2^-(8 digest_size)."""
        return Units("detect", 1, data_bytes, 0, 8, data_bytes,
                     miss=2.0 ** -(8 * self.digest_size))

    def decode(self, buf: BytesLike, erasures: Iterable[int] | None = None) -> DecodeResult:
        b = as_u8(buf)
        size = self.data_size(b.shape[0])
        normalize_erasures(erasures, b.shape[0])  # validated; a checksum cannot use them
        stored = int.from_bytes(b[size:].tobytes(), "little")
        if self.digest(b[:size]) != stored:
            return uncorrectable(f"{self.codec_id} checksum mismatch")
        return clean(b[:size].tobytes())
