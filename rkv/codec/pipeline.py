"""A block's protection as one object: the quantizer, then the code.

A :class:`Pipeline` is what a tier (or, with placement, a plan) applies to one KV block:
an optional quantizer (array -> bytes) and an optional error-correcting code (bytes ->
bytes). "No stage" is spelled one way, ``None``; every spelling a config may use for it
(``"none"``, ``"fp16"``, ``"16"``, a 16-bit quantizer, the ``none`` codec) is folded into
that here. The pipeline computes its own sizes (data after the quantizer, payload after the
code, the whole record with its framing) for a block shape and dtype, so nothing else builds
a stand-in header to learn a record's size.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import numpy as np

from rkv.codec.blockcodec import compute_bound, encode_block, reencode
from rkv.codec.stages import block_codec, codec_for, header_stages, quantizer_for
from rkv.format.dtypes import numpy_dtype
from rkv.format.record import PRELUDE_BYTES, DecodedRecord, RecordHeader, framing_sizes

if TYPE_CHECKING:
    from rkv.ecc.base import Codec
    from rkv.quant import Quantizer

@dataclass(frozen=True)
class Pipeline:
    """Quantizer (``None``: values as they are), then code (``None``: raw payload, rkv's
    end-to-end checksum only). Immutable and hashable: stages compare by config."""

    quant: Quantizer | None = None
    codec: Codec | None = None

    def __post_init__(self) -> None:
        q, c = self.quant, self.codec
        if q is not None and q.bits >= 16:
            object.__setattr__(self, "quant", None)
        if c is not None and c.codec_id == "none":
            object.__setattr__(self, "codec", None)
        if self.quant is not None and self.codec is not None and self.codec.by_value and \
                self.quant.tolerant_span((2, 1, 1, 1), "float16") is None:
            from rkv.errors import ConfigError

            raise ConfigError(f"{self.codec.codec_id} splits the bytes of 16-bit or wider "
                              f"values, or a quantizer's metadata from its codes; "
                              f"{self.quant.spec} has no codes to tell apart")

    @classmethod
    def parse(cls, quant: str = "none", ecc: str = "none") -> Pipeline:
        """From a tier's ``quant`` and ``ecc`` specs (``ConfigError`` on a bad spec)."""
        return _parse(quant, ecc)

    @property
    def bits(self) -> int:
        """Bits per stored value (16 when not quantized)."""
        return 16 if self.quant is None else int(self.quant.bits)

    @property
    def width(self) -> tuple[int, int]:
        """(key bits, value bits) (16, 16 when not quantized)."""
        return (16, 16) if self.quant is None else self.quant.widths

    @property
    def spec(self) -> str:
        q = "none" if self.quant is None else self.quant.spec
        c = "none" if self.codec is None else self.codec.spec
        return f"{q} + {c}"

    def configs(self) -> tuple[dict[str, Any], ...]:
        """The record header's codec list: quantizer first, then the code."""
        return tuple(s.get_config() for s in (self.quant, self.codec) if s is not None)

    def for_block(self, shape: tuple[int, ...], dtype: str) -> Pipeline:
        """The pipeline a block of ``shape`` actually gets: without the quantizer when it
        would not shrink the block (a short tail chunk, whose per-group metadata outweighs
        its values); a code laid out by value (byte planes) set to the dtype's width, or for
        a quantized block cut into the quantizer's strict metadata and tolerant codes
        (:func:`rkv.codec.stages.block_codec`). Records say which way it went."""
        if self.quant is not None:
            raw = int(np.prod(shape)) * numpy_dtype(dtype).itemsize
            if self.quant.encoded_size(shape, dtype) >= raw:
                return replace(self, quant=None).for_block(shape, dtype)
        if self.codec is None:
            return self
        codec = block_codec(self.codec, self.quant, tuple(shape), dtype)
        return self if codec is self.codec else replace(self, codec=codec)

    @classmethod
    def of_record(cls, header: RecordHeader) -> Pipeline:
        """The pipeline a record was written with, from its header's codec list."""
        return cls(*header_stages(header))

    # -- what it does to a block -------------------------------------------------------------
    @property
    def compute_bound(self) -> bool:
        """Whether encoding a block is compute-bound (threads pay): see
        :func:`rkv.codec.blockcodec.compute_bound`."""
        return compute_bound(self.codec, self.quant)

    def encode(self, header: RecordHeader, data: np.ndarray,
               alloc: Callable[[int], np.ndarray] | None = None) -> Any:
        """The record of one block's values ``data``: quantized, then coded, framed under
        ``header`` (its lengths, checksum and codec list filled in here); ``alloc`` gives
        the record's memory (default: new)."""
        return encode_block(header, data, self.codec, alloc, self.quant)

    def reencode(self, record: Any, dec: DecodedRecord,
                 erased: Sequence[tuple[int, int]] = (), written_ns: int | None = None) -> Any:
        """``record`` (decoded as ``dec``) re-encoded with this pipeline's code, from its
        verified and corrected data; its quantization is the record's own (fewer bits is a
        re-quantization, not a re-encode). See :func:`rkv.codec.blockcodec.reencode`."""
        return reencode(record, dec, self.codec, erased, written_ns)

    # -- sizes -----------------------------------------------------------------------------
    def data_bytes(self, shape: tuple[int, ...], dtype: str) -> int:
        """Bytes after the quantizer (what the end-to-end checksum covers)."""
        if self.quant is not None:
            return int(self.quant.encoded_size(shape, dtype))
        return int(np.prod(shape)) * numpy_dtype(dtype).itemsize

    def payload_bytes(self, shape: tuple[int, ...], dtype: str) -> int:
        """Bytes after the code."""
        n = self.data_bytes(shape, dtype)
        return n if self.codec is None else int(self.codec.encoded_size(n))

    def spread(self, data_bytes: int) -> bool:
        """Whether this pipeline's records of ``data_bytes`` spread their framing copies
        over sectors (record format v3: the code asks for it)."""
        return self.codec is not None and self.codec.spread_framing(data_bytes)

    def framing(self, data_bytes: int) -> tuple[int, int]:
        """(payload offset, length of one header copy) of this pipeline's records of
        ``data_bytes``: the same for every block of that size (header fields have fixed
        widths but for the codec list; the layout depends on the size for some codes)."""
        return _framing(self, self.spread(data_bytes))

    def record_bytes(self, shape: tuple[int, ...], dtype: str) -> int:
        """The whole record of a block: preludes, three header copies, padding, payload."""
        return self.record_bytes_for(self.data_bytes(shape, dtype))

    def record_bytes_for(self, data_bytes: int) -> int:
        """The whole record for ``data_bytes`` of data after the quantizer."""
        off, hlen = self.framing(data_bytes)
        plen = data_bytes if self.codec is None else int(self.codec.encoded_size(data_bytes))
        return off + plen + hlen + PRELUDE_BYTES


@lru_cache(maxsize=256)
def _parse(quant: str, ecc: str) -> Pipeline:
    return Pipeline(quantizer_for(quant), codec_for(ecc))


@lru_cache(maxsize=1024)
def _framing(p: Pipeline, spread: bool) -> tuple[int, int]:
    # Every header field but the codec list has a fixed width (struct-packed), so the
    # framing of any block under this pipeline is the framing of this stand-in.
    header = RecordHeader(key=bytes(32), layer=0, fingerprint=bytes(16), shape=(2, 1, 1, 1),
                          dtype="float16", data_len=0, payload_len=0, codecs=p.configs(),
                          spread=spread)
    return framing_sizes(header)
