"""Reed-Solomon codes over GF(2^8), shortened, optionally interleaved: ``rs(n, k[, interleave])``.

Code: ``RS(n, k)`` with ``nsym = n - k`` parity bytes per codeword, primitive polynomial
``0x11d``, generator ``prod_{i<nsym} (x - alpha^i)`` (first consecutive root ``alpha^0``). This
is reedsolo's default (``RSCodec(nsym, nsize=255)``, ``fcr=0``) and galois's
``ReedSolomon(255, 255 - nsym, c=0)`` over its default ``GF(2**8)``; a codeword is the data bytes
followed by the parity bytes, byte 0 the highest-degree coefficient. Any ``n <= 255`` is a
shortened ``RS(255, 255 - nsym)``: the parity of a ``k``-byte block is the same.

Layout of ``encode(data)`` (``L = len(data)``, ``I = interleave``)::

    data (L bytes, verbatim) | parity (nsym bytes per codeword)

The data is cut into groups of ``I*k`` bytes; within a group byte ``j`` belongs to codeword
``j mod I``, so a burst of up to ``I*t`` bytes hits each codeword at most ``t`` times. The last
group may be short: it holds ``min(I, r)`` shortened codewords (``r`` = bytes in the group). The
parity of a group is interleaved the same way (parity byte ``p`` of codeword ``i`` at
``p*I + i``; in a short group at ``p*c + i`` with ``c`` codewords). The data comes first and
unchanged, so :meth:`RSCodec.systematic_data` is a zero-copy view.

Guarantees per codeword: any ``e`` symbol errors and ``f`` erasures with ``2e + f <= nsym`` are
corrected exactly (``decode(buf, erasures=offsets)``); more are reported uncorrectable or, with
small probability, miscorrected into another codeword (caught by the caller's checksum).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

import rkv.ecc._gfcore as _gfcore
import rkv.ecc._rsfix as _rsfix
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
    readonly,
    uncorrectable,
)
from rkv.ecc.gf import gf256, rs_slicing_tables
from rkv.errors import ConfigError, CorruptRecordError
from rkv.parallel import prange

I64 = npt.NDArray[np.int64]

MAX_INTERLEAVE = 1 << 16
#: Block sizes whose codeword layout a codec keeps.
LAYOUTS_CACHED = 64
#: Damaged codewords per thread when one block's decoding is split across the codec pool.
DECODE_PIECE = 128


class RSCodec(Codec):
    """Reed-Solomon ``RS(n, k)`` over GF(2^8) with optional interleaving."""

    codec_id = "rs"
    positional = ("n", "k", "interleave")

    def __init__(self, n: int = 255, k: int = 223, interleave: int = 1) -> None:
        cfg = {"id": "rs", "n": n, "k": k, "interleave": interleave}
        self._n = int_param(cfg, "rs", "n", lo=2, hi=255)
        self._k = int_param(cfg, "rs", "k", lo=1, hi=self._n - 1)
        self._i = int_param(cfg, "rs", "interleave", lo=1, hi=MAX_INTERLEAVE)
        self._nsym = self._n - self._k
        self._tables, self._w = rs_slicing_tables(self._nsym)
        self._layouts: dict[int, tuple[I64, I64]] = {}

    # ---------------------------------------------------------------- config & maths
    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> RSCodec:
        check_keys(cfg, "rs", ("n", "k", "interleave"))
        n = int_param(cfg, "rs", "n", lo=2, hi=255, default=255)
        if "k" not in cfg and n != 255:
            raise ConfigError("rs: parameter 'k' is required when 'n' is given")
        k = int_param(cfg, "rs", "k", lo=1, hi=n - 1, default=223)
        return cls(n, k, int_param(cfg, "rs", "interleave", lo=1, hi=MAX_INTERLEAVE, default=1))

    def get_config(self) -> dict[str, Any]:
        return {"id": "rs", "n": self._n, "k": self._k, "interleave": self._i}

    @property
    def n(self) -> int:
        return self._n

    @property
    def k(self) -> int:
        return self._k

    @property
    def nsym(self) -> int:
        """Parity bytes per codeword (``n - k``)."""
        return self._nsym

    @property
    def t(self) -> int:
        return self._nsym // 2

    @property
    def interleave(self) -> int:
        return self._i

    @property
    def overhead(self) -> float:
        return self._n / self._k

    def units(self, data_bytes: int) -> Units:
        """Codewords of n bytes correcting t = (n - k) // 2 (2e + f <= n - k with erasures),
        laid out as the encoder does: full groups of ``interleave`` codewords, then a short
        group whose codewords share the remaining bytes (each counted at the longest of them,
        pessimistic by under one byte). A bounded-distance decoder miscorrects a random word
        with P = V(n, t) / 256^(n-k)."""
        n, k, inter = self._n, self._k, self._i
        t = (n - k) // 2
        miss = math.exp(log_ball(n, t, 255) - 8 * (n - k) * math.log(2))
        g, r, c = self._groups(data_bytes)
        last = -(-r // inter) + (n - k) if c else 0
        return Units("rs", max(1, g * inter + c), n, t, 8, k * inter, inter,
                     miss=min(1.0, miss), last_symbols=last, short_units=c)

    @property
    def compute_bound(self) -> bool:
        return True

    @property
    def burst(self) -> int:
        """Length of a byte burst that is always corrected (``interleave * t``)."""
        return self._i * self.t

    # ---------------------------------------------------------------- layout
    def _groups(self, size: int) -> tuple[int, int, int]:
        """(full groups, bytes in the last short group, codewords in it) for ``size`` bytes."""
        g, r = divmod(size, self._i * self._k)
        return g, r, min(self._i, r)

    def encoded_size(self, n: int) -> int:
        if n < 0:
            raise ValueError("negative size")
        g, _, c = self._groups(n)
        return n + (g * self._i + c) * self._nsym

    def data_size(self, encoded_n: int) -> int:
        big_i, nsym, n = self._i, self._nsym, self._n
        g, rem = divmod(encoded_n, big_i * n)
        cands = []
        if rem % (nsym + 1) == 0:
            cands.append(rem // (nsym + 1))
        if rem - nsym * big_i >= big_i:
            cands.append(rem - nsym * big_i)
        for r in cands:
            size = g * big_i * self._k + r
            if r < big_i * self._k and self.encoded_size(size) == encoded_n:
                return size
        raise CorruptRecordError(f"{self.spec}: {encoded_n} bytes is not a valid encoded length")

    def _layout(self, size: int) -> tuple[I64, I64]:
        """(start, length) of every codeword of a ``size``-byte block, cached per size (a
        store's blocks come in a few sizes; building them costs ~7 us). Shared by every
        call, so never written (not flagged read-only: that would be another numba type)."""
        hit = self._layouts.get(size)
        if hit is None:
            lens = self._lens(size)
            starts = np.zeros_like(lens)
            np.cumsum(lens[:-1], out=starts[1:])
            hit = (starts, lens)           # never written after this
            if len(self._layouts) >= LAYOUTS_CACHED:
                self._layouts.clear()
            self._layouts[size] = hit
        return hit

    def _lens(self, size: int) -> I64:
        g, r, c = self._groups(size)
        lens = np.full(g * self._i + c, self._k, dtype=np.int64)
        if c:
            i = np.arange(c, dtype=np.int64)
            lens[g * self._i :] = (r - i + self._i - 1) // self._i
        return lens

    def _to_codewords(self, d: U8) -> U8:
        """The data rearranged codeword after codeword (a view when not interleaved)."""
        if self._i == 1:
            return d
        big_i, k = self._i, self._k
        g, _, c = self._groups(d.shape[0])
        full = d[: g * big_i * k].reshape(g, k, big_i).transpose(0, 2, 1).reshape(-1)
        tail = d[g * big_i * k :]
        out = np.concatenate([full, *(tail[i::big_i] for i in range(c))])
        return readonly(out)

    def _parity_to_stream(self, par: U8, size: int) -> U8:
        if self._i == 1:
            return np.ascontiguousarray(par).reshape(-1)
        g = self._groups(size)[0]
        big_i, nsym = self._i, self._nsym
        full = par[: g * big_i].reshape(g, big_i, nsym).transpose(0, 2, 1).reshape(-1)
        tail = par[g * big_i :].T.reshape(-1)
        return np.concatenate([full, tail])

    def _stream_to_parity(self, stream: U8, size: int) -> U8:
        nsym = self._nsym
        if self._i == 1:
            return stream.reshape(-1, nsym)
        g, _, c = self._groups(size)
        big_i = self._i
        nf = g * big_i * nsym
        full = stream[:nf].reshape(g, nsym, big_i).transpose(0, 2, 1).reshape(-1, nsym)
        tail = stream[nf:].reshape(nsym, c).T
        return np.concatenate([full, tail])

    def _map_erasures(self, offs: I64, size: int, lens: I64) -> tuple[I64, I64]:
        """Erasure byte offsets in the encoded buffer -> (codeword index, position in it)."""
        big_i, k, nsym = self._i, self._k, self._nsym
        g, _, c = self._groups(size)
        q = np.empty_like(offs)
        p = np.empty_like(offs)
        dm = offs < size
        od = offs[dm]
        grp, j = np.divmod(od, big_i * k)
        q[dm] = grp * big_i + j % big_i
        p[dm] = j // big_i
        po = offs[~dm] - size
        fm = po < g * big_i * nsym
        qp = np.empty_like(po)
        pp = np.empty_like(po)
        grp, j = np.divmod(po[fm], big_i * nsym)
        qp[fm] = grp * big_i + j % big_i
        pp[fm] = j // big_i
        if c:
            j = po[~fm] - g * big_i * nsym
            qp[~fm] = g * big_i + j % c
            pp[~fm] = j // c
        q[~dm] = qp
        p[~dm] = lens[qp] + pp
        return q, p

    def _data_offsets(self, q: I64, p: I64) -> I64:
        """Offsets in the data of byte ``p`` of codeword ``q`` (as :mod:`._rsfix` computes)."""
        big_i = self._i
        return (q // big_i) * big_i * self._k + p * big_i + q % big_i

    # ---------------------------------------------------------------- coding
    def encode(self, data: BytesLike) -> bytes:
        d = as_u8(data)
        return b"".join((d.data, self.encode_tail(d)))

    def encode_tail(self, data: U8) -> bytes:
        """The parity stream that follows the data."""
        size = data.shape[0]
        if size == 0:
            return b""
        starts, lens = self._layout(size)
        par = lfsr_parity(self._to_codewords(data), starts, lens, self._tables, self._w)
        return self._parity_to_stream(par[:, : self._nsym], size).tobytes()

    def systematic_data(self, buf: BytesLike) -> U8:
        b = as_u8(buf)
        return b[: self.data_size(b.shape[0])]

    def decode(self, buf: BytesLike, erasures: Iterable[int] | None = None) -> DecodeResult:
        b = as_u8(buf)
        size = self.data_size(b.shape[0])
        eras = normalize_erasures(erasures, b.shape[0])
        if size == 0:
            return clean(b"")
        nsym = self._nsym
        starts, lens = self._layout(size)
        calc = lfsr_parity(self._to_codewords(b[:size]), starts, lens, self._tables, self._w)
        ncw = lens.shape[0]
        rem = np.empty((ncw, nsym), dtype=np.uint8)
        bad = np.empty(ncw, dtype=np.int64)
        nb = _rsfix.remainders(calc, readonly(self._stream_to_parity(b[size:], size)), rem,
                               bad)
        eq = ep = np.zeros(0, dtype=np.int64)
        if eras.size:
            eq, ep = self._map_erasures(eras, size, lens)
            counts = np.bincount(eq, minlength=ncw)
            over = counts > nsym
            if over.any():
                return uncorrectable(
                    f"{int(over.sum())} codeword(s) have more than {nsym} erasures"
                )
        if nb == 0:
            return clean(b[:size].tobytes())
        bad, sub = bad[:nb], rem[:nb]
        if eq.size:
            order = np.lexsort((ep, eq))
            eq, ep = eq[order], ep[order]
            lo = np.searchsorted(eq, bad, side="left")
            hi = np.searchsorted(eq, bad, side="right")
            cnt = hi - lo
            eptr = np.zeros(bad.size + 1, dtype=np.int64)
            np.cumsum(cnt, out=eptr[1:])
            sel = np.concatenate([np.arange(a, z) for a, z in zip(lo, hi, strict=True)])
            epos = np.ascontiguousarray(ep[sel.astype(np.int64)], dtype=np.int64)
        else:
            eptr = np.zeros(bad.size + 1, dtype=np.int64)
            epos = np.zeros(0, dtype=np.int64)
        f = gf256()
        out_pos = np.zeros((bad.size, nsym), dtype=np.int64)
        out_mag = np.zeros((bad.size, nsym), dtype=np.int64)
        out_cnt = np.zeros(bad.size, dtype=np.int64)
        nlens = np.ascontiguousarray(lens[bad] + nsym)

        def solve(a: int, z: int) -> None:   # codewords a..z-1 (eptr indexes all of epos)
            _gfcore.rs_decode_batch(sub[a:z], nlens[a:z], eptr[a:z + 1], epos, f.exp, f.log,
                                    f.qsol, out_pos[a:z], out_mag[a:z], out_cnt[a:z])

        prange(solve, bad.size, bad.size, DECODE_PIECE)
        out = b[:size].copy()
        total = _rsfix.apply_fixes(out, bad, lens, out_pos, out_mag, out_cnt, self._i, self._k)
        if total < 0:
            return uncorrectable(
                f"{int((out_cnt < 0).sum())} of {ncw} codeword(s) have more errors than "
                f"RS({self._n},{self._k}) corrects"
            )
        return DecodeResult(out.tobytes(), CORRECTED, total, f"{bad.size} codeword(s) repaired")
