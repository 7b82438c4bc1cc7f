"""The codec interface shared by every error-detecting / error-correcting code in rkv.

A :class:`Codec` turns a byte string into an *encoded* byte string and back. The encoded length
is a pure function of the data length and the codec's configuration (:meth:`Codec.encoded_size`)
and :meth:`Codec.decode` works from the encoded buffer alone: it derives the data length from
``len(buf)`` (:meth:`Codec.data_size`).

Decoding never returns possibly-wrong data: a result is ``"clean"`` (nothing was wrong),
``"corrected"`` (errors were found and repaired; the repaired word re-checked as a valid
codeword) or ``"uncorrectable"`` (``data`` is ``b""``). Like every bounded-distance decoder, a
correcting code can *miscorrect* an error pattern beyond its capability into another valid
codeword; the decoders here make that as unlikely as the code allows (re-checked syndromes,
locator degree equals the number of roots, roots inside the shortened codeword), and the
caller's end-to-end checksum over the data catches what remains.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, NamedTuple

import numpy as np
import numpy.typing as npt

from rkv.buffers import as_u8 as as_u8  # re-exported for the kernels
from rkv.buffers import readonly as readonly
from rkv.errors import ConfigError, InputError, UncorrectableError
from rkv.specs import Configured
from rkv.specs import check_keys as check_keys  # re-exported for the implementations
from rkv.specs import choice_param as choice_param
from rkv.specs import int_param as int_param

U8 = npt.NDArray[np.uint8]
Status = Literal["clean", "corrected", "uncorrectable"]
BytesLike = bytes | bytearray | memoryview | npt.NDArray[Any]

CLEAN: Status = "clean"
CORRECTED: Status = "corrected"
UNCORRECTABLE: Status = "uncorrectable"


@dataclass(frozen=True)
class DecodeResult:
    """The outcome of :meth:`Codec.decode`.

    ``data`` is the original data, exact, or ``b""`` when ``status == "uncorrectable"``.
    ``n_corrected`` counts the symbols that were repaired (bytes for Reed-Solomon codes, bits for
    BCH); it is 0 when clean. ``detail`` is a short human-readable note (empty when clean).
    """

    data: bytes
    status: Status
    n_corrected: int = 0
    detail: str = ""

    @property
    def ok(self) -> bool:
        """True when ``data`` holds the original data (clean or corrected)."""
        return self.status != UNCORRECTABLE


def clean(data: bytes) -> DecodeResult:
    return DecodeResult(data, CLEAN, 0, "")


def uncorrectable(detail: str) -> DecodeResult:
    return DecodeResult(b"", UNCORRECTABLE, 0, detail)


def normalize_erasures(erasures: Iterable[int] | None, size: int) -> npt.NDArray[np.int64]:
    """Sorted, de-duplicated erasure offsets into an encoded buffer of ``size`` bytes."""
    if erasures is None:
        return np.zeros(0, dtype=np.int64)
    try:
        arr = np.unique(np.asarray(list(erasures), dtype=np.int64))
    except (TypeError, ValueError, OverflowError) as exc:
        raise InputError("erasures must be an iterable of byte offsets") from exc
    if arr.size and (arr[0] < 0 or arr[-1] >= size):
        raise InputError(f"erasure offsets must lie in [0, {size}), got {arr[0]}..{arr[-1]}")
    return arr


@dataclass(frozen=True)
class Units:
    """How a code decodes ``data_bytes`` of data: what the analytic reliability model
    (:mod:`rkv.reliability.analytic`) needs, described by each codec so a new code plugs into
    predictions without a switch on codec ids.

    ``kind`` names the decoding family the model knows: ``"detect"`` (a check, no
    correction), ``"rs"`` (byte-symbol codewords correcting ``t`` each, interleaved),
    ``"bch"`` (bit-symbol chunks), ``"shard"`` (erasure coding across shards with per-shard
    checksums), ``"raw"`` (nothing at all). ``miss``: P(a failing unit goes undetected by the
    code alone)."""

    kind: str
    units: int                 # independent decoding units
    unit_symbols: int          # symbols per unit (codeword length incl. parity)
    t: int                     # symbols corrected per unit (shard: parity shards)
    symbol_bits: int
    group: int                 # data bytes one unit spans before the layout repeats
    interleave: int = 1
    shard_bytes: int = 0
    check_bytes: int = 0       # shard codes: bytes of each shard's checksum entry
    miss: float = 1.0
    last_symbols: int = 0      # length of the shortened last unit(s) (0: all units full)
    short_units: int = 0       # how many units are shortened to ``last_symbols`` (at most)


class Part(NamedTuple):
    """One independently decoded part of a layout (:meth:`Codec.parts`), for the model."""

    codec: Codec
    data_bytes: int
    tolerant: bool             # its failure degrades the block instead of losing it


class Degraded(NamedTuple):
    """A block readable with bounded noise (:meth:`Codec.decode_degraded`)."""

    data: bytes
    n_corrected: int           # symbols corrected in the strictly verified part
    values: int                # values whose low part is unverified
    detail: str


def log_ball(n: int, t: int, q_minus_1: int) -> float:
    """log of the number of words within Hamming distance t (sum C(n,i) (q-1)^i): with the
    redundancy, a bounded-distance decoder's miscorrection probability for random words."""
    log_q1 = math.log(q_minus_1)
    terms = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * log_q1
             for i in range(t + 1)]
    top = max(terms)
    return top + math.log(sum(math.exp(x - top) for x in terms))


class Codec(Configured, ABC):
    """Base class of every codec. Subclasses are immutable and compare equal by config."""

    codec_id: ClassVar[str]
    #: parameter names that a string spec may give positionally, e.g. ``rs(255,223)``
    positional: ClassVar[tuple[str, ...]] = ()

    # ---------------------------------------------------------------- coding
    @abstractmethod
    def encode(self, data: BytesLike) -> bytes:
        """Encode ``data`` (any bytes-like object or numpy array, taken as raw bytes)."""

    def encode_tail(self, data: U8) -> bytes | None:
        """The bytes that follow the data in ``encode(data)`` when the layout is
        ``data || tail`` (every systematic code here but byte planes), else None. A caller
        that places the data itself (the record encoder: one numpy copy, without the GIL)
        needs only this; ``data`` is a read-only uint8 array (:func:`as_u8`)."""
        return None

    @abstractmethod
    def decode(self, buf: BytesLike, erasures: Iterable[int] | None = None) -> DecodeResult:
        """Decode an encoded buffer.

        Never raises for corrupted *content*; raises :class:`~rkv.errors.CorruptRecordError`
        only if ``len(buf)`` is impossible for this codec. ``erasures`` are byte offsets into
        ``buf`` known to be unreliable; codecs that cannot use them ignore them.
        """

    def decode_or_raise(
        self, buf: BytesLike, erasures: Iterable[int] | None = None
    ) -> DecodeResult:
        """Like :meth:`decode`, but raises :class:`~rkv.errors.UncorrectableError`."""
        res = self.decode(buf, erasures)
        if res.status == UNCORRECTABLE:
            raise UncorrectableError(f"{self.spec}: {res.detail or 'uncorrectable'}")
        return res

    @abstractmethod
    def encoded_size(self, n: int) -> int:
        """Length of the encoding of ``n`` data bytes."""

    @abstractmethod
    def data_size(self, encoded_n: int) -> int:
        """Inverse of :meth:`encoded_size`; raises ``CorruptRecordError`` if impossible."""

    def spread_framing(self, data_bytes: int) -> bool:
        """Whether records of ``data_bytes`` coded this way should spread their framing
        copies over sectors (record format v3, :func:`rkv.format.record.copy_offsets`): for codes
        that survive lost sectors in the payload, so the framing is not the weak part."""
        return False

    def systematic_data(self, buf: BytesLike) -> U8 | None:
        """The data bytes read straight out of ``buf`` without decoding, or ``None``.

        For the fast read path: the caller verifies its own checksum over this array and calls
        :meth:`decode` only when that fails. May be a zero-copy view of ``buf``.
        """
        return None

    # ---------------------------------------------------------------- config
    @abstractmethod
    def get_config(self) -> dict[str, Any]:
        """A JSON-able dict, including ``"id"``, that :func:`rkv.ecc.get_codec` accepts."""

    @classmethod
    @abstractmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> Codec:
        """Build a codec from a config dict; raises :class:`~rkv.errors.ConfigError`."""

    # ---------------------------------------------------------------- maths
    @property
    def n(self) -> int | None:
        """Codeword length in symbols (shortened codes: the full-length codeword)."""
        return None

    @property
    def k(self) -> int | None:
        """Data symbols per codeword."""
        return None

    @property
    def t(self) -> int:
        """Symbol errors per codeword corrected without erasure information."""
        return 0

    @property
    def symbol_bits(self) -> int:
        """Bits per code symbol."""
        return 8

    @property
    def overhead(self) -> float:
        """Asymptotic encoded/data size ratio for large data (see :meth:`encoded_size`)."""
        return 1.0

    def units(self, data_bytes: int) -> Units:
        """The decoding units over ``data_bytes`` of data, for the reliability model."""
        raise ConfigError(f"no reliability model for codec {self.spec}")

    def parts(self, data_bytes: int) -> tuple[Part, ...] | None:
        """Independently decoded parts (each with its own code), or None for one layout
        described by :meth:`units`."""
        return None

    def decode_degraded(self, buf: BytesLike, erasures: Iterable[int] | None = None
                        ) -> Degraded | None:
        """For a layout with a tolerant part that failed: the data with that part as read
        (bounded noise) and the rest verified; None when the block is lost."""
        return None

    def for_itemsize(self, itemsize: int) -> Codec:
        """This code for a block of ``itemsize``-byte values (layouts that follow values)."""
        return self

    def for_quantized(self, span: tuple[int, int, int] | None = None) -> Codec:
        """This code for a quantized block, which has no values to lay out. ``span``:
        ``(start, end, total)``, the bytes ``[start, end)`` of the quantizer's ``total``
        that may read back unverified (packed codes; the rest is metadata), or None when
        it has none. Byte planes put their high code on the metadata and their low code on
        that span (:mod:`rkv.ecc.qplanes`), or their high code over the whole block."""
        return self

    @property
    def by_value(self) -> bool:
        """True for layouts that cut every value of the block (byte planes): they need
        :meth:`for_itemsize` or :meth:`for_quantized` before they fit a block."""
        return False

    @property
    def compute_bound(self) -> bool:
        """True when encoding costs far more than reading the bytes (table-driven parity:
        RS, BCH), so blocks on several threads go faster even where one core already uses
        the memory bandwidth; False for checksums and SIMD parity (``shardrs``), which run
        at memory speed (:func:`rkv.codec.blockcodec.encode_blocks` keeps those on one thread)."""
        return False

    @property
    def corrects(self) -> bool:
        """True for error-correcting codes, False for detection-only checksums."""
        return self.t > 0
