"""Binary BCH codes over GF(2^m), shortened, per data chunk: ``bch(m=M, t=T[, chunk_bytes=C])``.

Code: narrow-sense binary BCH with designed distance ``2t+1``: generator
``g(x) = lcm(M_1, M_3, ..., M_{2t-1})`` over GF(2), ``deg g = ecc_bits <= m*t``, GF(2^m) built
from the Linux kernel's primitive polynomial for ``m`` (``lib/bch.c``). The parity of a chunk is
``d(x) * x^ecc_bits mod g(x)`` with the data read MSB-first (bit 7 of byte 0 is the
highest-degree coefficient) and stored in ``ecc_bytes = ceil(m*t/8)`` bytes, MSB-first,
zero-padded at the end. These are exactly the bytes ``bchlib.BCH(t, m=m).encode(chunk)`` returns
(the Linux kernel's BCH). galois's ``BCH(2^m - 1, 2^m - 1 - ecc_bits, c=1)`` over the same field
(``extension_field=GF(2**m, irreducible_poly=prim)``) produces the same parity bits for the
same message bits.

Layout of ``encode(data)`` (``L = len(data)``, ``C = chunk_bytes``)::

    data (L bytes, verbatim) | ecc of chunk 0 | ecc of chunk 1 | ...

with chunks of ``C`` bytes (the last one shorter). A chunk plus its ecc must fit in one
codeword: ``8*C + ecc_bits <= 2^m - 1``; the default ``C`` is the largest power of two up to
1024 that fits (NAND practice: 512 bytes for ``m = 13``, 1 KiB for ``m = 14``; a 1 KiB chunk
does not fit GF(2^13) at all).

Guarantees per chunk: up to ``t`` bit errors anywhere in the chunk and its ecc are corrected
exactly (``n_corrected`` counts bits); more are reported uncorrectable or, rarely, miscorrected.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

import rkv.ecc._gfcore as _gfcore
from rkv.ecc._lfsr import lfsr_parity
from rkv.ecc.base import (
    CORRECTED,
    U8,
    BytesLike,
    Codec,
    DecodeResult,
    Units,
    as_u8,
    check_keys,
    clean,
    int_param,
    log_ball,
    normalize_erasures,
    uncorrectable,
)
from rkv.ecc.gf import (
    BCH_PRIM_POLYS,
    bch_generator,
    bch_slicing_tables,
    bch_syndrome_tables,
    field,
)
from rkv.errors import ConfigError, CorruptRecordError

M_MIN = min(BCH_PRIM_POLYS)
M_MAX = max(BCH_PRIM_POLYS)


def default_chunk_bytes(m: int, ecc_bits: int) -> int:
    """Largest power of two <= 1024 with ``8*C + ecc_bits <= 2^m - 1``."""
    room = ((1 << m) - 1 - ecc_bits) // 8
    c = 1024
    while c > room:
        c //= 2
    return c


def max_t(m: int) -> int:
    """The largest ``t`` leaving room for at least one data byte in GF(2^m)."""
    n = (1 << m) - 1
    prim = BCH_PRIM_POLYS[m]
    lo, hi = 1, n // 2
    while lo < hi:  # ecc_bits grows with t: binary search the last t that fits
        mid = (lo + hi + 1) // 2
        if bch_generator(m, mid, prim).bit_length() - 1 + 8 <= n:
            lo = mid
        else:
            hi = mid - 1
    return lo


class BCHCodec(Codec):
    """Binary BCH over GF(2^m) correcting ``t`` bit errors per ``chunk_bytes`` chunk."""

    codec_id = "bch"
    positional = ("m", "t", "chunk_bytes")

    def __init__(self, m: int = 13, t: int = 40, chunk_bytes: int | None = None) -> None:
        cfg: dict[str, Any] = {"id": "bch", "m": m, "t": t}
        self._m = int_param(cfg, "bch", "m", lo=M_MIN, hi=M_MAX)
        self._prim = BCH_PRIM_POLYS[self._m]
        nmax = (1 << self._m) - 1
        self._t = int_param(cfg, "bch", "t", lo=1, hi=nmax // 2)
        g = bch_generator(self._m, self._t, self._prim)
        self._ecc_bits = g.bit_length() - 1
        if self._ecc_bits + 8 > nmax:
            raise ConfigError(
                f"bch: t={self._t} needs {self._ecc_bits} ecc bits, leaving no room for data in "
                f"GF(2^{self._m}) (max t for m={self._m} is {max_t(self._m)})"
            )
        room = (nmax - self._ecc_bits) // 8
        if chunk_bytes is None:
            chunk_bytes = default_chunk_bytes(self._m, self._ecc_bits)
        cfg["chunk_bytes"] = chunk_bytes
        try:
            self._cb = int_param(cfg, "bch", "chunk_bytes", lo=1, hi=room)
        except ConfigError as exc:
            raise ConfigError(
                f"{exc} (a chunk plus {self._ecc_bits} ecc bits must fit in "
                f"2^{self._m}-1 = {nmax} bits)"
            ) from None
        self._tables, self._w, _, self._eb = bch_slicing_tables(self._m, self._t, self._prim)
        bits = np.arange(8 * self._eb) < self._ecc_bits
        self._coded_mask = np.packbits(bits)
        self._synd_tables = bch_syndrome_tables(self._m, self._t, self._eb, self._ecc_bits)

    # ---------------------------------------------------------------- config & maths
    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> BCHCodec:
        check_keys(cfg, "bch", ("m", "t", "chunk_bytes"))
        m = int_param(cfg, "bch", "m", lo=M_MIN, hi=M_MAX, default=13)
        t = int_param(cfg, "bch", "t", lo=1, hi=(1 << m) // 2, default=40 if m >= 13 else 4)
        cb = cfg.get("chunk_bytes")
        if cb is not None and (isinstance(cb, bool) or not isinstance(cb, int | np.integer)):
            raise ConfigError(f"bch: chunk_bytes must be an integer, got {cb!r}")
        return cls(m, t, None if cb is None else int(cb))

    def get_config(self) -> dict[str, Any]:
        return {"id": "bch", "m": self._m, "t": self._t, "chunk_bytes": self._cb}

    @property
    def compute_bound(self) -> bool:
        return True

    @property
    def m(self) -> int:
        return self._m

    @property
    def t(self) -> int:
        return self._t

    @property
    def chunk_bytes(self) -> int:
        return self._cb

    @property
    def ecc_bits(self) -> int:
        return self._ecc_bits

    @property
    def ecc_bytes(self) -> int:
        return self._eb

    @property
    def prim_poly(self) -> int:
        return self._prim

    @property
    def n(self) -> int:
        """Bits in the codeword of a full chunk (``8*chunk_bytes + ecc_bits``)."""
        return 8 * self._cb + self._ecc_bits

    @property
    def k(self) -> int:
        """Data bits per full chunk."""
        return 8 * self._cb

    @property
    def symbol_bits(self) -> int:
        return 1

    @property
    def overhead(self) -> float:
        return (self._cb + self._eb) / self._cb

    def units(self, data_bytes: int) -> Units:
        """Chunks of ``8 chunk_bytes + m t`` bits correcting t bits each; a random word is
        miscorrected with P = V(n, t) / 2^(m t)."""
        m, t, chunk = self._m, self._t, self._cb
        nbits = chunk * 8 + m * t
        miss = math.exp(log_ball(nbits, t, 1) - m * t * math.log(2))
        rem = data_bytes % chunk
        return Units("bch", max(1, -(-data_bytes // chunk)), nbits, t, 1, chunk,
                     miss=min(1.0, miss), last_symbols=rem * 8 + m * t if rem else 0,
                     short_units=1 if rem else 0)

    # ---------------------------------------------------------------- layout
    def encoded_size(self, n: int) -> int:
        if n < 0:
            raise ValueError("negative size")
        return n + -(-n // self._cb) * self._eb

    def data_size(self, encoded_n: int) -> int:
        q, rem = divmod(encoded_n, self._cb + self._eb)
        size = q * self._cb + (rem - self._eb if rem else 0)
        if encoded_n < 0 or (rem and rem <= self._eb) or self.encoded_size(size) != encoded_n:
            raise CorruptRecordError(
                f"{self.spec}: {encoded_n} bytes is not a valid encoded length"
            )
        return size

    def _chunks(self, size: int) -> tuple[np.ndarray[Any, np.dtype[np.int64]], Any]:
        nc = -(-size // self._cb)
        starts = np.arange(nc, dtype=np.int64) * self._cb
        lens = np.minimum(self._cb, size - starts).astype(np.int64)
        return starts, lens

    # ---------------------------------------------------------------- coding
    def encode(self, data: BytesLike) -> bytes:
        d = as_u8(data)
        return b"".join((d.data, self.encode_tail(d)))

    def encode_tail(self, data: U8) -> bytes:
        """The ecc bytes of every chunk, after the data."""
        if data.shape[0] == 0:
            return b""
        starts, lens = self._chunks(data.shape[0])
        par = lfsr_parity(data, starts, lens, self._tables, self._w)
        return np.ascontiguousarray(par[:, : self._eb]).tobytes()

    def systematic_data(self, buf: BytesLike) -> U8:
        b = as_u8(buf)
        return b[: self.data_size(b.shape[0])]

    def decode(self, buf: BytesLike, erasures: Iterable[int] | None = None) -> DecodeResult:
        """Decode. ``erasures`` (byte offsets the medium reported unreadable) are decoded by
        filling them with zeros and with ones and keeping, per chunk, the fill whose decoding
        changes fewer bits outside the erasures: one fill leaves at most half the erased bits
        wrong, so ``2e + f <= 2t`` (``e`` unknown bit errors, ``f`` erased bits) is always
        corrected, and the choice is right whenever that holds."""
        b = as_u8(buf)
        size = self.data_size(b.shape[0])
        eras = normalize_erasures(erasures, b.shape[0])
        if size == 0:
            return clean(b"")
        starts, lens = self._chunks(size)
        if not eras.size:
            bad, cnt, _, offs, masks = self._fixes(b, size, starts, lens)
            if bad.size == 0:
                return clean(b[:size].tobytes())
            if (cnt < 0).any():
                return uncorrectable(
                    f"{int((cnt < 0).sum())} of {lens.shape[0]} chunk(s) have more than "
                    f"{self._t} bit errors")
            out = b[:size].copy()
            keep = offs < size
            np.bitwise_xor.at(out, offs[keep], masks[keep])
            return DecodeResult(out.tobytes(), CORRECTED, int(cnt.sum()),
                                f"{bad.size} chunk(s) repaired")
        return self._decode_erased(b, size, starts, lens, eras)

    def _unit_of(self, offs: np.ndarray, size: int) -> np.ndarray:
        """The chunk each byte offset of the encoded buffer belongs to."""
        return np.where(offs < size, offs // self._cb, (offs - size) // self._eb)

    def _fixes(self, b: U8, size: int, starts: np.ndarray, lens: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Errors-only decoding of every chunk: (chunks with a nonzero syndrome, their
        correction counts (-1: failed), and per correction its chunk, byte offset in the
        encoded buffer and bit mask)."""
        eb = self._eb
        calc = lfsr_parity(b[:size], starts, lens, self._tables, self._w)
        rem = calc[:, :eb] ^ b[size:].reshape(-1, eb)
        if 8 * eb != self._ecc_bits:
            rem &= self._coded_mask  # bits below x^0 (zero padding) are not part of the code
        bad = np.flatnonzero(rem.any(axis=1))
        none = np.zeros(0, dtype=np.int64)
        if bad.size == 0:
            return bad, none, none, none, none.astype(np.uint8)
        f = field(self._m, self._prim)
        nbits = np.ascontiguousarray(8 * lens[bad] + self._ecc_bits)
        out_pos = np.zeros((bad.size, 2 * self._t + 2), dtype=np.int64)
        out_cnt = np.zeros(bad.size, dtype=np.int64)
        btab, step8, fix = self._synd_tables
        _gfcore.bch_decode_batch(
            np.ascontiguousarray(rem[bad]), nbits, btab, step8, fix, f.exp, f.log, f.qsol,
            out_pos, out_cnt,
        )
        cols = np.arange(out_pos.shape[1])[None, :] < np.maximum(out_cnt, 0)[:, None]
        qq = np.broadcast_to(bad[:, None], cols.shape)[cols]
        bit = (nbits[:, None] - 1 - out_pos)[cols]  # bit index from the start of the chunk
        dlen = 8 * lens[qq]
        in_data = bit < dlen
        offs = np.where(in_data, starts[qq] + bit // 8, size + qq * eb + (bit - dlen) // 8)
        masks = (0x80 >> np.where(in_data, bit, bit - dlen) % 8).astype(np.uint8)
        return bad, out_cnt, qq, offs, masks

    def _decode_erased(self, b: U8, size: int, starts: np.ndarray, lens: np.ndarray,
                       eras: np.ndarray) -> DecodeResult:
        nc = lens.shape[0]
        erased = np.zeros(b.shape[0], dtype=bool)
        erased[eras] = True
        fills, fixed, ok, cost = [], [], [], []
        for value in (0x00, 0xFF):
            fb = b.copy()
            fb[eras] = value
            bad, cnt, qq, offs, masks = self._fixes(fb, size, starts, lens)
            good = np.ones(nc, dtype=bool)
            good[bad[cnt < 0]] = False
            outside = np.bincount(qq[~erased[offs]], minlength=nc) if qq.size else \
                np.zeros(nc, dtype=np.int64)
            np.bitwise_xor.at(fb, offs, masks)
            fills.append(fb)
            fixed.append(np.bincount(qq, minlength=nc) if qq.size else np.zeros(nc, np.int64))
            ok.append(good)
            cost.append(np.where(good, outside, np.iinfo(np.int64).max))
        failed = ~(ok[0] | ok[1])
        if failed.any():
            return uncorrectable(
                f"{int(failed.sum())} of {nc} chunk(s) have more errors and erasures than "
                f"2e + f <= {2 * self._t} allows")
        pick = cost[1] < cost[0]                      # per chunk: the ones-fill wins
        unit = self._unit_of(np.arange(size, dtype=np.int64), size)
        out = np.where(pick[unit], fills[1][:size], fills[0][:size])
        per_chunk_erased = np.bincount(self._unit_of(eras, size), minlength=nc)
        n = int(np.where(pick, cost[1], cost[0]).sum() + 8 * per_chunk_erased.sum())
        touched = int(((fixed[0] > 0) | (per_chunk_erased > 0)).sum())
        return DecodeResult(out.tobytes(), CORRECTED, n,
                            f"{touched} chunk(s) repaired ({eras.size} erased byte(s))")
