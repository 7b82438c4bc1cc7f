"""Space kept back beside each LMDB environment, so that deletes still work on a full disk.

LMDB never writes in place: deleting a record copies the pages on its path to new pages, and
the pages it frees can be reused only by later transactions. On a full filesystem a delete
therefore fails for lack of the few pages it needs, and space can never be freed. Each
writable environment keeps a reserve file of :data:`RESERVE_BYTES` (allocated, not sparse)
in its directory; a freeing write (deletes, ``clear``) that fails for lack of space deletes
the reserve and tries again, so its pages come out of the reserve's. The reserve is made
again when the filesystem has room (at open, and after later commits).

A write that fails because the filesystem is full becomes :class:`~rkv.errors.TierFullError`:
``ENOSPC``, ``EDQUOT``, ``EFBIG`` (a file size limit), and ``EIO`` where LMDB reports a
short write (``mdb_page_flush`` turns one into ``EIO``) while the filesystem has almost no
space left or the data file reached the process' file size limit.
"""

from __future__ import annotations

import errno
import os
import resource
import time
from pathlib import Path

#: Bytes kept back per environment: 256 pages of 4 KiB, enough for the paths of a delete
#: through the index's B-trees and the free list; larger deletes go in batches, each
#: reusing the pages the one before freed.
RESERVE_BYTES = 1 << 20
#: The reserve's file name inside an environment's directory.
RESERVE_NAME = "space.reserve"
#: A short write with less than this free on the filesystem is a full disk, not an I/O error.
NEARLY_FULL_BYTES = 8 << 20
_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
#: Seconds between attempts to make a missing reserve again.
RETRY_S = 30.0


def free_bytes(path: Path) -> int | None:
    """Bytes this process may still write on ``path``'s filesystem (None: unknown)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    blocks = st.f_bfree if os.geteuid() == 0 else st.f_bavail
    return int(blocks * st.f_frsize)


def is_full_error(exc: BaseException, path: Path) -> bool:
    """Whether the failed write ``exc`` ran out of space (see the module docstring)."""
    code = getattr(exc, "errno", None)
    text = str(exc)
    if code in _FULL_ERRNOS or "No space left" in text or "File too large" in text \
            or "Disk quota exceeded" in text:
        return True
    if code == errno.EIO or "Input/output error" in text:
        free = free_bytes(path)
        return (free is not None and free < NEARLY_FULL_BYTES) or _at_size_limit(path)
    return False


def _at_size_limit(path: Path) -> bool:
    """The data file reached this process' file size limit (a short write stops there)."""
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit == resource.RLIM_INFINITY:
        return False
    try:
        return (path / "data.mdb").stat().st_size + (64 << 10) >= limit
    except OSError:
        return False


class Reserve:
    """The reserve file of the environment in ``directory``."""

    def __init__(self, directory: Path, nbytes: int = RESERVE_BYTES) -> None:
        self.path = directory / RESERVE_NAME
        self.nbytes = nbytes
        self._next_try = 0.0
        self._made = False

    def present(self) -> bool:
        """Whether the reserve is in place (as this process last saw it: a stat only until
        it is found, not at every commit)."""
        if not self._made:
            try:
                self._made = self.path.stat().st_size >= self.nbytes
            except OSError:
                return False
        return self._made

    def make(self) -> bool:
        """Allocate the reserve if the filesystem has room for it and more; True when it is
        in place. Never raises: a reserve is a convenience, not a requirement."""
        if self.present():
            return True
        now = time.monotonic()
        if now < self._next_try:
            return False
        self._next_try = now + RETRY_S
        free = free_bytes(self.path.parent)
        if free is None or free < 2 * self.nbytes + NEARLY_FULL_BYTES:
            return False
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError:
            return False
        try:
            try:
                os.posix_fallocate(fd, 0, self.nbytes)
            except OSError:            # a filesystem without fallocate: write the zeros
                os.ftruncate(fd, 0)
                os.write(fd, bytes(self.nbytes))
            self._made = True
            return True
        except OSError:
            self.release()
            return False
        finally:
            os.close(fd)

    def release(self) -> bool:
        """Delete the reserve; True when there was one (its space is free now)."""
        self._made = False
        try:
            had = self.path.stat().st_size > 0
            self.path.unlink()
        except OSError:
            return False
        self._next_try = 0.0
        return had
