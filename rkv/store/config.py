"""Frozen configuration dataclasses that round-trip to dicts and TOML."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field, fields, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import tomli_w

from rkv.checks import (
    as_bool,
    as_float,
    as_int,
    as_str,
    as_table,
    check_keys,
    one_of,
)
from rkv.errors import ConfigError
from rkv.placement.config import PlacementConfig
from rkv.store.scrub_report import ScrubConfig
from rkv.ui.sizes import parse_size

log = logging.getLogger(__name__)

GiB = 1 << 30
MiB = 1 << 20
#: Largest tier capacity (1 PiB) and LMDB map (4 PiB) a config may ask for: beyond any
#: machine's address space, and small enough that every size sum stays within 64 bits.
MAX_TIER_BYTES = 1 << 50
MAX_MAP_BYTES = 1 << 52

#: Tier fields that are byte counts: a config may write them as sizes (``"64MiB"``,
#: ``"1.5GB"``), parsed by :func:`rkv.ui.sizes.parse_size` as ``RKV_*`` variables are.
SIZE_FIELDS = ("capacity_bytes", "map_bytes")

Medium = Literal["memory", "disk"]
OnFull = Literal["evict", "error"]


def _check_fields(cls: type, d: Any, what: str) -> dict[str, Any]:
    check_keys(as_table(d, what), (f.name for f in fields(cls)), what)
    return dict(d)


def _check_policy(spec: Any, what: str, capacity: int, *, kind: str = "eviction") -> None:
    """A policy spec that cannot be built is a ConfigError now, not at the first put."""
    from policies import make_admission, make_policy, make_prefetch, split_spec
    from policies.base import PolicyError

    as_str(spec, what, nonempty=True, what="a spec string such as 'lru'")
    try:
        if kind == "admission":
            make_admission(spec)
        elif kind == "prefetch":
            make_prefetch(spec)
        else:
            evict, admit = split_spec(spec)
            make_policy(evict, capacity)
            make_admission(admit)
    except PolicyError as exc:
        raise ConfigError(f"{what}: bad spec {spec!r}: {exc}") from exc


@dataclass(frozen=True)
class TierConfig:
    """One storage tier.

    ``path`` may be absolute, relative to the store root, or empty: then a ``memory`` tier lives
    in a memory-backed directory (``/dev/shm`` when the machine has one) and a ``disk`` tier
    under ``<store>/tiers/<name>``. Bandwidths (GB/s) and latency (microseconds) are nominal
    figures for the cost model; ``fault_model`` names the tier's fault-model preset (empty:
    chosen by medium, :func:`default_fault_model`, and written into the stored config, so
    ``rkv info`` shows it; a config file that leaves it out gets a warning); ``ecc``
    is the codec spec new blocks in this tier are protected with (``"none"``, ``"rs(255,239)"``,
    ``"bch(m=13,t=8)"``, ``"shardrs(k=16,m=2)"``; see docs/ecc.md); ``quant`` the quantizer
    (``"none"`` keeps the values as they are, ``"kivi(bits=4)"``; see docs/quantization.md).
    ``map_bytes`` is the LMDB map, fixed for the life of the process (address space, not
    memory: the file grows as it fills); 0 sizes it from the capacity. ``policy`` chooses
    what leaves the tier when it is full and what may enter it then: an eviction spec from
    ``policies`` (``"lru"``, ``"s3fifo(small=0.1)"``, ``"prefix"``), optionally with an
    admission spec after a ``+`` (``"prefix+after(n=2)"``); the default, ``"adaptive"``,
    follows whichever of LRU, ``prefix``, ``reuse`` and ``prefix+after(n=2)`` would have
    served the tier best lately; see docs/policies.md.
    ``reads``: ``"mmap"`` reads records zero-copy through the map; ``"pread"`` copies them out
    of the file, so a lost page (poisoned memory, a truncated file) fails the read with its
    range (decoded as an erasure) instead of killing the process with SIGBUS.
    ``kind``: ``"lmdb"`` (a local LMDB environment) or ``"redis"``: a remote tier on a Redis
    server at ``url`` (``redis://host:port/db``, ``rediss://`` for TLS), shared by the nodes
    that use the same ``remote.namespace``; the ``remote`` table holds its connection, TLS,
    credential (``"env:VAR"`` or ``"file:PATH"``, never the secret itself) and MAC settings
    (docs/remote.md). ``medium``, ``path``, ``sync``, ``map_bytes`` and ``reads`` apply to
    LMDB tiers only.
    """

    name: str
    medium: Medium = "disk"
    path: str = ""
    capacity_bytes: int = 16 * GiB
    read_gbps: float = 6.0
    write_gbps: float = 3.0
    latency_us: float = 80.0
    fault_model: str = ""
    ecc: str = "none"
    quant: str = "none"
    sync: bool = False
    map_bytes: int = 0
    policy: str = "adaptive"
    reads: str = "mmap"
    kind: str = "lmdb"
    url: str = ""
    remote: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ConfigError(f"tier name must be an identifier-like string, got {self.name!r}")
        t = f"tier {self.name}: "
        one_of(self.kind, ("lmdb", "redis"), t + "kind")
        if self.kind == "lmdb" and (self.url or self.remote):
            raise ConfigError(f"tier {self.name}: url and remote apply to kind = 'redis' only")
        try:
            self.remote_settings()
        except ConfigError as exc:
            raise ConfigError(f"tier {self.name}: {exc}") from exc
        one_of(self.medium, ("memory", "disk"), t + "medium")
        as_str(self.path, t + "path")
        for name in SIZE_FIELDS:                    # "64MiB" as RKV_TIER_<NAME>_<FIELD> reads it
            value = getattr(self, name)
            if isinstance(value, str):
                object.__setattr__(self, name, parse_size(value, t + name))
        as_int(self.capacity_bytes, t + "capacity_bytes", lo=1, hi=MAX_TIER_BYTES)
        as_int(self.map_bytes, t + "map_bytes", lo=0, hi=MAX_MAP_BYTES)
        if 0 < self.map_bytes < self.capacity_bytes:
            raise ConfigError(f"tier {self.name}: map_bytes must be 0 (automatic) or at least "
                              f"capacity_bytes, got {self.map_bytes!r}")
        for name in ("read_gbps", "write_gbps"):
            as_float(getattr(self, name), t + name, lo=1e-9, finite=False)
        as_float(self.latency_us, t + "latency_us", lo=0.0, finite=False)
        as_str(self.fault_model, t + "fault_model", what="a preset name")
        if not self.fault_model.strip():
            object.__setattr__(self, "fault_model", default_fault_model(self))
        as_bool(self.sync, t + "sync")
        one_of(self.reads, ("mmap", "pread"), t + "reads")
        as_str(self.ecc, t + "ecc", nonempty=True, what="a codec spec such as 'rs(255,239)'")
        if self.ecc.strip().lower() != "none":
            from rkv.ecc import get_codec  # imported only when a tier uses ECC (numba)

            try:
                get_codec(self.ecc)
            except ConfigError as exc:
                raise ConfigError(f"tier {self.name}: bad ecc {self.ecc!r}: {exc}") from exc
        _check_policy(self.policy, f"tier {self.name}: policy", self.capacity_bytes)
        as_str(self.quant, t + "quant", nonempty=True, what="a spec such as 'kivi(bits=4)'")
        if self.quant.strip().lower() not in ("none", "fp16", "16"):
            try:
                from rkv.quant import get_quantizer

                get_quantizer(self.quant)
            except ImportError as exc:  # pragma: no cover
                raise ConfigError(f"tier {self.name}: quantization unavailable: {exc}") from exc
            except ConfigError as exc:
                raise ConfigError(f"tier {self.name}: bad quant {self.quant!r}: {exc}") from exc
            if self.ecc.strip().lower() != "none":
                from rkv.codec.pipeline import Pipeline

                try:
                    Pipeline.parse(self.quant, self.ecc)
                except ConfigError as exc:
                    raise ConfigError(f"tier {self.name}: {exc}") from exc

    def remote_settings(self) -> Any:
        """The remote tier's validated settings (RemoteSettings), None for an LMDB tier."""
        if self.kind != "redis":
            return None
        from rkv.tiers.remote_config import RemoteSettings

        return RemoteSettings.from_dict(self.url, self.remote)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TierConfig:
        if isinstance(d, dict):
            d = {k: v for k, v in d.items() if k != "initial_map_bytes"}  # pre-fixed-map stores
        d = _check_fields(cls, d, "tier")
        if "name" not in d:
            raise ConfigError("a tier needs a name")
        tier = cls(**d)
        if not str(d.get("fault_model", "")).strip():
            # Said, never silent: the fault model sets the tier's ECC plan and scrub schedule.
            log.warning("tier %s: no fault_model given; using %r, the default for %s (set "
                        "fault_model to choose; docs/faultmodels/index.md)", tier.name,
                        tier.fault_model, _default_reason(tier))
        return tier


def default_fault_model(tier: TierConfig) -> str:
    """The fault-model preset of a tier that names none, by what holds its bytes, never by
    its name: a remote (Redis) tier and a ``memory`` tier are DRAM (``dram-ddr5``), a
    ``disk`` tier is flash (``nvme-tlc``). ``raw-ber`` is never a default: it is a test
    model of independent bit flips, not a device."""
    return "dram-ddr5" if tier.kind == "redis" or tier.medium == "memory" else "nvme-tlc"


def _default_reason(tier: TierConfig) -> str:
    return "kind = 'redis'" if tier.kind == "redis" else f"medium = {tier.medium!r}"


def default_tiers() -> tuple[TierConfig, ...]:
    """DRAM, CXL and NVMe with nominal figures from docs/tiers.md."""
    return (
        TierConfig("dram", medium="memory", capacity_bytes=2 * GiB, read_gbps=20.0,
                   write_gbps=15.0, latency_us=0.1, fault_model="dram-ddr5", ecc="none"),
        TierConfig("cxl", medium="memory", capacity_bytes=8 * GiB, read_gbps=12.0,
                   write_gbps=10.0, latency_us=0.25, fault_model="cxl", ecc="rs(255,247)"),
        TierConfig("nvme", medium="disk", capacity_bytes=64 * GiB, read_gbps=6.5,
                   write_gbps=3.0, latency_us=80.0, fault_model="nvme-tlc",
                   ecc="shardrs(k=16,m=2)", sync=False),
    )


@dataclass(frozen=True)
class EngineConfig:
    """Engine-wide settings.

    ``chunk_tokens`` fixes the key space of a store and cannot change once data is written.
    ``on_full`` decides what happens when the last tier is full: ``evict`` the victims of its
    policy, or ``error`` (raise :class:`~rkv.errors.TierFullError`). Upper tiers always
    demote their policy's victims to the next tier.
    ``index_sync`` fsyncs the index on every commit (durable against power loss).
    ``repair`` rewrites a block whose read needed correction (header copy or ECC) in place.
    ``promote`` decides when a chunk read from a lower tier moves to the top tier, in the
    background: ``"never"``, ``"all"`` (every such read) or ``"after(n=2)"`` (from its n-th
    read on). ``prefetch`` orders what :meth:`Engine.prefetch` moves when its budget does
    not cover everything: ``"queue"`` or ``"shallow"`` (see docs/policies.md).
    ``placement`` (a ``[placement]`` table, empty: off) plans each block's bits and code in
    the tier the policies choose, from the tiers' fault models and a quality profile under
    P(SDC), P(DUE) and KL targets (see docs/placement.md); off, a tier's ``quant`` and
    ``ecc`` apply to all its blocks.
    ``scrub_target_p_due``: the P(DUE) per block that the scrub schedule computed from each
    tier's fault model meets (refresh age, scrub interval; ``rkv info --schedule``,
    docs/scrub-schedule.md). ``scrub`` (a ``[scrub]`` table, empty: off) runs a background
    patrol scrubber while the store is open for writing: ``enabled = true`` alone takes the
    defaults; ``budget_mbps``, ``tiers``, ``refresh_hours`` (per tier), ``margin``,
    ``interval_hours`` (default: the schedule's shortest), ``batch`` (docs/scrub.md).
    ``codec_threads``: threads that encode, decode and checksum a put's or get's blocks
    (the process-wide pool of :mod:`rkv.parallel`); 0 (default) is one per available CPU.
    """

    chunk_tokens: int = 256
    tiers: tuple[TierConfig, ...] = field(default_factory=default_tiers)
    on_full: OnFull = "evict"
    store_partial_chunks: bool = True
    index_sync: bool = False
    repair: bool = True
    promote: str = "after(n=2)"
    prefetch: str = "queue"
    placement: dict[str, Any] = field(default_factory=dict)
    scrub_target_p_due: float = 1e-9
    scrub: dict[str, Any] = field(default_factory=dict)
    codec_threads: int = 0

    def __post_init__(self) -> None:
        as_int(self.chunk_tokens, "chunk_tokens", lo=1, hi=1 << 20)
        tiers = tuple(self.tiers)
        if not tiers:
            raise ConfigError("at least one tier is required")
        if not all(isinstance(t, TierConfig) for t in tiers):
            raise ConfigError("tiers must be TierConfig objects")
        names = [t.name for t in tiers]
        if len(set(names)) != len(names):
            raise ConfigError(f"tier names must be unique, got {names}")
        object.__setattr__(self, "tiers", tiers)
        one_of(self.on_full, ("evict", "error"), "on_full")
        for name in ("store_partial_chunks", "index_sync", "repair"):
            as_bool(getattr(self, name), name)
        if self.promote != "never":
            _check_policy(self.promote, "promote", 1, kind="admission")
        _check_policy(self.prefetch, "prefetch", 1, kind="prefetch")
        as_table(self.placement, "placement", what="a table (see docs/placement.md)")
        as_table(self.scrub, "scrub", what="a table (see docs/scrub.md)")
        _ = self.placement_config, self.scrub_config     # parsed (and so checked) once, now
        as_float(self.scrub_target_p_due, "scrub_target_p_due", lo=1e-300, hi=1.0,
                 hi_open=True)
        as_int(self.codec_threads, "codec_threads", lo=0, hi=4096)

    @cached_property
    def placement_config(self) -> PlacementConfig | None:
        """The ``[placement]`` table, parsed once (None: no placement); what the engine and
        ``rkv plan`` use. ``placement`` keeps the table as written, for the round trip."""
        return PlacementConfig.from_dict(self.placement) if self.placement else None

    @cached_property
    def scrub_config(self) -> ScrubConfig:
        """The ``[scrub]`` table, parsed once (defaults for an empty table)."""
        return ScrubConfig.from_dict(self.scrub)

    def tier(self, name: str) -> TierConfig:
        for t in self.tiers:
            if t.name == name:
                return t
        raise ConfigError(f"no tier named {name!r} (tiers: {[t.name for t in self.tiers]})")

    def with_tier(self, name: str, **changes: Any) -> EngineConfig:
        """A copy with one tier's fields changed, e.g. ``with_tier("cxl", path="/mnt/cxl")``."""
        self.tier(name)
        tiers = tuple(replace(t, **changes) if t.name == name else t for t in self.tiers)
        return replace(self, tiers=tiers)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["tiers"] = [t.to_dict() for t in self.tiers]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EngineConfig:
        d = _check_fields(cls, d, "engine config")
        if "tiers" in d:
            if not isinstance(d["tiers"], list | tuple):
                raise ConfigError(f"tiers must be a list of tables, got {d['tiers']!r}")
            d["tiers"] = tuple(TierConfig.from_dict(t) for t in d["tiers"])
        return cls(**d)

    def to_toml(self) -> str:
        return tomli_w.dumps(self.to_dict())

    @classmethod
    def from_toml(cls, text: str) -> EngineConfig:
        return cls.from_dict(parse_toml(text))

    @classmethod
    def load(cls, path: str | Path) -> EngineConfig:
        return cls.from_toml(read_text(path))


def parse_toml(text: str, what: str = "") -> dict[str, Any]:
    """A TOML document as a dict; bad or too deeply nested TOML is a ConfigError (``what``
    prefixes it)."""
    from rkv.inputs import load_toml

    return load_toml(text, what.rstrip(": "))


def read_text(path: str | Path, what: str = "") -> str:
    """A config file's text (a regular file of at most 1 MiB: :mod:`rkv.inputs`); anything
    else is a ConfigError."""
    from rkv.inputs import read_text as read

    return read(path, f"{what}config")
