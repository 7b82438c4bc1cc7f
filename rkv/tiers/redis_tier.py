"""A remote tier on a Redis (or Valkey) server: records under namespaced keys, shared by nodes.

Every record is one string value under ``rkv:<namespace>:<block key hex>``. Writes go in one
MULTI/EXEC pipeline per batch (all or none), reads one GET per record or, for blocks the
read path announces (:meth:`_Reader.want`), one MGET per window of records. The client keeps
a connection pool and times out; :meth:`RedisTier._call` retries a refused or dropped
connection (never a timeout), so a server that stops answering fails a call within
:attr:`RemoteSettings.give_up_s`.

What rkv promises here (docs/remote.md):

* **Snapshots**: Redis has none. A reader sees each value as the server has it when the value
  is fetched; values fetched by one reader stay valid until it closes. The engine verifies
  every record anyway, so a value that changed or vanished is a miss or an error, never
  other data.
* **Missing values are misses**: the server's ``maxmemory`` eviction or a key's expiry may
  drop a value at any time.
* **A down or hung server** (refused, timed out) raises
  :class:`~rkv.errors.TierUnavailableError`, a :class:`~rkv.errors.MissingRecordError`:
  reads are misses, writes fail with it. After a failure the tier reports
  ``state == "damaged"`` (placement skips it, calls fail at once) for ``retry_after_s``, or,
  after a timeout, for as long as the call waited if that is longer (so one put or get does
  not wait on a hung server twice), then tries the server again, so the engine recovers
  when it is back.
* **Shared namespaces** (``shared = true``, the default) are never deleted from: a record one
  node evicts or moves may be another node's prefix.
* **A Redis Cluster**: :class:`rkv.tiers.redis_cluster.RedisClusterTier` is this tier with
  keys routed to their nodes (per-node batches, per-node down state).
* **Credentials** come from the environment or a file and appear nowhere: not in errors,
  logs, ``repr`` or :meth:`stats` (the URL is shown without user info).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any, NamedTuple, NoReturn, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from rkv.errors import (
    AuthenticationError,
    ConfigError,
    StoreError,
    TierFullError,
    TierUnavailableError,
)
from rkv.format.record_mac import MacKeys
from rkv.tiers.base import Tier, TierSpec
from rkv.tiers.remote_config import RemoteSettings, mac_key, read_secret, redact_url, uses_tls

T = TypeVar("T")
#: A remote tier has no storage of its own to identify: every node sees the same id, and a
#: wiped server shows up as misses (which the engine forgets), not as a new id.
REMOTE_STORE_ID = hashlib.blake2b(b"rkv-remote-tier", digest_size=16).hexdigest()
_ABSENT = object()


def connection_kwargs(s: RemoteSettings, name: str) -> dict[str, Any]:
    """The client options of a remote tier: timeouts, pool, no client retries, credentials
    and TLS (shared by the one-server and the cluster tier)."""
    kw: dict[str, Any] = {
        "socket_timeout": s.timeout_s,
        "socket_connect_timeout": s.connect_timeout_s,
        "max_connections": s.pool_size,
        # No retries and no health-check PINGs inside the client (a PING on an idle
        # connection runs a retry loop of its own inside the command's): RedisTier._call
        # retries, and never a timeout, so one call is bounded by give_up_s.
        "retry": Retry(NoBackoff(), 0),
        "health_check_interval": 0,
    }
    if s.username:
        kw["username"] = s.username
    if s.password:
        kw["password"] = read_secret(s.password, f"tier {name}: remote.password")
    if uses_tls(s.url):
        kw["ssl_cert_reqs"] = "required" if s.tls_verify else "none"
        for opt, arg in (("tls_ca", "ssl_ca_certs"), ("tls_cert", "ssl_certfile"),
                         ("tls_key", "ssl_keyfile")):
            if getattr(s, opt):
                kw[arg] = getattr(s, opt)
    elif s.tls_ca or s.tls_cert or s.tls_key:
        raise ConfigError(f"tier {name}: tls_* options need a rediss:// (or "
                          "rediss+cluster://) url")
    return kw


class _Opened(NamedTuple):
    """A fetched value and its MAC check: the record inside, or the error."""

    value: bytes
    checked: Any


class _Reader:
    """Reads of one engine read: values fetched once, kept until the reader closes."""

    def __init__(self, tier: RedisTier) -> None:
        self._tier = tier
        self._fetched: dict[bytes, Any] = {}
        self._order: list[tuple[bytes, int]] = []   # announced (block key, size), in order
        self._at: dict[bytes, int] = {}
        self._next = 0                              # first announced key not fetched yet

    def want(self, items: Iterable[tuple[bytes, int]]) -> None:
        """Announce the block keys (and expected sizes) about to be read, in order: they are
        fetched in MGET windows of ``window_bytes`` instead of one GET each."""
        for key, size in items:
            if key not in self._at:
                self._at[key] = len(self._order)
                self._order.append((key, size))

    def get(self, key: bytes) -> memoryview | None:
        tier = self._tier
        value = self._fetched.pop(key, _ABSENT)
        if value is _ABSENT:
            i = self._at.get(key)
            if i is not None and i >= self._next:
                self._fetch_window(i)
                value = self._fetched.pop(key, None)
            else:
                value = tier.fetch_values([key])[0]
                tier._count(gets=1)
        if value is None:
            tier._count(misses=1)
            return None
        if isinstance(value, TierUnavailableError):   # its node is down (a cluster tier)
            raise value
        if isinstance(value, _Opened):
            tier._count(hits=1, bytes_read=len(value.value))
            if isinstance(value.checked, BaseException):
                tier._count(auth_rejected=1)
                raise value.checked
            opened: memoryview = value.checked
            return opened
        tier._count(hits=1, bytes_read=len(value))
        return tier.open_value(key, value)

    def _fetch_window(self, i: int) -> None:
        tier = self._tier
        budget = tier.settings.window_bytes
        keys: list[bytes] = []
        j = i
        while j < len(self._order) and (not keys or budget > 0):
            k, size = self._order[j]
            keys.append(k)
            budget -= max(size, 1)
            j += 1
        values = tier.fetch_values(keys)
        tier._count(mgets=1)
        if tier.macs is not None:      # MACs of the window checked on the codec pool
            from rkv.parallel import pmap

            macs = tier.macs
            checked = pmap(lambda kv: None if not isinstance(kv[1], bytes)
                           else macs.open(kv[0], kv[1]),
                           list(zip(keys, values, strict=True)), capture=True,
                           nbytes=sum(len(v) for v in values if isinstance(v, bytes)))
            values = [v if not isinstance(v, bytes) else _Opened(v, c)
                      for v, c in zip(values, checked, strict=True)]
        self._fetched.update(zip(keys, values, strict=True))
        self._next = j


class RedisTier(Tier):
    """Records on a Redis server (see the module docstring)."""

    def __init__(self, spec: TierSpec, settings: RemoteSettings) -> None:
        self.spec = spec
        self.settings = settings
        self.damage: str | None = None
        self.where = f"tier {spec.name} ({redact_url(settings.url)}, {settings.namespace})"
        self._prefix = f"rkv:{settings.namespace}:".encode()
        #: Until when each server is taken as down ("": the tier's one server; a cluster
        #: tier keys its nodes by "host:port").
        self._down_until: dict[str, float] = {}
        self._closed = False
        self._lock = threading.Lock()
        self._counters: Counter[str] = Counter()
        self.macs: MacKeys | None = None
        if settings.authenticated:
            keys = {kid: mac_key(src, f"tier {spec.name}: remote.mac_keys.{kid}")
                    for kid, src in settings.mac_keys.items()}
            self.macs = MacKeys(keys, settings.mac_key_id, settings.mac_algorithm,
                                namespace=settings.namespace)
        self._client: Any = self._connect(connection_kwargs(settings, spec.name))
        # A first contact: wrong credentials fail the open, a down server does not.
        with suppress(TierUnavailableError):
            self._call(self._first_contact)

    def _first_contact(self, client: Any) -> Any:
        """The call the open makes to check the credentials (a cluster tier's differs)."""
        return client.ping()

    # -- plumbing ---------------------------------------------------------------------------
    def _connect(self, kw: dict[str, Any]) -> Any:
        """The client (a cluster tier makes a cluster client instead)."""
        try:
            pool = redis.ConnectionPool.from_url(self.settings.url, **kw)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"{self.where}: bad connection settings: "
                              f"{type(exc).__name__}") from None
        return redis.Redis.from_pool(pool)

    def _handle(self) -> Any:
        """The client a call runs on (a cluster tier opens its client here, when first
        needed)."""
        return self._client

    def __repr__(self) -> str:
        return f"RedisTier({self.where})"

    @property
    def shared(self) -> bool:   # type: ignore[override]
        return self.settings.shared

    @property
    def state(self) -> str:   # type: ignore[override]
        """``"damaged"`` while the server is taken as down (placement skips the tier)."""
        return "damaged" if self.node_down("") else "ok"

    def node_down(self, node: str) -> bool:
        """Whether ``node`` ("" for the whole tier) is taken as down now."""
        return time.monotonic() < self._down_until.get(node, 0.0)

    def key(self, block_key: bytes) -> bytes:
        return self._prefix + block_key.hex().encode()

    def _count(self, **counts: int) -> None:
        with self._lock:
            self._counters.update(counts)

    def _call(self, fn: Callable[[Any], T], node: str = "") -> T:
        """``fn(client)`` with the server's failures as typed errors. A refused or dropped
        connection is retried at once (up to ``retries`` times, while ``timeout_s`` has not
        passed); a timeout is not (the server did not answer for that long). So a call fails
        within ``connect_timeout_s + 2 * timeout_s`` (:attr:`RemoteSettings.give_up_s`) and
        then marks the tier down (see the module docstring); ``node`` names the server that
        is marked down (a cluster tier's node; "": the whole tier)."""
        if self._closed:
            from rkv.errors import StoreClosedError

            raise StoreClosedError(f"{self.where} is closed")
        where = f"{self.where} node {node}" if node else self.where
        if self.node_down(node):
            self._count(unavailable=1)
            raise TierUnavailableError(f"{where} is unavailable ({self.damage}); "
                                       "retrying later")
        start = time.monotonic()
        failures = 0
        while True:
            try:
                out = fn(self._handle())
                break
            except (redis.AuthenticationError, redis.exceptions.AuthorizationError,
                    redis.exceptions.NoPermissionError) as exc:
                raise StoreError(f"{where}: the server refused the credentials or the "
                                 f"command ({type(exc).__name__}; user "
                                 f"{self.settings.username or 'default'!r})") from None
            except redis.TimeoutError as exc:
                self._down(exc, time.monotonic() - start, node)
            except redis.ConnectionError as exc:
                failures += 1
                pause = min(0.25, 0.01 * 2 ** failures)
                if (failures > self.settings.retries
                        or time.monotonic() - start + pause >= self.settings.timeout_s):
                    self._down(exc, 0.0, node)
                time.sleep(pause)       # a restarting server: give it a moment
            except (redis.exceptions.ClusterDownError, redis.exceptions.TryAgainError) as exc:
                # A cluster (or the node) that cannot serve the slot now, e.g. a master
                # restarting before it rejoined: unavailable, as a down server is.
                self._down(exc, 0.0, node)
            except redis.exceptions.OutOfMemoryError:
                raise TierFullError(f"{where}: the server is out of memory "
                                    "(maxmemory)") from None
            except redis.RedisError as exc:     # a ResponseError included
                raise StoreError(f"{where}: {type(exc).__name__}: {exc}") from None
        self.damage = None
        return out

    def _down(self, exc: Exception, waited: float, node: str = "") -> NoReturn:
        """Mark the tier down after a failed call that waited ``waited`` seconds for the
        server: for ``retry_after_s``, or as long as it waited if that is longer, so the
        other calls of the same put or get fail at once instead of waiting again."""
        self.damage = f"{type(exc).__name__}: {exc}"
        self._down_until[node] = time.monotonic() + max(self.settings.retry_after_s, waited)
        self._count(unavailable=1, down=1)     # down: times a server was taken as down
        where = f"{self.where} node {node}" if node else self.where
        raise TierUnavailableError(f"{where} is unavailable: {self.damage}") from None

    def fetch_values(self, block_keys: Sequence[bytes]) -> list[Any]:
        """The stored values of ``block_keys`` in one MGET (None where absent; a cluster
        tier puts a TierUnavailableError where a key's node is down)."""
        values: list[Any] = self._call(lambda c: c.mget([self.key(k) for k in block_keys]))
        return values

    def peek(self, ops: Sequence[tuple[str, bytes]], head_bytes: int) -> list[Any]:
        """Per ``(op, block key)``, in one pipelined round trip: ``"strlen"`` gives the value's
        length (0 where there is none), ``"head"`` its first ``head_bytes`` (``b""`` where
        there is none). A down server raises TierUnavailableError; a cluster tier puts one
        in place of each answer of a down node instead, so the other nodes' answers stand."""
        if not ops:
            return []
        names = [(op, self.key(k)) for op, k in ops]
        return self._call(lambda c: peek_pipeline(c, names, head_bytes))

    def open_value(self, block_key: bytes, value: bytes) -> memoryview:
        """The record inside a stored value (its MAC verified on an authenticated tier)."""
        if self.macs is None:
            return memoryview(value)
        try:
            return self.macs.open(block_key, value)
        except AuthenticationError:
            self._count(auth_rejected=1)
            raise

    def lengths(self, block_keys: Sequence[bytes]) -> list[int]:
        """The length of each block's value on the server, 0 where there is none (one round
        trip)."""
        if not block_keys:
            return []

        def strlen(c: redis.Redis) -> list[Any]:
            pipe = c.pipeline(transaction=False)
            for k in block_keys:
                pipe.strlen(self.key(k))
            return list(pipe.execute())

        return [int(n) for n in self._call(strlen)]

    def holds(self, size: int, length: int) -> bool:
        """Whether a value of ``length`` bytes can hold a record of ``size`` bytes here (the
        record, or on an authenticated tier its envelope)."""
        return MacKeys.fits(size, length) if self.macs is not None else length == size

    # -- the Tier interface -----------------------------------------------------------------
    @property
    def store_id(self) -> str:
        return REMOTE_STORE_ID

    def ensure_checked(self) -> None:
        """Nothing to check on the server (placement calls this before writing)."""

    @contextmanager
    def reader(self) -> Iterator[_Reader]:
        yield _Reader(self)

    def _value(self, key: bytes, v: Any) -> bytes:
        raw = v() if callable(v) else v
        if self.macs is not None:
            return self.macs.seal(key, raw)
        return bytes(memoryview(raw).cast("B"))   # a copy: callables may reuse a buffer

    def put_many(self, items: Sequence[tuple[bytes, Any]], *, reserve: int = 0) -> None:
        if not items:
            return
        values = [(self.key(k), self._value(k, v)) for k, v in items]
        ttl = self.settings.ttl_s or None

        def write(c: redis.Redis) -> Any:
            pipe = c.pipeline(transaction=True)
            for k, v in values:
                pipe.set(k, v, ex=ttl)
            return pipe.execute()

        self._call(write)
        self._count(writes=len(values), bytes_written=sum(len(v) for _, v in values))

    def delete_many(self, keys: Iterable[bytes]) -> int:
        """Delete records; a shared tier deletes nothing (another node may read them) and
        returns 0."""
        names = [self.key(k) for k in keys]
        if not names or self.shared:
            return 0
        return int(self._call(lambda c: c.delete(*names)))

    def iter_keys(self) -> Iterator[bytes]:
        n = len(self._prefix)
        found = self._call(lambda c: list(c.scan_iter(match=self._prefix + b"*", count=1000)))
        for k in found:
            try:
                yield bytes.fromhex(k[n:].decode("ascii"))
            except (UnicodeDecodeError, ValueError):
                continue   # not a block key of rkv's

    def clear(self) -> None:
        """Remove every record of the namespace (an explicit wipe, shared or not)."""
        names = [self.key(k) for k in self.iter_keys()]
        for i in range(0, len(names), 1000):
            part = names[i:i + 1000]
            self._call(lambda c, part=part: c.delete(*part))   # type: ignore[misc]

    def stats(self) -> dict[str, Any]:
        with self._lock:
            counters = dict(self._counters)
        return {
            "kind": "redis",
            "path": f"{redact_url(self.settings.url)} ns={self.settings.namespace}",
            "namespace": self.settings.namespace,
            "state": self.state,
            "shared": self.shared,
            "authenticated": self.macs is not None,
            "mac_key_ids": self.macs.ids if self.macs is not None else [],
            "mac_algorithm": self.macs.algorithm if self.macs is not None else None,
            "records": None,       # counting would scan a namespace other nodes share
            "map_bytes": 0,
            "file_bytes": 0,
            "remote": counters,
        }

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            handle, self._client = self._client, None
            if handle is not None:
                handle.close()


def peek_pipeline(client: Any, ops: Sequence[tuple[str, bytes]], head_bytes: int) -> list[Any]:
    """:meth:`RedisTier.peek`'s commands (on stored names) in one pipeline."""
    pipe = client.pipeline(transaction=False)
    for op, name in ops:
        if op == "strlen":
            pipe.strlen(name)
        elif op == "head":
            pipe.getrange(name, 0, head_bytes - 1)
        else:
            raise ValueError(f"peek: unknown op {op!r}")
    return list(pipe.execute())
