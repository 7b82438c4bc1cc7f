"""Settings of a remote tier (the ``remote`` table of a ``kind = "redis"`` tier), validated.

Secrets never live in the config itself: the engine stores its config in the index and
``rkv info`` prints it. A password or MAC key is named by where to find it, ``"env:VAR"``
(an environment variable) or ``"file:PATH"`` (a file holding it), and read when the tier
opens; a password inside the URL is refused.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from rkv.checks import as_bool, as_float, as_int, as_str, as_table, check_keys, one_of
from rkv.errors import ConfigError
from rkv.inputs import read_text

#: A secret file holds one key or password: far under this.
MAX_SECRET_BYTES = 64 << 10
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_KEY_ID = re.compile(r"[A-Za-z0-9_.-]{1,32}")
_SOURCE = re.compile(r"(env:[A-Za-z_][A-Za-z0-9_]*|file:.+)")
#: MAC keys: 16 to 64 bytes, written as hex.
MIN_KEY_BYTES, MAX_KEY_BYTES = 16, 64


def redact_url(url: str) -> str:
    """``url`` without any user info (what logs, errors and stats show)."""
    if is_cluster(url):
        parts = urlsplit(url)
        try:
            nodes = ",".join(f"{h}:{p}" for h, p in cluster_nodes(url, "url"))
        except ConfigError:
            nodes = "(bad node list)"
        return urlunsplit((parts.scheme, nodes, parts.path, "", ""))
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host + (f":{parts.port}" if parts.port is not None else "")
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


#: Schemes of a Redis Cluster (or Valkey cluster: the same protocol), TLS or not.
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")


def is_cluster(url: str) -> bool:
    """Whether ``url`` names a cluster (``redis+cluster://host:port[,host:port...]/``)."""
    return isinstance(url, str) and url.partition(":")[0] in CLUSTER_SCHEMES


def uses_tls(url: str) -> bool:
    return url.partition(":")[0] in ("rediss", "rediss+cluster")


def cluster_nodes(url: str, what: str) -> list[tuple[str, int]]:
    """The seed nodes of a cluster URL, each ``(host, port)``; a ConfigError names what is
    wrong (never the user info)."""
    netloc = urlsplit(url).netloc.rpartition("@")[2]
    nodes: list[tuple[str, int]] = []
    for part in netloc.split(","):
        host, sep, port = part.rpartition(":")
        host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"{what}: cluster node {part!r} must be host:port "
                              "(e.g. redis+cluster://10.0.0.1:7000,10.0.0.2:7000/)")
        nodes.append((host, int(port)))
    return nodes


def check_url(url: Any, what: str) -> None:
    if not isinstance(url, str) or not url:
        raise ConfigError(f"{what}: a redis tier needs url = \"redis://host:port/db\"")
    try:
        parts = urlsplit(url)
        if not is_cluster(url):
            parts.port  # noqa: B018 - parsing validates the port
    except ValueError as exc:
        raise ConfigError(f"{what}: bad url {redact_url(url)!r}: {exc}") from exc
    if parts.scheme in CLUSTER_SCHEMES:
        cluster_nodes(url, what)
        if parts.path not in ("", "/", "/0"):
            raise ConfigError(f"{what}: a cluster has one database (0): end the url with "
                              f"\"/\", not {parts.path!r}")
    elif parts.scheme not in ("redis", "rediss", "unix"):
        raise ConfigError(f"{what}: url scheme must be redis://, rediss:// (TLS), unix://, "
                          f"redis+cluster:// or rediss+cluster://, got {parts.scheme!r}")
    if _password(parts.netloc) is not None:
        raise ConfigError(f"{what}: the url holds a password; give it as remote.password = "
                          "\"env:VAR\" or \"file:PATH\" (the config is stored in the index)")
    if parts.query:
        raise ConfigError(f"{what}: url options go in the remote table, not the query string")


def _password(netloc: str) -> str | None:
    """The password in a url's user info (None: none given)."""
    user, at, _ = netloc.rpartition("@")
    return user.partition(":")[2] if at and ":" in user else None


def read_secret(source: str, what: str) -> str:
    """The secret named by ``source`` (``env:VAR`` or ``file:PATH``); never echoed."""
    kind, _, name = source.partition(":")
    if kind == "env":
        value = os.environ.get(name)
        if value is None:
            raise ConfigError(f"{what}: environment variable {name} is not set")
        return value
    # Bounded and never blocking (a FIFO, /dev/zero); the message names the file, never
    # its content.
    return read_text(Path(name).expanduser(), f"{what}: secret file", limit=MAX_SECRET_BYTES,
                     error=ConfigError).strip()


def mac_key(source: str, what: str) -> bytes:
    """A MAC key from ``source``: hex, 16 to 64 bytes."""
    text = read_secret(source, what).strip()
    try:
        key = bytes.fromhex(text)
    except ValueError:
        raise ConfigError(f"{what}: the key must be hex ({2 * MIN_KEY_BYTES} to "
                          f"{2 * MAX_KEY_BYTES} hex digits)") from None
    if not MIN_KEY_BYTES <= len(key) <= MAX_KEY_BYTES:
        raise ConfigError(f"{what}: the key is {len(key)} bytes; it must be "
                          f"{MIN_KEY_BYTES} to {MAX_KEY_BYTES}")
    return key


@dataclass(frozen=True)
class RemoteSettings:
    """How to reach a remote tier and what it holds (see docs/remote.md).

    ``namespace`` prefixes every key (``rkv:<namespace>:<block key hex>``): nodes that share
    prefixes use the same one. ``username`` is an ACL user; ``password`` and the MAC keys are
    secret sources. ``tls_*`` are file paths for ``rediss://`` (CA bundle, client certificate
    and key). Timeouts are seconds; ``retries`` reconnects a refused or dropped connection
    that many times (within ``timeout_s``; a timeout is not retried), so a call to a server
    that stops answering fails within :attr:`give_up_s`; after a failure the tier answers
    "unavailable" at once for ``retry_after_s`` (after a timeout, at least as long as the
    call waited) before it tries the server again. ``shared``: other nodes read this
    namespace, so rkv never deletes from it (the server's ``maxmemory`` policy or ``ttl_s``
    reclaims space), and with ``write_through`` every chunk a put stores in a local tier is
    copied there too, so other nodes find it (best effort: a failed copy is counted, the put
    stands). ``mac_keys`` (key id -> secret source) authenticates records, bound to the
    namespace (a record copied into another namespace fails); ``mac_key_id`` seals new ones;
    ``mac_algorithm``: ``"hmac-sha256"`` (default: OpenSSL uses the CPU's SHA instructions,
    about twice keyed blake2b's speed here) or ``"blake2b"`` (keyed).
    ``window_bytes`` bounds one batched read (MGET)."""

    url: str
    namespace: str = "default"
    username: str = ""
    password: str = ""
    tls_ca: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    tls_verify: bool = True
    connect_timeout_s: float = 2.0
    timeout_s: float = 5.0
    retries: int = 2
    retry_after_s: float = 1.0
    pool_size: int = 16
    shared: bool = True
    write_through: bool = True
    ttl_s: int = 0
    mac_keys: dict[str, str] = field(default_factory=dict)
    mac_key_id: str = ""
    mac_algorithm: str = "hmac-sha256"
    window_bytes: int = 32 << 20

    def __post_init__(self) -> None:
        what = "remote"
        check_url(self.url, what)
        for name in ("namespace",):
            if not isinstance(getattr(self, name), str) or not _NAME.fullmatch(
                    getattr(self, name)):
                raise ConfigError(f"{what}.{name} must be 1-64 of [A-Za-z0-9_.-]")
        for name in ("username", "tls_ca", "tls_cert", "tls_key"):
            as_str(getattr(self, name), f"{what}.{name}")
        if self.password and (not isinstance(self.password, str)
                              or not _SOURCE.fullmatch(self.password)):
            raise ConfigError(f"{what}.password must be \"env:VAR\" or \"file:PATH\" (a "
                              "literal password would be stored in the index)")
        for name in ("tls_verify", "shared", "write_through"):
            as_bool(getattr(self, name), f"{what}.{name}")
        for name, lo in (("connect_timeout_s", 1e-3), ("timeout_s", 1e-3),
                         ("retry_after_s", 0.0)):
            as_float(getattr(self, name), f"{what}.{name}", lo=lo, hi=3600)
        for name, lo, hi in (("retries", 0, 100), ("pool_size", 1, 4096),
                             ("ttl_s", 0, 1 << 31), ("window_bytes", 1 << 16, 1 << 34)):
            as_int(getattr(self, name), f"{what}.{name}", lo=lo, hi=hi)
        as_table(self.mac_keys, f"{what}.mac_keys", what="a table of key id = \"env:VAR\"")
        for kid, src in self.mac_keys.items():
            if not isinstance(kid, str) or not _KEY_ID.fullmatch(kid):
                raise ConfigError(f"{what}.mac_keys: key id {kid!r} must be 1-32 of "
                                  "[A-Za-z0-9_.-]")
            if not isinstance(src, str) or not _SOURCE.fullmatch(src):
                raise ConfigError(f"{what}.mac_keys.{kid} must be \"env:VAR\" or "
                                  "\"file:PATH\" (a literal key would be stored in the index)")
        as_str(self.mac_key_id, f"{what}.mac_key_id")
        if self.mac_key_id and self.mac_key_id not in self.mac_keys:
            raise ConfigError(f"{what}.mac_key_id {self.mac_key_id!r} is not in mac_keys")
        one_of(self.mac_algorithm, ("blake2b", "hmac-sha256"), f"{what}.mac_algorithm")
        if self.mac_keys and not self.mac_key_id:
            raise ConfigError(f"{what}: mac_keys given without mac_key_id (the key that seals "
                              "new records)")

    @classmethod
    def from_dict(cls, url: str, d: Any, what: str = "remote") -> RemoteSettings:
        check_keys(as_table(d, what), {f.name for f in fields(cls)} - {"url"}, what)
        return cls(url=url, **d)

    @property
    def give_up_s(self) -> float:
        """The longest a call to a server that stops answering (hung, gone, unreachable)
        waits before it fails with TierUnavailableError: a connect, a reply, and the
        reconnects begun within ``timeout_s`` (12 s by default)."""
        return self.connect_timeout_s + 2 * self.timeout_s

    @property
    def authenticated(self) -> bool:
        return bool(self.mac_keys)

    def __repr__(self) -> str:   # secret sources are names, but keep reprs short and safe
        return (f"RemoteSettings(url={redact_url(self.url)!r}, namespace={self.namespace!r}, "
                f"authenticated={self.authenticated})")
