"""A remote tier on a Redis Cluster (or a Valkey cluster: the same protocol), for a shared tier
larger than one machine.

The url names seed nodes, ``redis+cluster://host:port[,host:port...]/`` (``rediss+cluster://``
for TLS); credentials, TLS options, timeouts and namespaces are those of a one-server tier
(:class:`~rkv.tiers.redis_tier.RedisTier`, whose code this tier shares: only how keys reach
their nodes differs). redis-py's :class:`redis.cluster.RedisCluster` keeps the slot map and
follows MOVED and ASK replies, so a slot that migrates mid-run still reads the right bytes.

What differs from one server:

* **Reads** of a window are grouped by the node that holds each key's hash slot: one
  pipelined batch of per-slot MGETs per node (one MGET cannot span slots in a cluster).
* **Writes** are pipelined per node. One MULTI/EXEC cannot span slots, so a batch is not all
  or none across the cluster: each record is written whole or not at all, and a batch that
  fails on any node raises, so the engine's index never commits it (rkv/store/txn.py
  commits the index only after every tier write of a put returned). Records a failed batch
  did write are orphans: on a shared namespace (never deleted from) they are harmless, since
  a record is found only through an index entry or a verified probe of its whole chunk.
* **A node that fails** (refused, timed out) makes the keys of that node's slots unavailable:
  their reads raise :class:`~rkv.errors.TierUnavailableError` (a miss to the engine), and
  the node is taken as down for ``retry_after_s`` (after a timeout, at least as long as the
  call waited), so one get does not wait on it twice; the other nodes keep serving, and the
  tier's ``state`` stays ``"ok"`` while any node serves. :meth:`stats` shows each node under
  ``"nodes"``. Calls that span every node (the shared-prefix probe, listing, wiping) fail
  whole when a node is down. For the other nodes to keep serving after the cluster notices
  the failure (``cluster-node-timeout``), the servers need ``cluster-require-full-coverage
  no``; with the default they refuse every key until the node is back.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from contextlib import suppress
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.retry import Retry

from rkv.errors import ConfigError, RkvError, TierUnavailableError
from rkv.tiers.base import TierSpec
from rkv.tiers.redis_tier import RedisTier, peek_pipeline
from rkv.tiers.remote_config import RemoteSettings, cluster_nodes, uses_tls


class RedisClusterTier(RedisTier):
    """Records on a Redis Cluster (see the module docstring)."""

    def __init__(self, spec: TierSpec, settings: RemoteSettings) -> None:
        self._open_lock = threading.Lock()
        self._kw: dict[str, Any] = {}
        super().__init__(spec, settings)

    def __repr__(self) -> str:
        return f"RedisClusterTier({self.where})"

    # -- the client -------------------------------------------------------------------------
    def _connect(self, kw: dict[str, Any]) -> Any:
        """Nothing yet: the cluster client reads the slot map when it opens, so it opens on
        the first call (a cluster that is down fails calls, not the engine's open)."""
        kw = dict(kw)
        if uses_tls(self.settings.url):
            kw["ssl"] = True
        kw.pop("max_connections", None)     # per node, below
        kw["max_connections"] = self.settings.pool_size
        self._kw = kw
        return None

    def _handle(self) -> Any:
        with self._open_lock:
            if self._client is None:
                if self._closed:
                    raise redis.ConnectionError("closed")
                seeds = [ClusterNode(h, p)  # type: ignore[no-untyped-call]
                         for h, p in cluster_nodes(self.settings.url,
                                                                     self.where)]
                kw = dict(self._kw)
                no_retry = kw.pop("retry")
                try:
                    # The client's open sends COMMAND to its default node (the owner of slot
                    # 0) and, without a retry, fails when that one master is down though the
                    # others serve; with one retry per seed it moves to another node. Calls
                    # then run without client retries (RedisTier._call bounds them).
                    client = RedisCluster(startup_nodes=seeds, require_full_coverage=False,
                                          retry=Retry(NoBackoff(), len(seeds)), **kw)
                    client.set_retry(no_retry)
                    self._client = client
                except redis.exceptions.RedisClusterException as exc:
                    cause = exc.__cause__
                    if isinstance(cause, (redis.AuthenticationError,
                                          redis.exceptions.AuthorizationError,
                                          redis.exceptions.NoPermissionError)):
                        raise cause from None     # wrong credentials: a StoreError
                    # (no seed node answered: a down cluster, retried like a down server)
                    raise redis.ConnectionError(str(exc)) from None
                except (ValueError, TypeError) as exc:
                    raise ConfigError(f"{self.where}: bad connection settings: "
                                      f"{type(exc).__name__}") from None
            return self._client

    def _first_contact(self, client: Any) -> Any:
        """Opening the client is the contact: it reads the slot map from the first seed
        that answers, and fails on wrong credentials. (A PING would go to the client's
        default node alone, the owner of slot 0: with that master down, the whole tier
        would be taken as down at the open though the other masters serve.)"""
        return client

    @property
    def state(self) -> str:   # type: ignore[override]
        """``"ok"`` while some node serves (placement should not skip the tier for one node);
        ``"damaged"`` when no seed answered or every node is taken as down."""
        nodes = self.nodes()
        if self.node_down("") or (nodes and all(v == "damaged" for v in nodes.values())):
            return "damaged"
        return "ok"

    def node_groups(self, block_keys: Iterable[bytes]) -> dict[str, list[int]]:
        """The positions of ``block_keys`` grouped by the node that holds each key's slot
        (the client's slot map; a stale one is corrected by MOVED replies)."""
        client = self._call(lambda c: c)
        groups: dict[str, list[int]] = {}
        for i, k in enumerate(block_keys):
            node = client.nodes_manager.get_node_from_slot(client.keyslot(self.key(k)))
            groups.setdefault(node.name, []).append(i)
        return groups

    # -- reads and writes -------------------------------------------------------------------
    def fetch_values(self, block_keys: Sequence[bytes]) -> list[Any]:
        """The values of ``block_keys``: per node, one pipelined batch of per-slot MGETs;
        where a node is down, a TierUnavailableError in place of each of its values."""
        out: list[Any] = [None] * len(block_keys)
        for node, at in self.node_groups(block_keys).items():
            names = [self.key(block_keys[i]) for i in at]
            try:
                got: list[Any] = self._call(
                    lambda c, names=names: c.mget_nonatomic(names), node)  # type: ignore[misc]
            except TierUnavailableError as exc:
                got = [exc] * len(at)
            for i, v in zip(at, got, strict=True):
                out[i] = v
        return out

    def peek(self, ops: Sequence[tuple[str, bytes]], head_bytes: int) -> list[Any]:
        """:meth:`RedisTier.peek` pipelined per node; a down node's answers are each a
        TierUnavailableError (the shared-prefix probe then finds the other nodes' chunks)."""
        out: list[Any] = [None] * len(ops)
        for node, at in self.node_groups([k for _, k in ops]).items():
            names = [(ops[i][0], self.key(ops[i][1])) for i in at]
            try:
                got: list[Any] = self._call(
                    lambda c, names=names: peek_pipeline(c, names, head_bytes),  # type: ignore[misc]
                    node)
            except TierUnavailableError as exc:
                got = [exc] * len(at)
            for i, v in zip(at, got, strict=True):
                out[i] = v
        return out

    def put_many(self, items: Sequence[tuple[bytes, Any]], *, reserve: int = 0) -> None:
        """Write ``items``, pipelined per node; each record whole or not at all, and a batch
        that fails anywhere raises (see the module docstring); on an unshared namespace every
        key of a failed batch is deleted (a record it rewrote included: a miss later)."""
        if not items:
            return
        values = [(self.key(k), self._value(k, v)) for k, v in items]
        ttl = self.settings.ttl_s or None
        try:
            for node, at in self.node_groups([k for k, _ in items]).items():
                part = [values[i] for i in at]

                def write(c: RedisCluster, part: list[tuple[bytes, bytes]] = part) -> Any:
                    pipe = c.pipeline(transaction=False)  # type: ignore[no-untyped-call]
                    for k, v in part:
                        pipe.set(k, v, ex=ttl)
                    return pipe.execute()

                self._call(write, node)
        except RkvError:
            # An unshared namespace takes back the failed batch (best effort: every key of
            # it, since a node's pipeline may have written some before it failed); a shared
            # one never deletes (another node may have written the same records).
            if not self.shared:
                with suppress(RkvError):
                    self._call(lambda c: c.delete(*[k for k, _ in values]))
            raise
        self._count(writes=len(values), bytes_written=sum(len(v) for _, v in values))

    def delete_many(self, keys: Iterable[bytes]) -> int:
        names = [self.key(k) for k in keys]
        if not names or self.shared:
            return 0
        return int(self._call(lambda c: c.delete(*names)))   # split by slot by the client

    def clear(self) -> None:
        names = [self.key(k) for k in self.iter_keys()]
        for i in range(0, len(names), 1000):
            part = names[i:i + 1000]
            self._call(lambda c, part=part: c.delete(*part))   # type: ignore[misc]

    # -- what it says of itself -------------------------------------------------------------
    def nodes(self) -> dict[str, str]:
        """Each primary node, ``"host:port"`` -> ``"ok"`` or ``"damaged"`` (taken as down);
        empty before the client has opened."""
        client = self._client
        if client is None:
            return {}
        names = sorted(n.name for n in client.get_primaries())
        return {n: "damaged" if self.node_down(n) else "ok" for n in names}

    def stats(self) -> dict[str, Any]:
        out = super().stats()
        out["kind"] = "redis-cluster"
        out["nodes"] = self.nodes()
        return out
