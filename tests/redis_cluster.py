"""A real 3-master Redis Cluster (no replicas) for the cluster-tier tests: three
``redis-server --cluster-enabled yes`` processes on free loopback ports in a temporary
directory, joined by ``redis-cli --cluster create``; a master can be killed (as a crash
would) and started again. Without redis-server or redis-cli the tests fail, never skip.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from rkv.errors import StoreError
from rkv.tiers.local_redis import LocalCluster


class RedisTestCluster(LocalCluster):
    """A LocalCluster whose start-up failures fail the test."""

    def start(self) -> None:
        try:
            super().start()
        except StoreError as exc:
            pytest.fail(f"{exc} (scripts/test.sh installs redis-server and redis-cli)")


def run_cluster(args: tuple[str, ...] = ()) -> Iterator[RedisTestCluster]:
    """A started cluster (``args``: more server options), stopped afterwards."""
    root = Path(tempfile.mkdtemp(prefix="rkv-cluster-"))
    cluster = RedisTestCluster(root, args=args)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def redis_cluster() -> Iterator[RedisTestCluster]:
    """One cluster for the module (tests use their own namespaces)."""
    yield from run_cluster()


@pytest.fixture
def own_cluster() -> Iterator[RedisTestCluster]:
    """A cluster of the test's own, whose masters the test may kill."""
    yield from run_cluster()
