"""One process-wide thread pool for codec and checksum work, and helpers to use it.

The numba kernels (``nogil=True``), xxhash, the numba CRC-32C and numpy's copies release the
GIL, so threads encode, hash and decode blocks on every core. This module owns one
:class:`~concurrent.futures.ThreadPoolExecutor` (lazily started) sized by :func:`configure`
(``EngineConfig.codec_threads``; 0 = the CPUs this process may run on; the environment
variable ``RKV_CODEC_THREADS`` sets the starting value) and maps work over it:

* :func:`pmap` maps a function over items (blocks), in order, when the bytes make it pay;
* :func:`prange` splits ``range(n)`` into contiguous pieces (the codewords of one large
  block) and runs a function on each.

The calling thread always takes part and drains the work itself if the pool is busy, and a
call made from inside pool work runs inline, so nothing ever waits on a task that cannot
start: concurrent and nested calls cannot deadlock. Results are exactly the serial ones;
only the order in which items run differs.
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import pairwise
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

#: Below this many bytes of work in all, a call runs inline (a hand-off costs ~20-50 us).
MIN_PARALLEL_BYTES = 256 << 10
#: Within one block, pieces of at least this many bytes (the codewords of a 1 MiB block
#: split across a few threads; a 192 KiB block stays whole).
MIN_PIECE_BYTES = 256 << 10

_lock = threading.Lock()
_setting = 0                 # 0: auto (see _from_env below)
_pool: ThreadPoolExecutor | None = None
_local = threading.local()


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask; ``os.cpu_count`` where unknown)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def check_threads(value: object, name: str = "codec_threads") -> int:
    """``value`` as a thread count (an int >= 0, 0 = auto) or a ValueError saying why."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an int >= 0 (0: one per CPU), got {value!r}")
    return value


def configure(threads: int) -> int:
    """Set the pool size (0: one thread per available CPU; 1: everything inline). A pool of
    another size is shut down (after its running work) and a new one starts on next use.
    Process-wide: the last call wins. Returns the resulting number of threads."""
    global _setting, _pool
    check_threads(threads)
    with _lock:
        _setting = threads
        old = _pool
        if old is not None and old._max_workers != _resolved():
            _pool = None
        else:
            old = None
    if old is not None:
        old.shutdown(wait=False)
    return _resolved()


def _from_env() -> int:
    """The starting setting: ``RKV_CODEC_THREADS`` when it is a valid count, else 0."""
    try:
        return check_threads(int(os.environ.get("RKV_CODEC_THREADS", "0") or 0))
    except ValueError:
        return 0


_setting = _from_env()


def _resolved() -> int:
    return _setting or available_cpus()


def threads() -> int:
    """How many threads codec work uses (the calling thread included)."""
    return _resolved()


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=_resolved(), thread_name_prefix="rkv-codec")
        return _pool


def _shutdown() -> None:  # pragma: no cover - interpreter exit
    pool = _pool
    if pool is not None:
        pool.shutdown(wait=False, cancel_futures=True)


atexit.register(_shutdown)


def in_pool_work() -> bool:
    """True while this thread runs an item of a :func:`pmap` (nested calls run inline)."""
    return getattr(_local, "depth", 0) > 0


def _workers(n_items: int, nbytes: int | None, min_bytes: int | None) -> int:
    floor = MIN_PARALLEL_BYTES if min_bytes is None else min_bytes
    if n_items < 2 or in_pool_work() or (nbytes is not None and nbytes < floor):
        return 1
    return min(_resolved(), n_items)


def pmap(fn: Callable[[T], R], items: Sequence[T], *, nbytes: int | None = None,
         min_bytes: int | None = None, capture: bool = False, inline: bool = False
         ) -> list[R | BaseException]:
    """``[fn(x) for x in items]`` on the pool's threads, results in order.

    ``nbytes``: the work's size, when known; under ``min_bytes`` (default
    :data:`MIN_PARALLEL_BYTES`) it all runs inline, as does
    a single item. ``capture=False``: the first failing item's exception (by position, as
    the serial loop would raise it) is raised after every started item has finished.
    ``capture=True``: an item that raises gets its exception in its place in the list and
    every item runs. ``inline``: on the calling thread only. The typed result is
    ``list[R | BaseException]``; callers that do not capture may cast it to ``list[R]``
    (see :func:`pmap_strict`).
    """
    n = len(items)
    workers = 1 if inline else _workers(n, nbytes, min_bytes)
    out: list[R | BaseException] = [None] * n  # type: ignore[list-item]
    failed: list[int] = []
    if workers <= 1:
        _drain(fn, items, iter(range(n)), threading.Lock(), out, failed, capture)
    else:
        ids = iter(range(n))
        lock = threading.Lock()
        pool = _executor()
        futs: list[Future[None]] = [
            pool.submit(_drain, fn, items, ids, lock, out, failed, capture)
            for _ in range(workers - 1)]
        _drain(fn, items, ids, lock, out, failed, capture)
        for f in futs:
            if not f.cancel():          # started: wait for its last item
                f.result()
    if failed and not capture:
        raise out[min(failed)]  # type: ignore[misc]
    return out


def pmap_strict(fn: Callable[[T], R], items: Sequence[T], *, nbytes: int | None = None,
                min_bytes: int | None = None) -> list[R]:
    """:func:`pmap` that raises the first failure: every element is a result."""
    return pmap(fn, items, nbytes=nbytes, min_bytes=min_bytes)  # type: ignore[return-value]


def _drain(fn: Callable[[T], R], items: Sequence[T], ids: Iterator[int], lock: threading.Lock,
           out: list[R | BaseException], failed: list[int], capture: bool) -> None:
    """Take items off the shared iterator until none is left (any thread, any number)."""
    _local.depth = getattr(_local, "depth", 0) + 1
    try:
        while True:
            with lock:
                i = next(ids, -1)
                if i >= 0 and failed and not capture:
                    i = -1        # stop early: the serial loop would not have gone on
            if i < 0:
                return
            try:
                out[i] = fn(items[i])
            except BaseException as exc:   # handed to the caller
                out[i] = exc
                with lock:
                    failed.append(i)
    finally:
        _local.depth -= 1


def pieces(n: int, parts: int) -> list[tuple[int, int]]:
    """``range(n)`` cut into ``parts`` contiguous ``(start, stop)`` pieces of near-equal size
    (fewer when ``n`` is small; none when ``n == 0``)."""
    parts = max(1, min(parts, n))
    bounds = [n * p // parts for p in range(parts + 1)]
    return [(a, b) for a, b in pairwise(bounds) if b > a]


def prange(fn: Callable[[int, int], None], n: int, nbytes: int,
           min_piece: int | None = None) -> None:
    """Run ``fn(start, stop)`` over pieces of ``range(n)`` on the pool, or ``fn(0, n)`` inline
    when ``nbytes`` of work would not give each thread ``min_piece`` bytes (default
    :data:`MIN_PIECE_BYTES`), or from inside pool work. ``fn`` must write only what belongs
    to its piece."""
    piece = MIN_PIECE_BYTES if min_piece is None else max(1, min_piece)
    parts = 1 if in_pool_work() else min(_resolved(), nbytes // piece)
    if parts <= 1 or n < 2:
        if n:
            fn(0, n)
        return
    pmap_strict(lambda ab: fn(*ab), pieces(n, parts), min_bytes=0)
