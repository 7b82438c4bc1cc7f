"""Byte planes protected unequally: ``planes(high=rs(255,223), low=none, tolerant=1)``.

A KV value's most significant byte (for float16: sign, exponent and the top two mantissa
bits, which is exactly FP8 E5M2) decides its magnitude; its low byte only refines it. This
codec splits the data of a block of ``width``-byte little-endian values into a *high plane*
(the top ``high_bytes`` of every value) and a *low plane* (the rest), and protects each with
its own code::

    high.encode(high plane | xxh3_128(high plane) | xxh3_128(low plane)) | low.encode(low plane)

Both plane checksums ride in the high plane, under its stronger code. Decoding checks each
plane against its checksum after its decoder: the high plane is always strictly verified. With
``tolerant`` the low plane may fail (more errors than its code corrects, or no code at all):
:meth:`decode` still reports the block ``uncorrectable`` (the codec contract: never possibly
wrong data), and :meth:`decode_degraded` returns the values with the exact high plane and the
low plane as read, so each value is off by less than one unit of its high part (float16: the
value rounded to E5M2 is exact, the error is below 2^-2 of its magnitude). The read path
reports such a block as ``degraded`` (bounded numeric noise, counted) instead of a recompute.
Bytes the medium reported lost are filled with the middle of their range.

``width`` follows the block's dtype (:meth:`for_itemsize`; the pipeline sets it per block).
A quantized block has no values to cut: :meth:`for_quantized` gives the same two codes over
the quantizer's strict metadata and tolerant codes (:mod:`rkv.ecc.qplanes`), or the high code
over the whole block when the quantizer has no tolerant bytes. The shared machinery is
:mod:`rkv.ecc._twopart` (sub-codes with an exact inverse size; no nesting).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from rkv.ecc._twopart import SUM, TwoPartCodec, flag, sub_codec
from rkv.ecc.base import U8, Codec, check_keys, int_param
from rkv.ecc.qplanes import QuantPlanesCodec
from rkv.errors import ConfigError, CorruptRecordError

__all__ = ["SUM", "PlanesCodec"]


class PlanesCodec(TwoPartCodec):
    """High and low byte planes of ``width``-byte values, each under its own code."""

    codec_id = "planes"
    part_names: ClassVar[tuple[str, str]] = ("high plane", "low plane")

    def __init__(self, high: Codec, low: Codec, *, tolerant: bool = True, width: int = 2,
                 high_bytes: int | None = None) -> None:
        super().__init__(high, low, tolerant)
        cfg = {"id": "planes", "width": width,
               "high_bytes": width // 2 if high_bytes is None else high_bytes}
        self._w = int_param(cfg, "planes", "width", lo=2, hi=8)
        self._hb = int_param(cfg, "planes", "high_bytes", lo=1, hi=self._w - 1)

    # ---------------------------------------------------------------- config
    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> PlanesCodec:
        check_keys(cfg, "planes", ("high", "low", "tolerant", "width", "high_bytes"))
        width = int_param(cfg, "planes", "width", lo=2, hi=8, default=2)
        hb = int_param(cfg, "planes", "high_bytes", lo=1, hi=width - 1,
                       default=max(1, width // 2))
        return cls(sub_codec(cfg, "planes", "high"), sub_codec(cfg, "planes", "low"),
                   tolerant=flag(cfg, "planes", "tolerant", True), width=width, high_bytes=hb)

    def get_config(self) -> dict[str, Any]:
        return {"id": "planes", "high": self._high.get_config(),
                "low": self._low.get_config(), "tolerant": self._tolerant,
                "width": self._w, "high_bytes": self._hb}

    @property
    def spec(self) -> str:
        return (f"planes(high={self._high.spec},low={self._low.spec},"
                f"tolerant={int(self._tolerant)},width={self._w},high_bytes={self._hb})")

    @property
    def by_value(self) -> bool:
        return True

    def for_itemsize(self, itemsize: int) -> Codec:
        """This layout for values of ``itemsize`` bytes (the high plane keeps the top half)."""
        if itemsize == self._w:
            return self
        if itemsize < 2:
            raise ConfigError(f"planes: values of {itemsize} byte(s) have no byte planes")
        return PlanesCodec(self._high, self._low, tolerant=self._tolerant, width=itemsize,
                           high_bytes=itemsize // 2)

    def for_quantized(self, span: tuple[int, int, int] | None = None) -> Codec:
        """With the quantizer's tolerant byte span ``(start, end, total)``: the high code
        over its strict bytes, the low code over the span (:class:`QuantPlanesCodec`);
        without one, the high code over the whole block."""
        if span is None:
            return self._high
        start, end, total = span
        return QuantPlanesCodec(self._high, self._low, tolerant=self._tolerant, head=start,
                                tail=total - end)

    # ---------------------------------------------------------------- sizes
    def _sizes(self, n: int) -> tuple[int, int, int]:
        """(high plane bytes before its checksums, low plane bytes, values) for ``n``."""
        e, tail = divmod(n, self._w)
        return e * self._hb + tail, e * (self._w - self._hb), e

    def data_size(self, encoded_n: int) -> int:
        # A trailing partial value goes to the high plane, so the size is not monotonic
        # across tails (a tail can open a new codeword there); for each tail it is strictly
        # increasing in the whole values (both sub-codes are), so one bisection per tail
        # finds its data length or proves there is none.
        found = set()
        for tail in range(self._w):
            lo, hi = 0, max(0, encoded_n) // self._w + 1
            while lo < hi:
                mid = (lo + hi) // 2
                if self.encoded_size(mid * self._w + tail) < encoded_n:
                    lo = mid + 1
                else:
                    hi = mid
            if self.encoded_size(lo * self._w + tail) == encoded_n:
                found.add(lo * self._w + tail)
        if len(found) != 1:
            raise CorruptRecordError(f"{self.spec}: {encoded_n} bytes is not a valid "
                                     "encoded length" + (" (ambiguous)" if found else ""))
        return found.pop()

    @property
    def overhead(self) -> float:
        f = self._hb / self._w
        return f * self._high.overhead + (1 - f) * self._low.overhead

    # ---------------------------------------------------------------- planes
    def _split(self, data: U8) -> tuple[U8, U8]:
        e = data.size // self._w
        body = data[:e * self._w].reshape(e, self._w)
        cut = self._w - self._hb
        high = np.concatenate([body[:, cut:].reshape(-1), data[e * self._w:]])
        return high, np.ascontiguousarray(body[:, :cut]).reshape(-1)

    def _join(self, high: U8, low: U8, n: int) -> U8:
        out = np.empty(n, dtype=np.uint8)
        e = n // self._w
        cut = self._w - self._hb
        body = out[:e * self._w].reshape(e, self._w)
        body[:, cut:] = high[:e * self._hb].reshape(e, self._hb)
        body[:, :cut] = low.reshape(e, cut)
        out[e * self._w:] = high[e * self._hb:]
        return out

    def _fill_lost(self, low: U8, lost: np.ndarray) -> None:
        # A lost byte's value is unknown: the middle of the low part's range bounds the error
        # by half a unit of the high part.
        cut = self._w - self._hb
        low[lost] = np.where(lost % cut == cut - 1, 0x80, 0).astype(np.uint8)
