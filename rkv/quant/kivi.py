"""KIVI-style asymmetric uniform quantization: ``kivi(bits=2|4|8, group=G[, vbits=2|4|8])``.

Scheme (after KIVI, Liu et al. 2024): keys are quantized **per channel** (for every head and
every dim, ``G`` consecutive tokens share a scale and a zero point), values **per token** (for
every token and head, ``Gv = min(G, head_dim)`` consecutive head_dim elements share them).
Ragged last groups are allowed. For a group with minimum ``m`` and maximum ``M``:

* zero point ``z = m`` (an element of the block, stored exactly; a zero minimum is ``+0.0``);
* scale ``s`` = the smallest value of the block's dtype ``>= (M - m) / (2**bits - 1)``
  (the quotient in float64), so every element lies in ``[z, z + (2**bits - 1) * s]``;
* code ``q = clamp(rint((x - z) / s), 0, 2**bits - 1)`` (float32 arithmetic, ties to even;
  a constant group has ``s = 0`` and all codes 0);
* decoded ``x^ = z + q * s`` in float32, rounded to nearest even into the block's dtype
  (float16: first clamped to +-65504). Hence ``|x - x^| <= s / 2`` up to float32 rounding,
  plus half a unit in the last place of the output dtype.

Inputs must be finite with ``|x| < 2**126`` (``ShapeError`` otherwise).

Keys and values may take different widths: ``kivi(bits=4, vbits=2)`` quantizes keys to 4 bits
and values to 2 (``vbits`` defaults to ``bits``). The quantization literature finds them very
unequal (KV-AdaQuant: 4-bit keys with 2-bit values far above the reverse), so the planner
chooses the pair per block.

Encoded layout (little-endian; ``T`` tokens, ``H`` heads, ``D`` head_dim, ``N = 2*T*H*D``)::

    offset 0         metadata copy 0   (L bytes)
    offset L         metadata copy 1   (L bytes)
    offset 2L        packed codes      (ceil(N * bits / 8) bytes, zero-padded to a multiple of 8)
    offset 2L + P    metadata copy 2   (L bytes)              total = 3L + P

With ``vbits != bits`` (layout version 2) the packed codes are the keys' ``ceil(N/2 * bits /
8)`` bytes at ``bits`` followed by the values' ``ceil(N/2 * vbits / 8)`` bytes at ``vbits``,
the two together zero-padded to a multiple of 8; everything else is as in version 1. Equal
widths always write version 1, so such records are byte-identical to those written before
version 2 existed.

One metadata copy (``L = 24 + round8(2 * (Gk + Gv) * w) + 8``, ``w`` = 2 for float16 and
bfloat16, 4 for float32)::

    0   4  magic b"RKVQ"
    4   1  layout version (1, or 2 when keys and values have different widths)
    5   1  bits (2, 4 or 8): the keys' width (version 1: also the values')
    6   1  dtype code (1 float16, 2 bfloat16, 3 float32); also the metadata's dtype
    7   1  version 1: reserved, 0; version 2: the values' width (2, 4 or 8)
    8   2  G, u16           10  2  Gv = min(G, D), u16
    12  4  T, u32           16  4  H, u32            20  4  D, u32
    24     key scales   [ceil(T/G), H, D]   (Gk = ceil(T/G) * H * D values, block dtype)
           key zeros    [ceil(T/G), H, D]
           value scales [T, H, ceil(D/Gv)]  (Gv values)
           value zeros  [T, H, ceil(D/Gv)]
           zero padding to a multiple of 8
    L-8 8  xxh3_64 of bytes [0, L-8) of this copy, u64

Codes are the block's elements in C order (all keys, then all values), ``8 / bits`` per byte,
element ``i`` at bit ``(i * bits) % 8`` of byte ``(i * bits) // 8``: the first element in the
low bits. Two copies lead and one trails so that a lost sector at either end of a small
payload leaves a readable copy.

Decoding uses the first copy whose checksum verifies (copy 0 on the fast path). If none does,
the bitwise majority of the three copies is taken and must verify. Damage confined to one
copy, or to two copies (anywhere, even the same bytes), is therefore always repaired exactly;
otherwise the majority repairs any bit flipped in at most one copy. Anything else raises
:class:`~rkv.errors.CorruptRecordError`; wrong metadata is never used. The codes are not
replicated: the record's ECC and end-to-end checksum protect them.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Any

import numpy as np
import numpy.typing as npt
import xxhash

import rkv.quant._kernels as _kernels
from rkv.errors import ConfigError, CorruptRecordError, ShapeError
from rkv.format.dtypes import DTYPES, numpy_dtype
from rkv.quant.base import (
    CLEAN,
    CORRECTED,
    U8,
    BytesLike,
    QuantDecodeResult,
    Quantizer,
    Status,
    as_u8,
    check_block,
    check_keys,
    check_shape,
    dtype_name,
    int_param,
    readonly,
)

MAGIC = b"RKVQ"
VERSION = 1
SPLIT_VERSION = 2          # keys and values at different widths
HEADER_SIZE = 24
CHECK_SIZE = 8
COPIES = 3
BITS = (2, 4, 8)
DEFAULT_BITS = 4
DEFAULT_GROUP = 32
MAX_GROUP = 65535

_HEADER = struct.Struct("<4sBBBBHHIII")
_TAGS: dict[str, int | None] = {
    "float16": _kernels.MODE_F16,
    "bfloat16": _kernels.MODE_BF16,
    "float32": None,
}


def _round8(n: int) -> int:
    return (n + 7) & ~7


@dataclass(frozen=True)
class KiviLayout:
    """Where everything lies in the encoding of one block (see the module docstring).

    Build it with :meth:`KiviQuantizer.layout` (cached); all sizes are precomputed."""

    bits: int
    group: int
    dtype: str
    tokens: int
    heads: int
    head_dim: int
    value_group: int  # min(group, head_dim)
    key_groups: int  # ceil(tokens / group) * heads * head_dim
    value_groups: int  # tokens * heads * ceil(head_dim / value_group)
    meta_dtype: np.dtype[Any]  # how the metadata arrays are viewed: uint16 bits or float32
    meta_len: int  # bytes of scales and zero points in one copy (without padding)
    copy_len: int
    n_codes: int
    codes_len: int
    codes_offset: int   # start of the packed codes (keys, then values)
    copy_offsets: tuple[int, int, int]   # copy 2 starts where the padded codes end
    total: int
    header: bytes
    vbits: int = 0      # the values' width
    key_codes_len: int = 0   # version 2: bytes of the keys' packed codes (0: one packing)

    @classmethod
    def make(cls, bits: int, group: int, dtype: str, tokens: int, heads: int,
             head_dim: int, vbits: int | None = None) -> KiviLayout:
        vb = bits if vbits is None else vbits
        vg = min(group, head_dim)
        gk = -(-tokens // group) * heads * head_dim
        gv = tokens * heads * -(-head_dim // vg)
        mdt = np.dtype(np.float32) if dtype == "float32" else np.dtype(np.uint16)
        meta_len = 2 * (gk + gv) * mdt.itemsize
        cl = HEADER_SIZE + _round8(meta_len) + CHECK_SIZE
        half = tokens * heads * head_dim
        n = 2 * half
        if vb == bits:
            codes_len, key_len = -(-n * bits // 8), 0
            header = _HEADER.pack(MAGIC, VERSION, bits, DTYPES[dtype].code, 0, group, vg,
                                  tokens, heads, head_dim)
        else:
            key_len = -(-half * bits // 8)
            codes_len = key_len + -(-half * vb // 8)
            header = _HEADER.pack(MAGIC, SPLIT_VERSION, bits, DTYPES[dtype].code, vb, group,
                                  vg, tokens, heads, head_dim)
        return cls(bits, group, dtype, tokens, heads, head_dim, vg, gk, gv, mdt, meta_len, cl,
                   n, codes_len, 2 * cl, (0, cl, 2 * cl + _round8(codes_len)),
                   3 * cl + _round8(codes_len), header, vb, key_len)


@lru_cache(maxsize=1024)
def _layout(bits: int, group: int, dtype: str, shape: tuple[int, ...],
            vbits: int | None = None) -> KiviLayout:
    _, t, h, d = check_shape(shape)
    return KiviLayout.make(bits, group, dtype_name(dtype), t, h, d, vbits)


def _pack(codes: U8, bits: int, out: U8) -> None:
    """One packing of codes at ``bits`` (8: one code per byte)."""
    if bits == 8:
        out[:] = codes
    else:
        _kernels.pack_codes(codes, bits, out)


def _unpack(packed: U8, bits: int, n: int, out: U8) -> None:
    if bits == 8:
        out[:] = packed[:n]
    else:
        _kernels.unpack_codes(packed, bits, n, out)


def _verifies(copy: U8) -> bool:
    n = copy.shape[0] - CHECK_SIZE
    return xxhash.xxh3_64_intdigest(copy[:n].data) == int.from_bytes(copy[n:].tobytes(), "little")


class KiviQuantizer(Quantizer):
    """KIVI quantization: keys per channel, values per token; see the module docstring."""

    codec_id = "kivi"
    positional = ("bits", "group")

    def __init__(self, bits: int = DEFAULT_BITS, group: int = DEFAULT_GROUP,
                 vbits: int | None = None) -> None:
        if isinstance(bits, bool) or bits not in BITS:
            raise ConfigError(f"kivi: bits must be one of 2, 4, 8 (or 16: none), got {bits!r}")
        if isinstance(group, bool) or not isinstance(group, int) or not 1 <= group <= MAX_GROUP:
            raise ConfigError(f"kivi: group must be an integer in [1, {MAX_GROUP}], got {group!r}")
        if vbits is not None and (isinstance(vbits, bool) or vbits not in BITS):
            raise ConfigError(f"kivi: vbits must be one of 2, 4, 8, got {vbits!r}")
        self.bits = bits
        self.group = group
        #: The values' width (``bits`` unless set): keys use ``bits``.
        self.vbits = bits if vbits is None else vbits

    # ---------------------------------------------------------------- config
    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> Quantizer:
        """``bits=16`` gives the identity quantizer (``none``)."""
        check_keys(cfg, "kivi", ("bits", "group", "vbits"))
        bits = int_param(cfg, "kivi", "bits", lo=1, hi=16, default=DEFAULT_BITS)
        group = int_param(cfg, "kivi", "group", lo=1, hi=MAX_GROUP, default=DEFAULT_GROUP)
        vbits = int_param(cfg, "kivi", "vbits", lo=1, hi=16, default=bits)
        if bits == 16 and vbits == 16:
            from rkv.quant.none import NoneQuantizer

            return NoneQuantizer()
        if 16 in (bits, vbits):
            raise ConfigError(f"kivi: keys and values are either both 16 bits (none) or both "
                              f"quantized to 2, 4 or 8, got bits={bits}, vbits={vbits}")
        return cls(bits, group, vbits)

    def get_config(self) -> dict[str, Any]:
        # vbits only when it differs, so the spec (and every record header) of a block with
        # equal widths is what it was before split widths existed.
        cfg: dict[str, Any] = {"id": "kivi", "bits": self.bits, "group": self.group}
        if self.vbits != self.bits:
            cfg["vbits"] = self.vbits
        return cfg

    @property
    def widths(self) -> tuple[int, int]:
        return self.bits, self.vbits

    @cached_property
    def levels(self) -> int:
        """The keys' largest code, ``2**bits - 1``."""
        return (1 << self.bits) - 1

    @cached_property
    def vlevels(self) -> int:
        """The values' largest code, ``2**vbits - 1``."""
        return (1 << self.vbits) - 1

    # ---------------------------------------------------------------- sizes
    def layout(self, shape: Iterable[int], dtype: str | np.dtype[Any]) -> KiviLayout:
        """The :class:`KiviLayout` of a block of ``shape`` and ``dtype``."""
        # the cache is keyed by exact Python ints (5.0 or True must not hit the entry of 5 / 1)
        if not (isinstance(shape, tuple) and all(type(d) is int for d in shape)):
            shape = check_shape(shape)
        return _layout(self.bits, self.group, dtype if isinstance(dtype, str)
                       else dtype_name(dtype), shape,
                       None if self.vbits == self.bits else self.vbits)

    def encoded_size(self, shape: Iterable[int], dtype: str | np.dtype[Any]) -> int:
        return self.layout(shape, dtype).total

    # ---------------------------------------------------------------- coding
    def encode(self, block: npt.NDArray[Any]) -> bytes:
        arr, name = check_block(block)
        lay = self.layout(arr.shape, name)
        tag = _TAGS[name]
        flat = arr.reshape(-1)
        src = readonly(flat if tag is None else flat.view(np.uint16))
        out = np.zeros(lay.total, np.uint8)
        cl = lay.copy_len
        meta = out[HEADER_SIZE : HEADER_SIZE + lay.meta_len].view(lay.meta_dtype)
        c0 = lay.codes_offset
        n = lay.n_codes
        split = lay.key_codes_len > 0
        codes = out[c0 : c0 + n] if self.bits == 8 and not split else np.empty(n, np.uint8)
        bad = _kernels.kivi_encode(
            src, tag, lay.tokens, lay.heads, lay.head_dim, self.group, lay.value_group,
            self.levels, self.vlevels, meta, codes,
        )
        if bad:
            raise ShapeError(
                f"kivi: the block holds non-finite values (NaN or Inf) or values with "
                f"|x| >= 2**126; KV must be finite ({bad} found in one group)"
            )
        if split:
            half, k1 = n // 2, c0 + lay.key_codes_len
            _pack(codes[:half], self.bits, out[c0:k1])
            _pack(codes[half:], self.vbits, out[k1 : c0 + lay.codes_len])
        elif self.bits != 8:
            _kernels.pack_codes(codes, self.bits, out[c0 : c0 + lay.codes_len])
        out[:HEADER_SIZE] = np.frombuffer(lay.header, np.uint8)
        check = xxhash.xxh3_64_intdigest(out[: cl - CHECK_SIZE].data)
        out[cl - CHECK_SIZE : cl] = np.frombuffer(check.to_bytes(CHECK_SIZE, "little"), np.uint8)
        for off in lay.copy_offsets[1:]:
            out[off : off + cl] = out[:cl]
        return out.tobytes()

    def decode_result(
        self, buf: BytesLike, shape: Iterable[int], dtype: str | np.dtype[Any]
    ) -> QuantDecodeResult:
        lay = self.layout(shape, dtype)
        b = as_u8(buf)
        if b.shape[0] != lay.total:
            raise CorruptRecordError(
                f"{self.spec}: {b.shape[0]} bytes cannot hold a {lay.dtype} block of shape "
                f"[2, {lay.tokens}, {lay.heads}, {lay.head_dim}] ({lay.total} bytes)"
            )
        copy, status, detail = self._metadata(b, lay)
        meta = copy[HEADER_SIZE : HEADER_SIZE + lay.meta_len]
        if not meta.flags.aligned:
            meta = meta.copy()
        meta = readonly(meta.view(lay.meta_dtype))
        c0 = lay.codes_offset
        if lay.key_codes_len:
            half, k1 = lay.n_codes // 2, c0 + lay.key_codes_len
            scratch = np.empty(lay.n_codes, np.uint8)
            _unpack(b[c0:k1], self.bits, half, scratch[:half])
            _unpack(b[k1 : c0 + lay.codes_len], self.vbits, half, scratch[half:])
            codes = readonly(scratch)
        elif self.bits == 8:
            codes = b[c0 : c0 + lay.n_codes]
        else:
            scratch = np.empty(lay.n_codes, np.uint8)
            _kernels.unpack_codes(b[c0 : c0 + lay.codes_len], self.bits, lay.n_codes, scratch)
            codes = readonly(scratch)
        dt = numpy_dtype(lay.dtype)
        out = np.empty((2, lay.tokens, lay.heads, lay.head_dim), dt)
        tag = _TAGS[lay.dtype]
        flat = out.reshape(-1)
        bad = _kernels.kivi_dequant(
            codes, tag, lay.tokens, lay.heads, lay.head_dim, self.group, lay.value_group, meta,
            flat if tag is None else flat.view(np.uint16),
        )
        if bad:
            raise CorruptRecordError(
                f"{self.spec}: verified metadata holds {bad} non-finite values or negative "
                "scales (not written by this encoder)"
            )
        return QuantDecodeResult(out, status, detail)

    # ---------------------------------------------------------------- metadata copies
    def _metadata(self, b: U8, lay: KiviLayout) -> tuple[U8, Status, str]:
        """One verified metadata copy: the first that verifies, else the bitwise majority."""
        cl = lay.copy_len
        copies = [b[off : off + cl] for off in lay.copy_offsets]
        for i, copy in enumerate(copies):
            if _verifies(copy):
                self._check_header(copy, lay)
                if i == 0:
                    return copy, CLEAN, ""
                return copy, CORRECTED, f"metadata copy 0{' and 1' if i == 2 else ''} damaged"
        c0, c1, c2 = copies
        vote: U8 = (c0 & c1) | (c0 & c2) | (c1 & c2)
        if _verifies(vote):
            self._check_header(vote, lay)
            return vote, CORRECTED, "no metadata copy intact; repaired by bitwise majority"
        raise CorruptRecordError(
            f"{self.spec}: no copy of the quantization metadata verifies, and neither does "
            "their bitwise majority"
        )

    def _check_header(self, copy: U8, lay: KiviLayout) -> None:
        got = copy[:HEADER_SIZE].tobytes()
        if got != lay.header:
            raise CorruptRecordError(
                f"{self.spec}: the payload was encoded for another shape, dtype or config "
                f"(header {got.hex()}, expected {lay.header.hex()})"
            )

    def metadata_copies_ok(
        self, buf: BytesLike, shape: Iterable[int], dtype: str | np.dtype[Any]
    ) -> tuple[bool, bool, bool]:
        """Which of the three metadata copies verify (for scrubbing; decodes nothing)."""
        lay = self.layout(shape, dtype)
        b = as_u8(buf)
        if b.shape[0] != lay.total:
            raise CorruptRecordError(f"{self.spec}: {b.shape[0]} bytes, expected {lay.total}")
        cl = lay.copy_len
        ok = [_verifies(b[off : off + cl]) for off in lay.copy_offsets]
        return ok[0], ok[1], ok[2]

    def tolerant_span(
        self, shape: Iterable[int], dtype: str | np.dtype[Any]
    ) -> tuple[int, int, int]:
        """``(start, end, total)``: the packed codes with their zero padding, between metadata
        copy 1 and copy 2. Any byte there decodes to codes in ``[0, 2**bits - 1]``, so each
        value stays inside its group's ``[z, z + (2**bits - 1) * s]``; the metadata copies
        around it are what must be exact."""
        lay = self.layout(shape, dtype)
        return lay.codes_offset, lay.copy_offsets[2], lay.total
