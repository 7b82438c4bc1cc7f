"""Local Redis servers for trials, examples and tests: one server, or a Redis Cluster of
``masters`` masters (no replicas), on free loopback ports, without persistence, in a
directory of the caller's. Not for production: a real deployment runs its servers itself.

>>> with LocalCluster(Path("/tmp/c")) as cluster:     # doctest: +SKIP
...     url = cluster.url        # redis+cluster://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3/

The cluster's servers run with ``cluster-require-full-coverage no`` (the nodes that are up
keep serving their slots when one fails) and a short ``cluster-node-timeout``.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

from rkv.errors import StoreError

#: Seconds the servers may take to start and the cluster to agree (``cluster_state:ok``).
START_TIMEOUT = 30.0


def free_port(cluster: bool = False) -> int:
    """A TCP port free on loopback now; for a cluster node, one of at most 55535 whose
    cluster bus port (10000 higher) is free too."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if not cluster:
            return port
        if port <= 55535:
            try:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port + 10000))
                return port
            except OSError:
                continue


def _exe(name: str) -> str:
    exe = shutil.which(name)
    if exe is None:
        raise StoreError(f"{name} is not installed (apt-get install redis-server; a Valkey "
                         "build's valkey-server works too under that name)")
    return exe


def _ask(port: int, *args: str) -> str:
    """``redis-cli -p port args...``'s output ("" when the server does not answer)."""
    try:
        done = subprocess.run([_exe("redis-cli"), "-h", "127.0.0.1", "-p", str(port), *args],
                              capture_output=True, text=True, timeout=5, check=False)
    except subprocess.TimeoutExpired:
        return ""
    return done.stdout if done.returncode == 0 else ""


class LocalRedis:
    """One redis-server on a free loopback port (``cluster``: a cluster-enabled node;
    ``args``: more server options, e.g. ``("--maxmemory", "4mb")``)."""

    def __init__(self, root: Path, *, cluster: bool = False, port: int = 0,
                 args: tuple[str, ...] = ()) -> None:
        self.root = Path(root)
        self.args = args
        self.port = port or free_port(cluster)
        self.cluster = cluster
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start the server and wait until it answers PING."""
        if self.proc is not None:
            return
        self.root.mkdir(parents=True, exist_ok=True)
        args = [_exe("redis-server"), "--port", str(self.port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--dir", str(self.root),
                "--loglevel", "warning"]
        if self.cluster:
            args += ["--cluster-enabled", "yes", "--cluster-config-file",
                     f"nodes-{self.port}.conf", "--cluster-node-timeout", "2000",
                     "--cluster-require-full-coverage", "no"]
        args += self.args
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + START_TIMEOUT
        while "PONG" not in _ask(self.port, "ping"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise StoreError(f"redis-server on port {self.port} did not start")
            time.sleep(0.02)            # polling a server's start

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop the server (``signal.SIGKILL``: kill it, as a crash would)."""
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(sig)
            self.proc.wait(timeout=20)
            self.proc = None

    def __enter__(self) -> LocalRedis:
        self.start()
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


class LocalCluster:
    """A Redis Cluster of ``masters`` cluster-enabled servers, slots spread evenly."""

    def __init__(self, root: Path, masters: int = 3, args: tuple[str, ...] = ()) -> None:
        if masters < 3:
            raise StoreError("a Redis Cluster needs at least 3 masters")
        self.root = Path(root)
        self.nodes = [LocalRedis(self.root, cluster=True, args=args) for _ in range(masters)]

    @property
    def url(self) -> str:
        """The cluster's url for a ``kind = "redis"`` tier (every node a seed)."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes) + "/"

    def start(self) -> None:
        """Start the servers, join them into one cluster and wait for ``cluster_state:ok``
        on every node."""
        try:
            for n in self.nodes:
                n.start()
        except StoreError:
            self.stop()        # (the nodes started before the one that failed)
            raise
        try:
            subprocess.run([_exe("redis-cli"), "--cluster", "create",
                            *(f"127.0.0.1:{n.port}" for n in self.nodes),
                            "--cluster-replicas", "0", "--cluster-yes"],
                           capture_output=True, timeout=60, check=True)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
            self.stop()
            raise StoreError(f"redis-cli --cluster create failed: {type(exc).__name__}") \
                from None
        deadline = time.monotonic() + START_TIMEOUT
        while not all("cluster_state:ok" in _ask(n.port, "cluster", "info")
                      for n in self.nodes):
            if time.monotonic() > deadline:
                self.stop()
                raise StoreError("the cluster did not reach cluster_state:ok")
            time.sleep(0.05)            # polling the cluster's start

    def flush(self) -> None:
        """Empty every node."""
        for n in self.nodes:
            _ask(n.port, "flushall")

    def node_of(self, name: str) -> LocalRedis:
        """The node called ``"host:port"``."""
        port = int(name.rpartition(":")[2])
        return next(n for n in self.nodes if n.port == port)

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
