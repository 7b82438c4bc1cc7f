"""Block-level Reed-Solomon across shards: ``shardrs(k=K, m=M[, checksum=xxh3|crc32c])``.

The data is split into ``K`` equal data shards and ``M`` parity shards are added so that byte
``c`` of all ``K+M`` shards is one codeword of ``RS(K+M, K)`` over GF(2^8) (the conventions of
:mod:`rkv.ecc.rs`: polynomial ``0x11d``, roots ``alpha^0 .. alpha^(M-1)``, shard 0 is the
highest-degree symbol; so reedsolo's ``RSCodec(M, nsize=255)`` encodes each column of data
bytes to the same parity bytes). No data moves: shards are contiguous slices and the parity is
computed for all columns at once.

Layout of ``encode(data)`` (``L = len(data)``, ``S`` the shard size, a multiple of 8 with
``K*S >= L + 8``)::

    data (L) | zero pad | L as 8-byte LE   <- K data shards of S bytes
    parity shards (M * S)
    checksum of every shard (K+M entries: 8-byte LE xxh3_64, or 4-byte LE crc32c)

The data comes first and unchanged: :meth:`ShardRSCodec.systematic_data` is a zero-copy view.
The length field sits inside the last data shard, so it is covered by that shard's checksum
and by the code.

Decoding: a shard whose checksum fails is an erasure. Up to ``M`` erased shards are rebuilt
from ``K`` intact ones (a shard is trusted when its checksum matches: the chance that a
corrupted shard matches is ``2^-64`` with xxh3, ``2^-32`` with crc32c); with fewer than ``M``
erasures the spare intact shards must agree with the rebuilt codeword. With more than ``M``
failing shards (or if that cross-check fails) every column is decoded on its own, correcting
up to ``floor(M/2)`` bad bytes per column (``e`` errors next to ``f`` bytes of the column
the medium reported unreadable, passed as ``erasures``, when ``2e + f <= M``), and at least
``K`` shards must then pass their checksums: ``K`` trusted shards fix every column (the code
is MDS), so a shard that still fails has a damaged checksum entry, not damaged data, and a
flipped bit in the checksum table never turns a correctable block into a loss.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any

import numpy as np
import numpy.typing as npt
import xxhash

import rkv.ecc._gfcore as _gfcore
import rkv.ecc._shard as _shard
from rkv.ecc.base import (
    CORRECTED,
    U8,
    BytesLike,
    Codec,
    DecodeResult,
    Units,
    as_u8,
    check_keys,
    choice_param,
    clean,
    int_param,
    normalize_erasures,
    readonly,
    uncorrectable,
)
from rkv.ecc.crc32c import crc32c
from rkv.ecc.gf import gf256, gf256_inv, gf256_matmul, rs_check_matrix, rs_parity_matrix
from rkv.errors import CorruptRecordError
from rkv.format.record import SPREAD_AT

U64 = npt.NDArray[np.uint64]

CHECKSUMS = ("xxh3", "crc32c")
LEN_FIELD = 8


def _xxh3(b: U8) -> bytes:
    return int(xxhash.xxh3_64_intdigest(b.data)).to_bytes(8, "little")


def _crc(b: U8) -> bytes:
    return crc32c(b).to_bytes(4, "little")


def _words(b: U8, rows: int) -> U64:
    """``b`` (rows * S bytes) as a read-only ``(rows, S/8)`` uint64 matrix (copy if misaligned)."""
    if b.ctypes.data % 8:
        b = np.array(b, dtype=np.uint8)
    return readonly(b.view(np.uint64).reshape(rows, -1))


@lru_cache(maxsize=64)
def _recovery_matrix(k: int, m: int, survivors: tuple[int, ...]) -> U8:
    """Rows ``G[s] @ inv(G[survivors])`` for every shard ``s`` not among the ``k`` survivors."""
    g = np.concatenate([np.eye(k, dtype=np.uint8), rs_parity_matrix(k, m)])
    rest = [s for s in range(k + m) if s not in set(survivors)]
    r = gf256_matmul(g[rest], gf256_inv(g[list(survivors)]))
    r.flags.writeable = False
    return r


class ShardRSCodec(Codec):
    """``k`` data shards + ``m`` parity shards, each with its own checksum."""

    codec_id = "shardrs"
    positional = ("k", "m", "checksum")

    def __init__(self, k: int = 16, m: int = 2, checksum: str = "xxh3") -> None:
        cfg: dict[str, Any] = {"id": "shardrs", "k": k, "m": m, "checksum": checksum}
        self._k = int_param(cfg, "shardrs", "k", lo=1, hi=254)
        self._m = int_param(cfg, "shardrs", "m", lo=1, hi=255 - self._k)
        self._cs = choice_param(cfg, "shardrs", "checksum", CHECKSUMS, "xxh3")
        self._csize = 8 if self._cs == "xxh3" else 4
        self._digest = _xxh3 if self._cs == "xxh3" else _crc

    # ---------------------------------------------------------------- config & maths
    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> ShardRSCodec:
        check_keys(cfg, "shardrs", ("k", "m", "checksum"))
        k = int_param(cfg, "shardrs", "k", lo=1, hi=254, default=16)
        m = int_param(cfg, "shardrs", "m", lo=1, hi=255 - k, default=2 if k <= 253 else 1)
        return cls(k, m, choice_param(cfg, "shardrs", "checksum", CHECKSUMS, "xxh3"))

    def get_config(self) -> dict[str, Any]:
        return {"id": "shardrs", "k": self._k, "m": self._m, "checksum": self._cs}

    @property
    def n(self) -> int:
        """Shards in all (``k + m``)."""
        return self._k + self._m

    @property
    def k(self) -> int:
        return self._k

    @property
    def m(self) -> int:
        """Parity shards: up to ``m`` lost shards are recovered."""
        return self._m

    @property
    def t(self) -> int:
        """Bad bytes per column corrected without erasure information."""
        return self._m // 2

    @property
    def checksum(self) -> str:
        return self._cs

    @property
    def overhead(self) -> float:
        return (self._k + self._m) / self._k

    def units(self, data_bytes: int) -> Units:
        """One unit of k + m shards of ``shard_size`` bytes, each with a checksum entry: m
        lost shards are rebuilt, and columns are decoded on their own beyond that."""
        return Units("shard", 1, self._k + self._m, self._m, 8 * self.shard_size(data_bytes),
                     data_bytes, shard_bytes=self.shard_size(data_bytes),
                     check_bytes=self._csize, miss=2.0 ** -(8 * self._csize))

    # ---------------------------------------------------------------- layout
    def spread_framing(self, data_bytes: int) -> bool:
        """Spread the framing when a shard is at least a sector: a lost sector then damages
        at most one byte of any column, so two lost sectors anywhere in the payload are two
        erasures per column at most, within ``m >= 2``; the framing must not be lost first.
        (With smaller shards one sector spans several shards of a column: no layout helps.)"""
        return self._m >= 2 and self.shard_size(data_bytes) >= SPREAD_AT

    def shard_size(self, n: int) -> int:
        """Bytes per shard for ``n`` data bytes."""
        s = -(-(n + LEN_FIELD) // self._k)
        return (s + 7) // 8 * 8

    def encoded_size(self, n: int) -> int:
        if n < 0:
            raise ValueError("negative size")
        return (self._k + self._m) * (self.shard_size(n) + self._csize)

    def _shard_size_of(self, encoded_n: int) -> int:
        nsh = self._k + self._m
        per, rem = divmod(encoded_n, nsh)
        s = per - self._csize
        if rem or s < 8 or s % 8 or self._k * s < LEN_FIELD:
            raise CorruptRecordError(
                f"{self.spec}: {encoded_n} bytes is not a valid encoded length"
            )
        return s

    def _length(self, shards: U8, s: int) -> int | None:
        """The data length stored in the shards, or None if inconsistent with ``s``."""
        return self._length_of_last(shards[(self._k - 1) * s : self._k * s])

    def data_size(self, encoded_n: int) -> int:
        """Not a function of the length alone: use :meth:`decode`. Raises for impossible
        lengths and otherwise returns the largest data size the length allows."""
        s = self._shard_size_of(encoded_n)
        return self._k * s - LEN_FIELD

    def systematic_data(self, buf: BytesLike) -> U8 | None:
        b = as_u8(buf)
        s = self._shard_size_of(b.shape[0])
        size = self._length(b, s)
        return None if size is None else b[:size]

    # ---------------------------------------------------------------- coding
    def _parity(self, ra: U64, rb: U64, s8: int) -> U64:
        out = np.empty((self._m, s8), dtype=np.uint64)
        if self._m == 2:
            _shard.parity_m2(ra, rb, out)
        else:
            tmp = np.empty((8, _shard.BLOCK_WORDS), dtype=np.uint64)
            _shard.lincomb(ra, rb, rs_parity_matrix(self._k, self._m), out, tmp)
        return out

    def encode(self, data: BytesLike) -> bytes:
        d = as_u8(data)
        return b"".join((d.data, self.encode_tail(d)))

    def encode_tail(self, data: U8) -> bytes:
        """Padding, length field, parity shards and checksums: all that follows the data."""
        d = data
        size = d.shape[0]
        k = self._k
        s = self.shard_size(size)
        j0 = size // s  # data shards filled entirely from the input (< k)
        tail = np.zeros((k - j0) * s, dtype=np.uint8)
        tail[: size - j0 * s] = d[j0 * s :]
        tail[-LEN_FIELD:] = np.frombuffer(size.to_bytes(LEN_FIELD, "little"), dtype=np.uint8)
        tail = readonly(tail)
        ra = _words(d[: j0 * s], j0) if j0 else readonly(np.zeros((0, s // 8), np.uint64))
        rb = readonly(tail.view(np.uint64).reshape(k - j0, s // 8))
        par = self._parity(ra, rb, s // 8)
        pb = readonly(par.view(np.uint8).reshape(-1))
        dig = self._digest
        sums = [dig(d[j * s : (j + 1) * s]) for j in range(j0)]
        sums += [dig(tail[j * s : (j + 1) * s]) for j in range(k - j0)]
        sums += [dig(pb[j * s : (j + 1) * s]) for j in range(self._m)]
        return b"".join((tail[size - j0 * s :].data, pb.data, *sums))

    def decode(self, buf: BytesLike, erasures: Iterable[int] | None = None) -> DecodeResult:
        """Decode; ``erasures`` (byte offsets) mark the shards holding them as lost."""
        b = as_u8(buf)
        s = self._shard_size_of(b.shape[0])
        k, m = self._k, self._m
        nsh = k + m
        eras = normalize_erasures(erasures, b.shape[0])
        shards = b[: nsh * s]
        sums = b[nsh * s :]
        cs = self._csize
        # Checksum entries the medium reported lost say nothing: their shards are unknown.
        unknown = {int(x) for x in np.unique((eras[eras >= nsh * s] - nsh * s) // cs)}
        failed = [
            j
            for j in range(nsh)
            if j in unknown
            or self._digest(shards[j * s : (j + 1) * s]) != sums[j * cs : (j + 1) * cs].tobytes()
        ]
        lost = set(failed)
        in_shards = eras[eras < nsh * s]
        lost.update(int(x) for x in np.unique(in_shards // s))
        if not lost:
            size = self._length(shards, s)
            if size is None:  # pragma: no cover - needs a checksum collision
                return uncorrectable("length field inconsistent")
            return clean(shards[:size].tobytes())
        rows = _words(shards, nsh)
        if len(lost) <= m:
            rec = self._recover(rows, sorted(lost), s)
            if rec is not None:
                repl, n_fixed = rec
                last = repl.get(k - 1, shards[(k - 1) * s : k * s])
                size = self._length_of_last(last)
                if size is not None:
                    return DecodeResult(
                        self._assemble(shards, s, repl, size), CORRECTED, n_fixed,
                        f"{len(lost)} shard(s) rebuilt",
                    )
        res = self._correct_columns(rows, s, sums, in_shards, len(unknown))
        if res is None:
            return uncorrectable(
                f"{len(lost)} shard(s) failed their checksum and column decoding failed"
            )
        fixed, n_fixed = res
        size = self._length(fixed, s)
        if size is None:
            return uncorrectable("length field inconsistent after repair")
        detail = "corrected column by column"
        return DecodeResult(fixed[:size].tobytes(), CORRECTED, n_fixed, detail)

    def _length_of_last(self, last: U8) -> int | None:
        """The length field at the end of the last data shard ``last``, if consistent."""
        size = int.from_bytes(last[-LEN_FIELD:].tobytes(), "little")
        s = last.shape[0]
        if size > self._k * s - LEN_FIELD or self.shard_size(size) != s:
            return None
        return size

    def _assemble(self, shards: U8, s: int, repl: dict[int, U8], size: int) -> bytes:
        """The first ``size`` bytes of the data shards, rebuilt ones from ``repl``."""
        pieces = []
        for j in range(-(-size // s)):
            take = min(s, size - j * s)
            src = repl.get(j)
            piece = src[:take] if src is not None else shards[j * s : j * s + take]
            pieces.append(piece.data)
        return b"".join(pieces)

    def _recover(self, rows: U64, lost: list[int], s: int) -> tuple[dict[int, U8], int] | None:
        """Rebuild ``lost`` shards from the first ``k`` intact ones; check the spare ones.

        Returns the rebuilt shards (as bytes) and how many of their bytes changed.
        """
        k, m = self._k, self._m
        nsh = k + m
        good = [j for j in range(nsh) if j not in lost]
        surv = tuple(good[:k])
        rest = [j for j in range(nsh) if j not in surv]
        coef = np.zeros((len(rest), nsh), dtype=np.uint8)  # zero columns cost nothing
        coef[:, list(surv)] = _recovery_matrix(k, m, surv)
        out = np.empty((len(rest), rows.shape[1]), dtype=np.uint64)
        tmp = np.empty((8, _shard.BLOCK_WORDS), dtype=np.uint64)
        empty = readonly(np.zeros((0, rows.shape[1]), dtype=np.uint64))
        _shard.lincomb(rows, empty, coef, out, tmp)
        repl: dict[int, U8] = {}
        n_fixed = 0
        for i, j in enumerate(rest):
            if j in lost:
                new = readonly(out[i].view(np.uint8))
                repl[j] = new
                n_fixed += int(np.count_nonzero(new != rows[j].view(np.uint8)))
            elif not np.array_equal(out[i], rows[j]):
                return None  # an intact spare shard disagrees: not a clean erasure pattern
        return repl, n_fixed

    def _correct_columns(self, rows: U64, s: int, sums: U8, erased: np.ndarray,
                         unknown: int = 0) -> tuple[U8, int] | None:
        """Decode every column on its own, the bytes the medium reported (``erased``, offsets
        into the shards) as erasures: a column with ``f`` erased and ``e`` other bad bytes is
        fixed when ``2e + f <= m``. The result must pass enough checksums (below);
        ``unknown`` checksum entries were reported lost and cannot pass."""
        k, m = self._k, self._m
        nsh = k + m
        synd = np.empty((m, rows.shape[1]), dtype=np.uint64)
        tmp = np.empty((8, _shard.BLOCK_WORDS), dtype=np.uint64)
        empty = readonly(np.zeros((0, rows.shape[1]), dtype=np.uint64))
        _shard.lincomb(rows, empty, np.ascontiguousarray(rs_check_matrix(nsh, m)), synd, tmp)
        sb = synd.view(np.uint8).reshape(m, s)
        cols = np.flatnonzero(sb.any(axis=0)).astype(np.int64)
        fixed = rows.view(np.uint8).reshape(-1).copy()
        total = 0
        if cols.size:
            # Columns grouped by which shards are erased in them (a few contiguous ranges
            # make a few groups); each group is decoded with its own erasure positions.
            mask = np.zeros((nsh, s), dtype=bool)
            mask[erased // s, erased % s] = True
            sig = np.packbits(mask[:, cols], axis=0).T        # one row of bits per column
            groups, inverse = np.unique(sig, axis=0, return_inverse=True)
            f = gf256()
            for g in range(groups.shape[0]):
                gc = cols[inverse.reshape(-1) == g]
                epos = np.flatnonzero(mask[:, gc[0]]).astype(np.int64)
                if epos.size > m:
                    return None
                out_pos = np.zeros((gc.size, m + 2), dtype=np.int64)
                out_mag = np.zeros((gc.size, m + 2), dtype=np.int64)
                out_cnt = np.zeros(gc.size, dtype=np.int64)
                _gfcore.rs_decode_columns(sb, gc, nsh, epos, f.exp, f.log, f.qsol, out_pos,
                                          out_mag, out_cnt)
                if (out_cnt < 0).any():
                    return None
                sel = np.arange(out_pos.shape[1])[None, :] < out_cnt[:, None]
                cc = np.broadcast_to(gc[:, None], sel.shape)[sel]
                fixed[out_pos[sel] * s + cc] ^= out_mag[sel].astype(np.uint8)
                total += int(out_cnt.sum())
        # Every column is now a codeword. If at least k shards pass their checksums, those k
        # trusted shards determine every column (the code is MDS: two codewords differ in at
        # least m + 1 places), so the other shards' bytes are right too and only their
        # checksum entries are damaged. A miscorrected column would disagree with the trusted
        # shards, so it cannot get here unless a checksum collides (2^-64 or 2^-32 a shard).
        # With more than m entries reported lost (a lost sector over the table) no k shards
        # can be checked: every shard that can be checked must pass, and the end-to-end
        # checksum of the caller judges the rest (an erasure decoding within m is exact; a
        # miscorrection there is a ChecksumError, never data).
        fr = readonly(fixed)
        cs = self._csize
        passing = sum(
            self._digest(fr[j * s : (j + 1) * s]) == sums[j * cs : (j + 1) * cs].tobytes()
            for j in range(nsh))
        if passing < min(k, nsh - unknown):
            return None
        return fixed, total
