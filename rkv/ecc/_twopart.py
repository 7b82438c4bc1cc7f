"""What byte planes and quantized planes share: a block cut into a *strict* part and a
*tolerant* part, each under its own code, both checksums riding in the strict part::

    strict.encode(S | xxh3_128(S) | xxh3_128(T)) | tolerant.encode(T)

Decoding checks each part against its checksum after its decoder: the strict part is always
verified. With ``tolerant`` the tolerant part may fail (more errors than its code corrects, or
no code at all): :meth:`TwoPartCodec.decode` still reports the block ``uncorrectable`` (the
codec contract: never possibly wrong data), and :meth:`TwoPartCodec.decode_degraded` returns
the data with the strict part exact and the tolerant part as read. The subclasses say how the
data is cut (:mod:`rkv.ecc.planes`: by value; :mod:`rkv.ecc.qplanes`: by byte range) and what a
lost tolerant byte is filled with.

Sub-codes must have an exact inverse size (RS, BCH, checksums, ``none``; not ``shardrs``,
whose padding makes the split point ambiguous), and two-part layouts do not nest.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

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
    clean,
    normalize_erasures,
    uncorrectable,
)
from rkv.errors import ConfigError

SUM = 16                       # xxh3_128 per part
_SUB_IDS = ("none", "xxh3", "crc32c", "rs", "bch")


def flag(cfg: Mapping[str, Any], owner: str, name: str, default: bool) -> bool:
    """A boolean parameter (true/false, 1/0, yes/no)."""
    val = cfg.get(name, default)
    if isinstance(val, bool):
        return val
    if isinstance(val, int | np.integer) and int(val) in (0, 1):
        return bool(val)
    if isinstance(val, str) and val.strip().lower() in ("true", "false", "yes", "no"):
        return val.strip().lower() in ("true", "yes")
    raise ConfigError(f"{owner}: {name} must be true or false, got {val!r}")


def sub_codec(cfg: Mapping[str, Any], owner: str, name: str) -> Codec:
    """The sub-code ``cfg[name]`` (default ``none``), one with an exact inverse size."""
    from rkv.ecc.registry import get_codec

    spec = cfg.get(name, "none")
    if not isinstance(spec, str | Mapping):
        raise ConfigError(f"{owner}: {name} must be a code spec, got {spec!r}")
    codec = get_codec(spec)
    if codec.codec_id not in _SUB_IDS:
        raise ConfigError(f"{owner}: the {name} part's code must be one of "
                          f"{', '.join(_SUB_IDS)}, got {codec.spec}")
    return codec


class TwoPartCodec(Codec):
    """A strict and a tolerant part of the data, each under its own code."""

    #: what the parts are called in decoding details
    part_names: ClassVar[tuple[str, str]] = ("strict part", "tolerant part")

    def __init__(self, high: Codec, low: Codec, tolerant: bool) -> None:
        self._high, self._low, self._tolerant = high, low, bool(tolerant)

    # ---------------------------------------------------------------- geometry
    @abstractmethod
    def _sizes(self, n: int) -> tuple[int, int, int]:
        """(strict bytes before the checksums, tolerant bytes, values they describe)."""

    @abstractmethod
    def _split(self, data: U8) -> tuple[U8, U8]:
        """(strict part, tolerant part) of the data."""

    @abstractmethod
    def _join(self, high: U8, low: U8, n: int) -> U8:
        """The ``n`` data bytes from their two parts (inverse of :meth:`_split`)."""

    @abstractmethod
    def _fill_lost(self, low: U8, lost: np.ndarray) -> None:
        """Set the tolerant bytes at ``lost`` (unknown: the medium lost them) in place."""

    # ---------------------------------------------------------------- common
    @property
    def compute_bound(self) -> bool:
        return self._high.compute_bound or self._low.compute_bound

    @property
    def tolerant(self) -> bool:
        return self._tolerant

    @property
    def high(self) -> Codec:
        """The strict part's code."""
        return self._high

    @property
    def low(self) -> Codec:
        """The tolerant part's code."""
        return self._low

    @property
    def t(self) -> int:
        return self._high.t

    def encoded_size(self, n: int) -> int:
        if n < 0:
            raise ValueError("negative size")
        h, lo, _ = self._sizes(n)
        return self._high.encoded_size(h + 2 * SUM) + self._low.encoded_size(lo)

    def parts(self, data_bytes: int) -> tuple[Part, ...]:
        h, lo, _ = self._sizes(data_bytes)
        parts = [Part(self._high, h + 2 * SUM, False)]
        if lo:
            parts.append(Part(self._low, lo, self._tolerant))
        return tuple(parts)

    def units(self, data_bytes: int) -> Units:
        raise ConfigError(f"{self.spec} is two decoding layouts: predict each of parts()")

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
        return self._join(hs[:h], ls[:self._sizes(n)[1]], n)

    def _high_plane(self, b: U8, henc: int, h: int, eras: np.ndarray
                    ) -> tuple[U8, bytes, int] | DecodeResult:
        # Intact part data passes its checksum without decoding (damaged parity alone
        # never loses a part, as with the whole-block checksum of a single code).
        fast = self._high.systematic_data(b[:henc]) if not eras.size or eras[0] >= h + 2 * SUM \
            else None
        if fast is not None and xxhash.xxh3_128_digest(fast[:h].data) == bytes(fast[h:h + SUM]):
            return fast[:h], bytes(fast[h + SUM:h + 2 * SUM]), 0
        res = self._high.decode(b[:henc], eras[eras < henc])
        if not res.ok:
            return uncorrectable(f"{self.part_names[0]}: {res.detail or 'uncorrectable'}")
        hd = np.frombuffer(res.data, dtype=np.uint8)
        high = hd[:h]
        if xxhash.xxh3_128_digest(high.data) != bytes(hd[h:h + SUM]):
            return uncorrectable(f"{self.part_names[0]} fails its checksum "
                                 "(errors beyond its code)")
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
            return None, 0, f"{self.part_names[1]}: {res.detail or 'uncorrectable'}"
        low = np.frombuffer(res.data, dtype=np.uint8)
        if xxhash.xxh3_128_digest(low.data) != digest:
            return None, 0, f"{self.part_names[1]} fails its checksum"
        return low, res.n_corrected, ""

    def _open(self, buf: BytesLike, erasures: Iterable[int] | None
              ) -> tuple[U8, np.ndarray, int, int, tuple[U8, bytes, int] | DecodeResult]:
        """(buffer, erasures, data bytes, strict part's encoded length, its decoding)."""
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
        """For a tolerant layout whose tolerant part failed: the data with the verified
        strict part and the tolerant part as read (lost bytes filled, see the subclass).
        None when the strict part itself fails or the layout is not tolerant: the block
        is lost."""
        if not self._tolerant:
            return None
        b, eras, n, henc, hi = self._open(buf, erasures)
        if isinstance(hi, DecodeResult):
            return None
        # Called once decode() has failed on the tolerant part: not decoded a second time.
        high, _, fixed = hi
        _, n_low, values = self._sizes(n)
        raw = self._low.systematic_data(b[henc:])
        low = (np.zeros(n_low, dtype=np.uint8) if raw is None
               else np.array(raw[:n_low], dtype=np.uint8))
        lost = eras[(eras >= henc) & (eras < henc + n_low)] - henc
        if raw is None:
            lost = np.arange(n_low)
        self._fill_lost(low, lost)
        return Degraded(self._join(high, low, n).tobytes(), fixed, values,
                        f"{self.part_names[1]} unverified")
