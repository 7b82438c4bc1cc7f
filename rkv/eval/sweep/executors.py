"""Where cells run: ``serial`` (this process), ``process`` (a pool of worker processes on
this machine, the default) or ``ray`` (tasks on a local Ray or on an existing cluster).

Each executor maps a function over items and yields ``(index, result)`` as results arrive.
Workers live for the whole sweep, so what a cell caches per process (SmolLM2, its windows
and reference scores) is loaded once per worker. Ray is an optional extra
(``pip install 'rkv[ray]'``); ``address`` joins a running cluster (``"auto"``, or
``"ray://host:10001"``), none starts a local one with ``workers`` CPUs.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import Any

from rkv.errors import ConfigError, RkvError

EXECUTORS = ("serial", "process", "ray")


class CellError(RkvError):
    """A cell raised: the message names the cell and the worker's error."""


def default_workers() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
               else (os.cpu_count() or 1))


class Executor:
    """Runs ``fn`` over items; a context manager that releases its workers."""

    name = "serial"

    def __init__(self, workers: int = 1) -> None:
        self.workers = workers

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> Iterator[tuple[int, Any]]:
        for i, item in enumerate(items):
            yield i, fn(item)

    def close(self) -> None:
        pass

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _indexed(fn: Callable[[Any], Any], pair: tuple[int, Any]) -> tuple[int, Any]:
    return pair[0], fn(pair[1])


def _import_cells() -> None:
    """Worker initializer: import what every cell needs (rkv, numpy, numba, the codecs)
    while the pool starts, not inside the first cell each worker runs."""
    import rkv.eval.faults.campaign
    import rkv.eval.sweep.cells  # noqa: F401


class ProcessExecutor(Executor):
    """A pool of ``workers`` spawned processes (spawn: no state inherited from the parent's
    threads) that import the cell code as they start; items go one per task and are yielded
    as they complete. Like a Ray cluster, one pool may serve several sweeps. Closed after
    an error or an interrupt, the pool is terminated at once rather than drained."""

    name = "process"

    def __init__(self, workers: int) -> None:
        super().__init__(workers)
        self._pool = mp.get_context("spawn").Pool(workers, initializer=_import_cells)
        self._clean = False

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> Iterator[tuple[int, Any]]:
        yield from self._pool.imap_unordered(partial(_indexed, fn), enumerate(items),
                                             chunksize=1)
        self._clean = True

    def close(self) -> None:
        if self._clean:
            self._pool.close()
        else:
            self._pool.terminate()
        self._pool.join()


class RayExecutor(Executor):
    """Cells as Ray tasks (one CPU each). Joins the cluster at ``address`` or starts a local
    Ray with ``workers`` CPUs; disconnects (and stops a local Ray) on close."""

    name = "ray"

    def __init__(self, workers: int, address: str | None = None) -> None:
        super().__init__(workers)
        try:
            import ray
        except ImportError as exc:
            raise ConfigError("--executor ray needs Ray: pip install 'rkv[ray]'") from exc
        self._ray = ray
        self._owned = not ray.is_initialized()
        if self._owned:
            if address:
                ray.init(address=address, log_to_driver=False)
            else:
                ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
        cpus = ray.cluster_resources().get("CPU", workers)  # type: ignore[no-untyped-call]
        self.workers = int(cpus)

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> Iterator[tuple[int, Any]]:
        ray = self._ray
        remote = ray.remote(num_cpus=1, max_retries=0)(fn)
        refs = {remote.remote(item): i for i, item in enumerate(items)}
        try:
            while refs:
                done, _ = ray.wait(list(refs), num_returns=1)
                for ref in done:
                    yield refs.pop(ref), ray.get(ref)
        finally:
            for ref in refs:
                ray.cancel(ref, force=True)

    def close(self) -> None:
        if self._owned and self._ray.is_initialized():
            self._ray.shutdown()


def make_executor(name: str, workers: int | None = None, address: str | None = None
                  ) -> Executor:
    """The executor called ``name`` (see :data:`EXECUTORS`)."""
    if name not in EXECUTORS:
        raise ConfigError(f"executor must be one of {', '.join(EXECUTORS)}, got {name!r}")
    if workers is not None and workers < 1:
        raise ConfigError(f"workers must be >= 1, got {workers}")
    if address and name != "ray":
        raise ConfigError("--ray-address needs --executor ray")
    n = workers or default_workers()
    if name == "serial":
        return Executor(1)
    if name == "process":
        return ProcessExecutor(n)
    return RayExecutor(n, address)
