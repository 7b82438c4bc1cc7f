"""A real redis-server for the remote-tier tests: started on a free loopback port, in a
temporary directory, without persistence; stopped (or killed and restarted) by the tests.

``scripts/test.sh`` installs redis-server when it is missing. Without it these tests fail
with a message that says so: they are never skipped silently.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rkv import EngineConfig, TierConfig

#: Seconds a server may take to answer PING after it starts.
START_TIMEOUT = 20.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """One redis-server process; ``args`` are extra server options (ACL users...)."""

    def __init__(self, root: Path, args: tuple[str, ...] = (), password: str = "") -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            pytest.fail("redis-server is not installed: the remote-tier tests need a real "
                        "server (scripts/test.sh installs it: apt-get install redis-server)")
        self.exe = exe
        self.root = root
        self.args = args
        self.password = password
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> object:
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, password=self.password or None,
                           socket_timeout=5)

    def start(self) -> None:
        assert self.proc is None
        self.proc = subprocess.Popen(
            [self.exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.root), "--loglevel", "warning",
             *self.args],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import redis

        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                if self.client().ping():   # type: ignore[attr-defined]
                    return
            except redis.ConnectionError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"redis-server on port {self.port} did not start")
            time.sleep(0.02)           # polling the server's start, not a race

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop the server (``SIGKILL``: kill it, as a crash would); its data is gone."""
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(sig)
            self.proc.wait(timeout=20)
            self.proc = None

    def restart(self) -> None:
        """Kill the server and start a fresh one on the same port (empty: no persistence)."""
        self.stop(signal.SIGKILL)
        self.start()

    def flush(self) -> None:
        self.client().flushall()   # type: ignore[attr-defined]


def serve(args: tuple[str, ...] = (), password: str = "") -> Iterator[RedisServer]:
    """A started server, stopped afterwards (the body of the fixtures below)."""
    root = Path(tempfile.mkdtemp(prefix="rkv-redis-"))
    server = RedisServer(root, args, password)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One server for the session (tests use their own namespaces or flush it)."""
    yield from serve()


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A server of the test's own, which the test may kill and restart."""
    yield from serve()


#: Credentials of the authenticated server (test-only values).
ACL_USER, ACL_PASSWORD, DEFAULT_PASSWORD = "rkvnode", "acl-S3cret-pass-1", "def-S3cret-pass-2"


@pytest.fixture(scope="session")
def auth_redis() -> Iterator[RedisServer]:
    """A server that needs a password (default user) and has an ACL user ``rkvnode``
    allowed only the ``rkv:*`` keys."""
    yield from serve(("--requirepass", DEFAULT_PASSWORD, "--user", ACL_USER, "on",
                      f">{ACL_PASSWORD}", "~rkv:*", "+@all"), password=DEFAULT_PASSWORD)


def env_name(tag: str) -> str:
    """A unique environment variable name for a test's secret."""
    return f"RKV_TEST_{tag.upper()}_{os.getpid()}"


def remote_config(url: str, namespace: str, *, local: bool = False, chunk_tokens: int = 16,
                  capacity: int = 1 << 30, **remote: object) -> EngineConfig:
    """An engine config with a shared remote tier (and a local memory tier above it when
    ``local``); the tier retries a down server at once (no waiting in tests)."""
    tiers = []
    if local:
        tiers.append(TierConfig("dram", medium="memory", path="t/dram", capacity_bytes=capacity))
    tiers.append(TierConfig("remote", kind="redis", url=url, capacity_bytes=capacity,
                            remote={"namespace": namespace, "retry_after_s": 0.0,
                                    "timeout_s": 2.0, "connect_timeout_s": 1.0, **remote}))
    return EngineConfig(chunk_tokens=chunk_tokens, tiers=tuple(tiers))
