"""An LMDB data file checked from its meta pages, with ``pread``, before anything maps it.

LMDB reads its pages through a shared map of ``data.mdb``. A page of the map that lies past
the end of the file (a file cut short by a full disk during a copy, a failed restore, a
crashed filesystem, a truncating process) raises SIGBUS on first touch, which ends the
process. LMDB itself never compares the file's length with the pages its meta records, and
a damaged meta page can make it remap the file at a garbage size.

So every environment is checked here before it is mapped and again before each transaction
whenever the file's length, times or link count changed since the last check (one ``fstat``
otherwise). The check reads both meta pages with ``pread`` (never the map), picks the
committed one as LMDB does (the higher transaction id) and requires that both carry LMDB's
magic and data version, agree on the page size, and that the committed one's map size and
database roots are consistent.

The file must also hold every page up to the committed meta's last page. LMDB itself does
not keep that promise: pages a transaction allocated and freed again are counted but never
written, so a healthy file may end a few pages early (those pages are free and never read).
A short file is therefore *covered*: extended with zeros up to its last page (``fallocate``,
which never touches existing bytes, so a concurrent writer is safe). Lost pages that were in
use then read as zero pages, which LMDB reports as ``MDB_CORRUPTED`` and the structural check
finds, instead of a SIGBUS. Where the file cannot be written (a read-only open or medium),
the whole file is verified instead (py-lmdb's offline verifier reads with ``pread``): a short
file whose missing pages are all free passes, any other is damaged. Pages past the committed
last page are refused by LMDB itself (``MDB_PAGE_NOTFOUND``). Only a file cut short *while a
transaction is reading it* can still fault (nothing in user space prevents that).
A failed check is a :class:`~rkv.errors.CorruptStoreError`: the environment is damaged.
"""

from __future__ import annotations

import os
import stat
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

import lmdb
import lmdb.verify as lmdb_verify

from rkv.errors import CorruptStoreError

MAGIC = 0xBEEFC0DE
#: The page header before a meta record, and the data version, by LMDB's major version
#: (0.9 and 1.0 lay meta pages out differently).
_HEADER, _VERSION = (16, 1) if lmdb.version()[0] == 0 else (24, 3)
_DB = 48                        # sizeof(MDB_db)
_META = 24 + 2 * _DB + 16       # magic .. txnid
_E = "<" if sys.byteorder == "little" else ">"
_U32 = struct.Struct(_E + "I")
_U64 = struct.Struct(_E + "Q")
P_INVALID = (1 << 64) - 1
#: The largest map any environment may ask for: x86-64 and arm64 user address space.
MAX_MAP = 1 << 47
#: The largest page size LMDB writes (0.9: 32 KiB, 1.0: 64 KiB).
MAX_PAGE = 1 << 16


@dataclass(frozen=True)
class Meta:
    """What the committed meta page of a data file says."""

    psize: int
    last_pg: int
    txnid: int
    mapsize: int

    @property
    def needed_bytes(self) -> int:
        """The length the file must have to hold every page this meta names."""
        return (self.last_pg + 1) * self.psize


@dataclass(frozen=True)
class _Raw:
    magic: int
    version: int
    mapsize: int
    psize: int
    roots: tuple[int, int]
    last_pg: int
    txnid: int


def _parse(buf: bytes) -> _Raw:
    m = _HEADER
    magic, version = _U32.unpack_from(buf, m)[0], _U32.unpack_from(buf, m + 4)[0]
    mapsize = _U64.unpack_from(buf, m + 16)[0]
    free, main = m + 24, m + 24 + _DB
    psize = _U32.unpack_from(buf, free)[0]          # mm_psize aliases the free DB's md_pad
    roots = (_U64.unpack_from(buf, free + 40)[0], _U64.unpack_from(buf, main + 40)[0])
    last_pg = _U64.unpack_from(buf, m + 24 + 2 * _DB)[0]
    txnid = _U64.unpack_from(buf, m + 24 + 2 * _DB + 8)[0]
    return _Raw(magic, version, mapsize, psize, roots, last_pg, txnid)


def _pread(fd: int, n: int, off: int, where: str) -> bytes:
    try:
        return os.pread(fd, n, off)
    except OSError as exc:
        raise CorruptStoreError(f"{where}: its meta pages cannot be read ({exc})") from exc


def read_meta(fd: int, size: int, where: str, psize: int = 0) -> Meta:
    """The committed meta of the data file open at ``fd`` (``size`` bytes long), checked
    against the file; ``psize``: the page size the environment was opened with (0: take it
    from meta page 0, as LMDB does at open). Raises :class:`CorruptStoreError`."""
    want = _HEADER + _META
    first = _pread(fd, want, 0, where)
    if len(first) < want:
        raise CorruptStoreError(f"{where}: the data file is {size} bytes, too short for "
                                "its meta pages (cut short?)")
    m0 = _parse(first)
    ps = psize or m0.psize
    if ps < 512 or ps > MAX_PAGE or ps & (ps - 1):
        raise CorruptStoreError(f"{where}: meta page 0 is damaged (page size {ps})")
    if size < 2 * ps:
        raise CorruptStoreError(f"{where}: the data file is {size} bytes, shorter than its "
                                f"two meta pages of {ps} bytes (cut short?)")
    second = _pread(fd, want, ps, where)
    if len(second) < want:
        raise CorruptStoreError(f"{where}: meta page 1 cannot be read (file cut short?)")
    m1 = _parse(second)
    for i, m in enumerate((m0, m1)):
        if m.magic != MAGIC or m.version != _VERSION or m.psize != ps:
            raise CorruptStoreError(f"{where}: meta page {i} is damaged (magic {m.magic:#x}, "
                                    f"version {m.version}, page size {m.psize})")
    meta = m1 if m0.txnid < m1.txnid else m0
    if meta.last_pg < 1 or meta.last_pg >= MAX_MAP // ps:
        raise CorruptStoreError(f"{where}: the committed meta page is damaged (last page "
                                f"{meta.last_pg})")
    need = (meta.last_pg + 1) * ps
    if not need <= meta.mapsize <= MAX_MAP or meta.mapsize % ps:
        raise CorruptStoreError(f"{where}: the committed meta page is damaged (map size "
                                f"{meta.mapsize})")
    for root in meta.roots:
        if root != P_INVALID and not 2 <= root <= meta.last_pg:
            raise CorruptStoreError(f"{where}: the committed meta page is damaged (a database "
                                    f"root at page {root}, last page {meta.last_pg})")
    return Meta(ps, meta.last_pg, meta.txnid, meta.mapsize)


def cover(data_file: Path, fd: int, size: int, meta: Meta, where: str,
          writable: bool) -> None:
    """Make a data file shorter than its committed meta says safe to map (see the module
    docstring): extend it with zeros, or, when it cannot be written, verify it whole."""
    if size >= meta.needed_bytes:
        return
    if writable:
        try:
            wfd = os.open(data_file, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            wfd = -1
        if wfd >= 0:
            try:
                os.posix_fallocate(wfd, size, meta.needed_bytes - size)
                return
            except OSError:
                pass       # a full disk, a filesystem without fallocate: verify instead
            finally:
                os.close(wfd)
    try:
        problems = lmdb_verify.verify(str(data_file), subdir=False)  # type: ignore[no-untyped-call]
    except (lmdb_verify.VerifyError, OSError, ValueError) as exc:
        problems = [str(exc)]
    if problems:
        raise CorruptStoreError(
            f"{where}: the data file is {size} bytes but its committed meta (transaction "
            f"{meta.txnid}) names pages up to {meta.last_pg} ({meta.needed_bytes} bytes), "
            f"and pages in use are missing: it was cut short ({problems[0]})")


def check_path(data_file: Path, where: str, writable: bool) -> Meta | None:
    """Check (and where it is short, cover) an existing data file before it is opened
    (None: there is none, or it is empty, which LMDB initialises as a new environment)."""
    try:
        fd = os.open(data_file, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    except OSError as exc:
        if os.path.isdir(data_file):
            raise CorruptStoreError(f"{where}: {data_file} is a directory") from exc
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CorruptStoreError(f"{where}: {data_file} is not a regular file")
        if st.st_size == 0:
            return None
        meta = read_meta(fd, st.st_size, where)
        cover(data_file, fd, st.st_size, meta, where, writable)
        return meta
    finally:
        os.close(fd)


class FileGuard:
    """The data file of one open environment, re-checked when it changes.

    :meth:`check` costs one ``fstat`` while the file is as last checked; when its length,
    times or link count moved, the meta pages are read again (and a short file covered). A
    change that no commit explains (the same transaction is committed, and the file shrank
    or was rewritten at the same length) makes the guard *suspect* the file: something may
    have written into it behind LMDB's back. A commit of another process seen half way
    looks the same, so :attr:`tampered` (asked under the store's writer lock, when no commit
    is in flight) confirms it: the suspicion holds only if that transaction is still the
    committed one. ``limit`` is the file's length at the last check (a value must end
    inside it)."""

    def __init__(self, data_file: Path, where: str, psize: int, writable: bool) -> None:
        self.path = data_file
        self.where = where
        self.psize = psize
        self.writable = writable
        self.fd = os.open(data_file, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        self._seen: tuple[int, int, int, int] | None = None
        self._txnid = -1
        self._suspect: int | None = None
        self.limit = 0

    def _stat(self) -> tuple[int, int, int, int]:
        st = os.fstat(self.fd)
        return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_nlink)

    def _meta(self, size: int) -> Meta:
        try:
            return read_meta(self.fd, size, self.where, self.psize)
        except CorruptStoreError:
            # A commit of another process may have been half written when we read: once more.
            return read_meta(self.fd, self._stat()[0], self.where, self.psize)

    def check(self) -> None:
        """Raise :class:`CorruptStoreError` if the file no longer holds every committed page
        (or was deleted or replaced under the open environment)."""
        if self.fd < 0:
            return
        seen = self._stat()
        if seen == self._seen:
            return
        if seen[3] == 0:
            raise CorruptStoreError(f"{self.where}: its data file was deleted or replaced while "
                                    "the store was open")
        meta = self._meta(seen[0])
        before = self._seen
        if before is not None and meta.txnid == self._txnid and seen[0] <= before[0]:
            self._suspect = meta.txnid
        self._take(seen, meta)

    def _take(self, seen: tuple[int, int, int, int], meta: Meta) -> None:
        """Cover the file if it is shorter than ``meta`` says (LMDB's own unwritten free
        pages, or a cut), then remember it as checked."""
        if seen[0] < meta.needed_bytes:
            cover(self.path, self.fd, seen[0], meta, self.where, self.writable)
            seen = self._stat()
        self._seen, self._txnid, self.limit = seen, meta.txnid, seen[0]

    @property
    def tampered(self) -> bool:
        """Whether the file was written behind LMDB's back (see the class docstring); ask
        it with no commit in flight (under the store's writer lock)."""
        if self._suspect is None or self.fd < 0:
            return False
        if self._meta(self._stat()[0]).txnid != self._suspect:
            self._suspect = None          # a commit explains what was seen
        return self._suspect is not None

    def cleared(self) -> None:
        """The structure was verified since the suspicion arose."""
        self._suspect = None

    def committed(self) -> None:
        """This process committed (or failed to): the file's change is LMDB's own."""
        if self.fd < 0:
            return
        seen = self._stat()
        self._take(seen, read_meta(self.fd, seen[0], self.where, self.psize))

    def size(self) -> int:
        """The file's length now."""
        return os.fstat(self.fd).st_size if self.fd >= 0 else 0

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
