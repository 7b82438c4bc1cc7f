"""Reading records from an LMDB map without touching the map: ``reads = "pread"``.

A zero-copy read of an mmapped record dereferences the map. If the page under it is gone (a
hardware-poisoned DRAM or CXL line: the kernel marks the page and delivers SIGBUS on access;
a file truncated under the map), the process dies with SIGBUS, which Python cannot catch in a
C copy loop. A ``pread`` of the same bytes from the data file returns ``EIO`` (or a short read)
instead, so the medium's failure becomes a typed :class:`~rkv.errors.MediumError` carrying the
ranges that failed, and the decoders rebuild them as erasures.

LMDB's own lookup still walks its B-tree pages through the map: those pages are a small part
of a tier holding KV blocks (values of tens of KiB and more live in overflow pages, which only
the record copy touches), and a fault there stays a SIGBUS.

The file offset of a value is its address minus the start of the map, found once in
``/proc/self/maps`` (Linux) and again whenever an address falls outside it (the map moved).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import numba
import numpy as np
from numba import types
from numba.extending import intrinsic

from rkv.errors import MediumError, StoreError

#: Granularity of the retry after a failed read: a page of the file (and of the page cache).
PAGE = 4096


@intrinsic
def _data_pointer(typingctx: Any, buf: Any) -> Any:
    """The address of a buffer's first byte (numba typing and code generation)."""
    sig = types.intp(buf)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        return builder.ptrtoint(ary.data, context.get_value_type(types.intp))

    return sig, codegen


@numba.njit(cache=True)
def _start(view: memoryview) -> int:
    return _data_pointer(view)  # type: ignore[call-arg,no-any-return]


def address(view: Any) -> int:
    """Start address of a buffer, without reading it (no page is touched). Compiled: with
    numpy (``__array_interface__`` builds a dict per call) it took 1.6-2.5 us of every read
    of a record, this 0.3 us."""
    if type(view) is not memoryview:
        view = memoryview(view)
    return int(_start(view.cast("B") if view.format != "B" else view))


class MapFile:
    """The data file behind one LMDB map, read with ``pread`` at the map's offsets."""

    def __init__(self, data_file: Path) -> None:
        self.path = os.path.realpath(data_file)
        self.fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        self._lo = self._hi = self._base = 0
        self._unmapped = False

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def _locate(self, addr: int) -> int:
        """The file offset of map address ``addr``."""
        if not self._lo <= addr < self._hi:
            try:
                with open("/proc/self/maps", encoding="ascii", errors="replace") as f:
                    rows = [ln.split() for ln in f if ln.rstrip().endswith(self.path)]
            except OSError as exc:
                raise StoreError(f"cannot find the map of {self.path}: {exc}") from exc
            for row in rows:
                lo, hi = (int(x, 16) for x in row[0].split("-"))
                if lo <= addr < hi:
                    self._lo, self._hi, self._base = lo, hi, lo - int(row[2], 16)
                    break
            else:
                raise StoreError(f"{self.path} is not mapped where LMDB's value lies "
                                 "(reads = 'pread' needs Linux's /proc/self/maps)")
        return addr - self._base

    def offset(self, view: Any) -> int:
        """The file offset of the value ``view`` points at (no page of it is touched)."""
        return self._locate(address(view))

    def end(self, view: memoryview) -> int | None:
        """The file offset just past the value ``view`` (no page of it is touched); None
        where the map cannot be found (no ``/proc/self/maps``: not Linux)."""
        addr = address(view)
        if self._lo <= addr < self._hi:          # the common case, without a call
            return addr - self._base + view.nbytes
        if self._unmapped:
            return None
        try:
            return self._locate(addr) + view.nbytes
        except StoreError:
            if os.path.exists("/proc/self/maps"):
                raise
            self._unmapped = True
            return None

    def read(self, view: Any, key: bytes) -> memoryview:
        """A copy of the value ``view`` points at, read from the file. Raises MediumError
        with the failed ranges (the rest of the record filled in, the failed bytes zero)."""
        n = memoryview(view).nbytes
        off = self._locate(address(view))
        out = np.empty(n, dtype=np.uint8)
        try:
            got = os.preadv(self.fd, [out.data], off)
        except OSError as exc:
            if exc.errno != errno.EIO:
                raise StoreError(f"reading {self.path}: {exc}") from exc
            got = -1
        if got == n:
            return out.data
        return self._salvage(out, off, key)

    def _salvage(self, out: np.ndarray, off: int, key: bytes) -> memoryview:
        """Read page by page; every page that fails or lies past the end is a lost range."""
        n = out.size
        ranges: list[tuple[int, int]] = []
        pos = 0
        while pos < n:
            step = min(n - pos, PAGE - (off + pos) % PAGE)
            piece = out[pos:pos + step]
            try:
                got = os.preadv(self.fd, [piece.data], off + pos)
            except OSError as exc:
                if exc.errno != errno.EIO:
                    raise StoreError(f"reading {self.path}: {exc}") from exc
                got = 0
            if got < step:
                piece[max(got, 0):] = 0
                start = pos + max(got, 0)
                if ranges and ranges[-1][0] + ranges[-1][1] == start:
                    ranges[-1] = (ranges[-1][0], ranges[-1][1] + step - max(got, 0))
                else:
                    ranges.append((start, step - max(got, 0)))
            pos += step
        lost = sum(k for _, k in ranges)
        raise MediumError(f"{self.path}: {lost} byte(s) of record {key.hex()[:16]} could not "
                          f"be read ({len(ranges)} range(s))", tuple(ranges), out.data)
