"""Quantized planes: a quantized block's metadata strict, its packed codes tolerant.

``qplanes(meta=CODE, codes=CODE, tolerant=1, head=H, tail=T)`` is what a byte-planes spec
(``planes(high=..., low=..., tolerant=...)``) becomes for a quantized block
(:meth:`rkv.ecc.planes.PlanesCodec.for_quantized`, bound per block shape by the pipeline): a
quantizer's encoding of ``n`` bytes keeps its metadata in the first ``head`` and the last
``tail`` bytes and its packed codes in between (KIVI: metadata copies 0 and 1, the codes with
their zero padding, metadata copy 2; :meth:`rkv.quant.base.Quantizer.tolerant_span`). The
metadata is the *strict* part, under the ``meta`` code and always verified; the codes are the
*tolerant* part, under the ``codes`` code::

    meta.encode(data[:H] | data[n-T:] | xxh3_128(that) | xxh3_128(codes)) | codes.encode(codes)

When the codes fail their code (more errors than it corrects, or no code at all) a tolerant
layout reads back ``degraded``: the codes as read, dequantized with the verified metadata.
The quantizer promises that any byte there decodes within bounds (KIVI: every code ``q`` in
``[0, 2^bits - 1]`` decodes to ``z + q s``, inside the group's ``[z, z + (2^bits - 1) s]``,
which is the group's ``[min, max]`` up to the scale's rounding up to the dtype). Bytes the
medium reported lost are set to ``0x78`` (:data:`FILL`): any byte is a valid code, and this
one's codes average the middle of the range at 2 bits (0, 2, 3, 1) and 4 bits (8, 7), and
sit at 120 of 255 at 8 bits. A failed metadata part loses the block (never degraded).

Sizes are exact both ways (``n = H + T + codes.data_size(len - meta part)``), so records
decode from their header's config alone; ``head`` and ``tail`` are part of that config.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from rkv.ecc._twopart import SUM, TwoPartCodec, flag, sub_codec
from rkv.ecc.base import U8, Codec, check_keys, int_param
from rkv.errors import ConfigError, CorruptRecordError

#: What a lost tolerant byte is set to (see the module docstring).
FILL = 0x78
_MAX = (1 << 40)


class QuantPlanesCodec(TwoPartCodec):
    """A quantized block's metadata (first ``head`` and last ``tail`` bytes) under one code,
    strictly verified; its packed codes (the rest) under another, tolerant."""

    codec_id = "qplanes"
    part_names: ClassVar[tuple[str, str]] = ("metadata part", "codes part")

    def __init__(self, meta: Codec, codes: Codec, *, tolerant: bool = True, head: int = 0,
                 tail: int = 0) -> None:
        super().__init__(meta, codes, tolerant)
        cfg = {"head": head, "tail": tail}
        self._head = int_param(cfg, "qplanes", "head", lo=0, hi=_MAX)
        self._tail = int_param(cfg, "qplanes", "tail", lo=0, hi=_MAX)

    # ---------------------------------------------------------------- config
    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> QuantPlanesCodec:
        check_keys(cfg, "qplanes", ("meta", "codes", "tolerant", "head", "tail"))
        if "head" not in cfg or "tail" not in cfg:
            raise ConfigError("qplanes: head and tail are required (a pipeline binds them "
                              "per block; a tier's ecc spec is planes(...))")
        return cls(sub_codec(cfg, "qplanes", "meta"), sub_codec(cfg, "qplanes", "codes"),
                   tolerant=flag(cfg, "qplanes", "tolerant", True),
                   head=int_param(cfg, "qplanes", "head", lo=0, hi=_MAX),
                   tail=int_param(cfg, "qplanes", "tail", lo=0, hi=_MAX))

    def get_config(self) -> dict[str, Any]:
        return {"id": "qplanes", "meta": self._high.get_config(),
                "codes": self._low.get_config(), "tolerant": self._tolerant,
                "head": self._head, "tail": self._tail}

    @property
    def spec(self) -> str:
        return (f"qplanes(meta={self._high.spec},codes={self._low.spec},"
                f"tolerant={int(self._tolerant)},head={self._head},tail={self._tail})")

    @property
    def head(self) -> int:
        """Strict bytes before the codes."""
        return self._head

    @property
    def tail(self) -> int:
        """Strict bytes after the codes."""
        return self._tail

    def for_quantized(self, span: tuple[int, int, int] | None = None) -> Codec:
        """The same two codes bound to another span (a block of another shape)."""
        if span is None:
            return self._high
        start, end, total = span
        if (start, total - end) == (self._head, self._tail):
            return self
        return QuantPlanesCodec(self._high, self._low, tolerant=self._tolerant, head=start,
                                tail=total - end)

    # ---------------------------------------------------------------- sizes
    def _sizes(self, n: int) -> tuple[int, int, int]:
        """(metadata bytes, codes bytes, codes bytes) for ``n`` data bytes."""
        strict = self._head + self._tail
        if n < strict:
            raise ConfigError(f"{self.spec} is laid out for blocks of at least {strict} "
                              f"bytes, got {n}")
        return strict, n - strict, n - strict

    def data_size(self, encoded_n: int) -> int:
        strict = self._head + self._tail
        rest = encoded_n - self._high.encoded_size(strict + 2 * SUM)
        if rest < 0:
            raise CorruptRecordError(f"{self.spec}: {encoded_n} bytes is not a valid "
                                     "encoded length")
        codes = self._low.data_size(rest)
        if self._low.encoded_size(codes) != rest:
            raise CorruptRecordError(f"{self.spec}: {encoded_n} bytes is not a valid "
                                     "encoded length")
        return strict + codes

    @property
    def overhead(self) -> float:
        # Asymptotically (more tokens, same layout) the codes dominate.
        return self._low.overhead

    # ---------------------------------------------------------------- parts
    def _split(self, data: U8) -> tuple[U8, U8]:
        n = data.size
        self._sizes(n)
        strict = np.concatenate([data[:self._head], data[n - self._tail:]])
        return strict, np.ascontiguousarray(data[self._head:n - self._tail])

    def _join(self, high: U8, low: U8, n: int) -> U8:
        out = np.empty(n, dtype=np.uint8)
        out[:self._head] = high[:self._head]
        out[n - self._tail:] = high[self._head:self._head + self._tail]
        out[self._head:n - self._tail] = low
        return out

    def _fill_lost(self, low: U8, lost: np.ndarray) -> None:
        low[lost] = FILL
