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
Sub-codes must have an exact inverse size (RS, BCH, checksums, ``none``; not ``shardrs``,
whose padding makes the split point ambiguous), and planes do not nest.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import xxhash

from rkv.ecc.base import (
    CORRECTED,
    U8,
    BytesLike,
    Codec,
    DecodeResult,
    Degraded,
    Part,
    Units,
    as_u8,
    check_keys,
    clean,
    int_param,
    normalize_erasures,
    uncorrectable,
)
from rkv.errors import ConfigError, CorruptRecordError

SUM = 16                       # xxh3_128 per plane
_SUB_IDS = ("none", "xxh3", "crc32c", "rs", "bch")


def _flag(cfg: Mapping[str, Any], name: str, default: bool) -> bool:
    val = cfg.get(name, default)
    if isinstance(val, bool):
        return val
    if isinstance(val, int | np.integer) and int(val) in (0, 1):
        return bool(val)
    if isinstance(val, str) and val.strip().lower() in ("true", "false", "yes", "no"):
        return val.strip().lower() in ("true", "yes")
    raise ConfigError(f"planes: {name} must be true or false, got {val!r}")


def _sub(cfg: Mapping[str, Any], name: str) -> Codec:
    from rkv.ecc.registry import get_codec

    spec = cfg.get(name, "none")
    if not isinstance(spec, str | Mapping):
        raise ConfigError(f"planes: {name} must be a code spec, got {spec!r}")
    codec = get_codec(spec)
    if codec.codec_id not in _SUB_IDS:
        raise ConfigError(f"planes: the {name} plane's code must be one of "
                          f"{', '.join(_SUB_IDS)}, got {codec.spec}")
    return codec


class PlanesCodec(Codec):
    """High and low byte planes of ``width``-byte values, each under its own code."""

    codec_id = "planes"

    def __init__(self, high: Codec, low: Codec, *, tolerant: bool = True, width: int = 2,
                 high_bytes: int | None = None) -> None:
        self._high, self._low, self._tolerant = high, low, bool(tolerant)
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
        return cls(_sub(cfg, "high"), _sub(cfg, "low"), tolerant=_flag(cfg, "tolerant", True),
                   width=width, high_bytes=hb)

    @property
    def compute_bound(self) -> bool:
        return self._high.compute_bound or self._low.compute_bound

    def get_config(self) -> dict[str, Any]:
        return {"id": "planes", "high": self._high.get_config(),
                "low": self._low.get_config(), "tolerant": self._tolerant,
                "width": self._w, "high_bytes": self._hb}

    @property
    def spec(self) -> str:
        return (f"planes(high={self._high.spec},low={self._low.spec},"
                f"tolerant={int(self._tolerant)},width={self._w},high_bytes={self._hb})")

    @property
    def tolerant(self) -> bool:
        return self._tolerant

    @property
    def high(self) -> Codec:
        return self._high

    @property
    def low(self) -> Codec:
        return self._low

    def for_itemsize(self, itemsize: int) -> Codec:
        """This layout for values of ``itemsize`` bytes (the high plane keeps the top half)."""
        if itemsize == self._w:
            return self
        if itemsize < 2:
            raise ConfigError(f"planes: values of {itemsize} byte(s) have no byte planes")
        return PlanesCodec(self._high, self._low, tolerant=self._tolerant, width=itemsize,
                           high_bytes=itemsize // 2)

    def for_quantized(self) -> Codec:
        return self._high

    # ---------------------------------------------------------------- sizes
    def _sizes(self, n: int) -> tuple[int, int, int]:
        """(high plane bytes before its checksums, low plane bytes, values) for ``n``."""
        e, tail = divmod(n, self._w)
        return e * self._hb + tail, e * (self._w - self._hb), e

    def encoded_size(self, n: int) -> int:
        if n < 0:
            raise ValueError("negative size")
        h, lo, _ = self._sizes(n)
        return self._high.encoded_size(h + 2 * SUM) + self._low.encoded_size(lo)

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

    def parts(self, data_bytes: int) -> tuple[Part, ...]:
        h, lo, _ = self._sizes(data_bytes)
        parts = [Part(self._high, h + 2 * SUM, False)]
        if lo:
            parts.append(Part(self._low, lo, self._tolerant))
        return tuple(parts)

    def units(self, data_bytes: int) -> Units:
        raise ConfigError(f"{self.spec} is two decoding layouts: predict each of parts()")

    @property
    def overhead(self) -> float:
        f = self._hb / self._w
        return f * self._high.overhead + (1 - f) * self._low.overhead

    @property
    def t(self) -> int:
        return self._high.t

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

    def _cut(self, size: int) -> tuple[int, int, int]:
        n = self.data_size(size)
        h, _, _ = self._sizes(n)
        return n, h, self._high.encoded_size(h + 2 * SUM)

    # ---------------------------------------------------------------- coding
    def encode(self, data: BytesLike) -> bytes:
        d = as_u8(data)
        high, low = self._split(d)
        hd = np.concatenate([high, np.frombuffer(xxhash.xxh3_128_digest(high.data)
                                                 + xxhash.xxh3_128_digest(low.data),
                                                 dtype=np.uint8)])
        return self._high.encode(hd) + self._low.encode(low)

    def systematic_data(self, buf: BytesLike) -> U8 | None:
        b = as_u8(buf)
        n, h, henc = self._cut(b.size)
        hs = self._high.systematic_data(b[:henc])
        ls = self._low.systematic_data(b[henc:])
        if hs is None or ls is None:
            return None
        return self._join(hs[:h], ls[:n // self._w * (self._w - self._hb)], n)

    def _high_plane(self, b: U8, henc: int, h: int, eras: np.ndarray
                    ) -> tuple[U8, bytes, int] | DecodeResult:
        # Intact plane data passes its checksum without decoding (damaged parity alone
        # never loses a plane, as with the whole-block checksum of a single code).
        fast = self._high.systematic_data(b[:henc]) if not eras.size or eras[0] >= h + 2 * SUM \
            else None
        if fast is not None and xxhash.xxh3_128_digest(fast[:h].data) == bytes(fast[h:h + SUM]):
            return fast[:h], bytes(fast[h + SUM:h + 2 * SUM]), 0
        res = self._high.decode(b[:henc], eras[eras < henc])
        if not res.ok:
            return uncorrectable(f"high plane: {res.detail or 'uncorrectable'}")
        hd = np.frombuffer(res.data, dtype=np.uint8)
        high = hd[:h]
        if xxhash.xxh3_128_digest(high.data) != bytes(hd[h:h + SUM]):
            return uncorrectable("high plane fails its checksum (errors beyond its code)")
        return high, bytes(hd[h + SUM:h + 2 * SUM]), res.n_corrected

    def _low_plane(self, b: U8, henc: int, eras: np.ndarray, digest: bytes
                   ) -> tuple[U8 | None, int, str]:
        le = eras[eras >= henc] - henc
        fast = self._low.systematic_data(b[henc:])
        if fast is not None:
            n_low = self._low.data_size(b.size - henc)
            if (not le.size or le[0] >= n_low) and \
                    xxhash.xxh3_128_digest(fast[:n_low].data) == digest:
                return fast[:n_low], 0, ""
        res = self._low.decode(b[henc:], le)
        if not res.ok:
            return None, 0, f"low plane: {res.detail or 'uncorrectable'}"
        low = np.frombuffer(res.data, dtype=np.uint8)
        if xxhash.xxh3_128_digest(low.data) != digest:
            return None, 0, "low plane fails its checksum"
        return low, res.n_corrected, ""

    def _open(self, buf: BytesLike, erasures: Iterable[int] | None
              ) -> tuple[U8, np.ndarray, int, int, tuple[U8, bytes, int] | DecodeResult]:
        """(buffer, erasures, data bytes, high plane's encoded length, its decoding)."""
        b = as_u8(buf)
        eras = normalize_erasures(erasures, b.size)
        n, h, henc = self._cut(b.size)
        return b, eras, n, henc, self._high_plane(b, henc, h, eras)

    def decode(self, buf: BytesLike, erasures: Iterable[int] | None = None) -> DecodeResult:
        b, eras, n, henc, hi = self._open(buf, erasures)
        if isinstance(hi, DecodeResult):
            return hi
        high, digest, fixed = hi
        low, fixed_low, detail = self._low_plane(b, henc, eras, digest)
        if low is None:
            return uncorrectable(detail + (" (tolerant: readable degraded)"
                                           if self._tolerant else ""))
        data = self._join(high, low, n).tobytes()
        fixed += fixed_low
        return DecodeResult(data, CORRECTED, fixed, f"{fixed} corrected") if fixed or \
            eras.size else clean(data)

    def decode_degraded(self, buf: BytesLike, erasures: Iterable[int] | None = None
                        ) -> Degraded | None:
        """For a tolerant layout whose low plane failed: the values with the verified high
        plane and the low plane as read (lost bytes at mid-range). None when the high plane
        itself fails or the layout is not tolerant: the block is lost."""
        if not self._tolerant:
            return None
        b, eras, n, henc, hi = self._open(buf, erasures)
        if isinstance(hi, DecodeResult):
            return None
        # Called once decode() has failed on the low plane: not decoded a second time.
        high, _, fixed = hi
        cut = self._w - self._hb
        e = n // self._w
        raw = self._low.systematic_data(b[henc:])
        low = (np.zeros(e * cut, dtype=np.uint8) if raw is None
               else np.array(raw[:e * cut], dtype=np.uint8))
        lost = eras[(eras >= henc) & (eras < henc + e * cut)] - henc
        if raw is None:
            lost = np.arange(e * cut)
        # A lost byte's value is unknown: the middle of the low part's range bounds the error
        # by half a unit of the high part.
        low[lost] = np.where(lost % cut == cut - 1, 0x80, 0).astype(np.uint8)
        return Degraded(self._join(high, low, n).tobytes(), fixed, e, "low plane unverified")
