"""Placement targets (:class:`PlacementConfig`) and the planner's inputs per block and tier.

``PlacementConfig`` loads from a dict or TOML (a top-level table or a ``[placement]`` table)
and validates every key with a :class:`ConfigError` that names it. Units: probabilities per
block over its expected residency, KL in nats per request (additive over blocks), costs in
microseconds (``capacity_cost`` is microseconds-equivalent per GiB stored in that tier).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

from rkv.checks import (
    as_bool,
    as_float,
    as_int,
    as_probability,
    as_str,
    as_table,
    check_keys,
    one_of,
)
from rkv.errors import ConfigError
from rkv.inputs import load_toml, read_text
from rkv.quant.widths import QUANT_BITS, Width, uniform

BITS_ALLOWED = (16, 8, 4, 2)
DEFAULT_CODES = (
    "none",
    "rs(255,247)",
    "rs(255,239)",
    "rs(255,223)",
    "rs(255,239,interleave=8)",
    "bch(m=13,t=8)",
    "shardrs(k=16,m=2)",
)
KINDS = ("k", "v", "kv")
DEFAULT_RECOMPUTE_US_PER_TOKEN = 100.0
_KEYS = ("max_p_sdc", "max_p_due", "quality_budget_kl", "recompute_us_per_token",
         "recompute_us_per_chunk", "bits", "kv_bits", "codes", "capacity_cost",
         "lossy_demotion", "residency_hours", "reuse", "estimate", "profile",
         "layer_compute_us", "parallel_reads", "place_tiers")


def adjacent_pairs(bits: Sequence[int]) -> tuple[Width, ...]:
    """The default split widths: each pair of neighbouring quantized widths in ``bits``,
    keys above values first ((8, 4), (4, 8), (4, 2), (2, 4) for bits 8, 4, 2)."""
    q = sorted((b for b in bits if b in QUANT_BITS), reverse=True)
    return tuple(w for hi, lo in pairwise(q) for w in ((hi, lo), (lo, hi)))


def _pairs(v: Any) -> tuple[Width, ...]:
    """``kv_bits`` as a tuple of (key bits, value bits), each checked."""
    if isinstance(v, str) or not isinstance(v, Sequence):
        raise ConfigError(f"placement: kv_bits must be a list of [key bits, value bits] "
                          f"pairs, got {v!r}")
    out = []
    for w in v:
        ok = (not isinstance(w, str) and isinstance(w, Sequence) and len(w) == 2
              and all(type(b) is int and b in QUANT_BITS for b in w) and w[0] != w[1])
        if not ok:
            raise ConfigError(f"placement: kv_bits entries must be [key bits, value bits], "
                              f"two different values of 8, 4, 2 (equal widths belong in "
                              f"bits), got {w!r}")
        out.append((int(w[0]), int(w[1])))
    if len(set(out)) != len(out):
        raise ConfigError(f"placement: kv_bits has a pair twice: {v!r}")
    return tuple(out)


def _prob(d: Mapping[str, Any], key: str, default: float) -> float:
    return as_probability(d.get(key, default), f"placement: {key}")


def _nonneg(d: Mapping[str, Any], key: str, default: float | None) -> float | None:
    v = d.get(key, default)
    return None if v is None else as_float(v, f"placement: {key}", lo=0.0)


@dataclass(frozen=True)
class PlacementConfig:
    """Targets and candidates of a placement.

    ``max_p_sdc`` / ``max_p_due``: per block over its expected residency (options above
    them are never chosen). ``quality_budget_kl``: total KL of the next-token distribution per
    request, summed over the blocks of a put. Recompute cost of one chunk: either
    ``recompute_us_per_token`` x its tokens or a flat ``recompute_us_per_chunk`` (set at most
    one; neither means 100 us per token).
    ``bits`` a subset of {16, 8, 4, 2} (K and V of a block at the same width); ``kv_bits``
    (key bits, value bits) pairs of different widths from {8, 4, 2} offered to blocks that
    hold K and V (kind ``"kv"``) besides those (None, the default: :func:`adjacent_pairs` of
    ``bits``; ``()``: none); ``codes`` codec specs (``"none"`` = the end-to-end
    checksum alone). ``capacity_cost``: per tier name, microseconds-equivalent per GiB stored
    (tiers not named cost 0). ``lossy_demotion``: whether a later demotion may re-quantize a
    block (recorded for the demotion re-planner; the put planner does not use it).
    For the engine: ``residency_hours`` and ``reuse`` (reads) expected of a stored block
    (with ``estimate``, the default, only until the engine has learned them per tier and
    chunk depth from what its policies see: :mod:`policies.estimate`; ``estimate = false``
    pins these values), and ``profile``, the quality profile (a path or a shipped name;
    empty: the shipped profile for the model's fingerprint, if any; with none, only 16 bits
    are planned). ``layer_compute_us``: the compute time of one model layer while a restored
    prefix streams in (measured per model and machine); set, a block's read cost is the
    stall it causes under layer streaming (:mod:`rkv.placement.stall`) instead of its raw
    read time, so later layers may live in slower tiers; None (default): raw read time.
    ``parallel_reads``: whether the restore reads its tiers concurrently (one reader per
    tier) or, as rkv's own :meth:`Engine.get_layers` does, with one reader in layer order
    (false, the default). ``place_tiers`` (engine): the planner chooses each block's tier
    among the usable tiers as well (the layers of one chunk may live in different tiers;
    capacity, admission and eviction stay the decision site's); false (default): the
    decision site picks the chunk's tier and the planner its blocks' bits and codes there.
    """

    max_p_sdc: float = 1e-15
    max_p_due: float = 1e-5
    quality_budget_kl: float = 0.05
    recompute_us_per_token: float | None = None
    recompute_us_per_chunk: float | None = None
    bits: tuple[int, ...] = (16, 8, 4)
    codes: tuple[str, ...] = DEFAULT_CODES
    kv_bits: tuple[Width, ...] | None = None
    capacity_cost: Mapping[str, float] = field(default_factory=dict)
    lossy_demotion: bool = False
    residency_hours: float = 24.0
    reuse: float = 1.0
    estimate: bool = True
    profile: str = ""
    layer_compute_us: float | None = None
    parallel_reads: bool = False
    place_tiers: bool = False

    def __post_init__(self) -> None:
        # Re-validate through from_dict's rules so direct construction is checked too.
        self._validate()

    def _validate(self) -> None:
        _prob({"max_p_sdc": self.max_p_sdc}, "max_p_sdc", 0.0)
        _prob({"max_p_due": self.max_p_due}, "max_p_due", 0.0)
        _nonneg({"quality_budget_kl": self.quality_budget_kl}, "quality_budget_kl", 0.0)
        tok, chunk = self.recompute_us_per_token, self.recompute_us_per_chunk
        if tok is not None and chunk is not None:
            raise ConfigError("placement: set one of recompute_us_per_token and "
                              "recompute_us_per_chunk, not both")
        for key, v in (("recompute_us_per_token", tok), ("recompute_us_per_chunk", chunk)):
            _nonneg({key: v}, key, None)
        _nonneg({"layer_compute_us": self.layer_compute_us}, "layer_compute_us", None)
        if not isinstance(self.bits, tuple) or any(
                isinstance(b, bool) or b not in BITS_ALLOWED for b in self.bits) or len(
                set(self.bits)) != len(self.bits):
            raise ConfigError(f"placement: bits must be distinct values from {{16, 8, 4, 2}}, "
                              f"got {list(self.bits)!r}")
        pairs = _pairs(self.kv_bits) if self.kv_bits is not None else None
        if pairs is not None:
            object.__setattr__(self, "kv_bits", pairs)
        if not self.widths:
            raise ConfigError("placement: bits (and kv_bits) offer no width at all")
        if not self.codes or len(set(self.codes)) != len(self.codes):
            raise ConfigError(f"placement: codes must be a non-empty list of distinct codec "
                              f"specs, got {list(self.codes)!r}")
        from rkv.codec.stages import codec_for

        for spec in self.codes:
            if not isinstance(spec, str):
                raise ConfigError(f"placement: codes entries must be strings, got {spec!r}")
            try:
                codec_for(spec)
            except ConfigError as exc:
                raise ConfigError(f"placement: codes entry {spec!r} is not a codec: "
                                  f"{exc}") from exc
        cc = as_table(self.capacity_cost, "placement: capacity_cost",
                      what="a table of tier = cost per GiB", plain=False)
        for name, v in cc.items():
            as_float(v, f"placement: capacity_cost.{name}", lo=0.0)
        as_float(self.residency_hours, "placement: residency_hours", lo=0.0, lo_open=True)
        as_float(self.reuse, "placement: reuse", lo=0.0)
        as_str(self.profile, "placement: profile", what="a path or a name")
        for key in ("lossy_demotion", "estimate", "place_tiers", "parallel_reads"):
            as_bool(getattr(self, key), f"placement: {key}")

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PlacementConfig:
        """Build from a dict; unknown keys and bad values raise :class:`ConfigError`."""
        as_table(d, "placement", plain=False)
        if "placement" in d and isinstance(d["placement"], Mapping):
            d = d["placement"]
        check_keys(d, _KEYS, "placement")
        kw: dict[str, Any] = {}
        for key in ("max_p_sdc", "max_p_due"):
            if key in d:
                kw[key] = _prob(d, key, 0.0)
        if "quality_budget_kl" in d:
            kw["quality_budget_kl"] = _nonneg(d, "quality_budget_kl", None)
        if "recompute_us_per_chunk" in d:
            kw["recompute_us_per_chunk"] = _nonneg(d, "recompute_us_per_chunk", None)
        if "recompute_us_per_token" in d:
            kw["recompute_us_per_token"] = _nonneg(d, "recompute_us_per_token", None)
        if "layer_compute_us" in d:
            kw["layer_compute_us"] = _nonneg(d, "layer_compute_us", None)
        for key in ("bits", "codes"):
            if key in d:
                v = d[key]
                if isinstance(v, str) or not isinstance(v, Sequence):
                    raise ConfigError(f"placement: {key} must be a list, got {v!r}")
                kw[key] = tuple(v)
        if "kv_bits" in d:
            kw["kv_bits"] = _pairs(d["kv_bits"])
        if "capacity_cost" in d:
            cc = as_table(d["capacity_cost"], "placement: capacity_cost",
                          what="a table of tier = cost per GiB", plain=False)
            kw["capacity_cost"] = {str(k): as_float(v, f"placement: capacity_cost.{k}", lo=0.0)
                                   for k, v in cc.items()}
        for key in ("lossy_demotion", "residency_hours", "reuse", "estimate", "profile",
                    "place_tiers", "parallel_reads"):
            if key in d:
                kw[key] = d[key]
        return cls(**kw)

    @classmethod
    def from_toml(cls, text: str) -> PlacementConfig:
        return cls.from_dict(load_toml(text, "placement"))

    @classmethod
    def load(cls, path: str | Path) -> PlacementConfig:
        return cls.from_toml(read_text(path, "placement: config"))

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "max_p_sdc": self.max_p_sdc, "max_p_due": self.max_p_due,
            "quality_budget_kl": self.quality_budget_kl,
            "bits": list(self.bits), "codes": list(self.codes),
            "capacity_cost": dict(self.capacity_cost), "lossy_demotion": self.lossy_demotion,
            "residency_hours": self.residency_hours, "reuse": self.reuse,
            "estimate": self.estimate, "profile": self.profile,
            "place_tiers": self.place_tiers, "parallel_reads": self.parallel_reads,
        }
        if self.layer_compute_us is not None:
            d["layer_compute_us"] = self.layer_compute_us
        if self.kv_bits is not None:      # None: the default pairs follow bits
            d["kv_bits"] = [list(w) for w in self.kv_bits]
        if self.recompute_us_per_chunk is not None:
            d["recompute_us_per_chunk"] = self.recompute_us_per_chunk
        elif self.recompute_us_per_token is not None:
            d["recompute_us_per_token"] = self.recompute_us_per_token
        return d

    @property
    def split_widths(self) -> tuple[Width, ...]:
        """The (key bits, value bits) pairs of different widths in effect."""
        return adjacent_pairs(self.bits) if self.kv_bits is None else self.kv_bits

    @property
    def widths(self) -> tuple[Width, ...]:
        """Every width a ``"kv"`` block may take: ``bits`` (K = V), then ``kv_bits``."""
        return tuple(uniform(b) for b in self.bits) + self.split_widths

    def fixed(self, width: Width) -> PlacementConfig:
        """This config offering only ``width`` (and no KL limit: a block keeping the width it
        has keeps the KL it already costs)."""
        from dataclasses import replace

        k, v = width
        if k == v:
            return replace(self, bits=(k,), kv_bits=(), quality_budget_kl=1e300)
        return replace(self, bits=(), kv_bits=((k, v),), quality_budget_kl=1e300)

    @property
    def us_per_token(self) -> float:
        """The per-token recompute cost in effect (the default when neither key is set)."""
        if self.recompute_us_per_token is None:
            return DEFAULT_RECOMPUTE_US_PER_TOKEN
        return self.recompute_us_per_token

    def recompute_us(self, tokens: int) -> float:
        """Recompute cost of one chunk of ``tokens`` tokens."""
        if self.recompute_us_per_chunk is not None:
            return self.recompute_us_per_chunk
        return self.us_per_token * tokens


@dataclass(frozen=True)
class TierInput:
    """A tier as the planner sees it: its fault model (a ``faultmodels`` model, a preset
    name or a ``get_model`` dict), free capacity, read bandwidth and latency."""

    name: str
    fault_model: Any
    free_bytes: int
    read_gbps: float
    latency_us: float

    def __post_init__(self) -> None:
        if not self.name:
            raise ConfigError("tier: name must be non-empty")
        as_int(self.free_bytes, f"tier {self.name}: free_bytes", lo=0)
        as_float(self.read_gbps, f"tier {self.name}: read_gbps", lo=0.0, lo_open=True,
                 plain=False)
        as_float(self.latency_us, f"tier {self.name}: latency_us", lo=0.0, plain=False)


@dataclass(frozen=True)
class BlockInput:
    """One block of a put: ``layer``, ``kind`` (``"k"``, ``"v"``, or ``"kv"``: both, one
    record, as the engine stores them today), ``chunk`` (its position in the prefix, 0 first),
    ``tokens``, ``residency_hours`` expected, ``reuse`` (expected reads), and the KV shape
    (``kv_heads``, ``head_dim``, ``dtype``). ``n_chunks``: chunks in the whole prefix (default:
    1 + the last chunk of the put); a DUE here costs the recompute of chunks ``chunk`` ..
    ``n_chunks - 1``."""

    layer: int
    kind: str
    chunk: int
    tokens: int
    residency_hours: float
    reuse: float
    kv_heads: int
    head_dim: int
    dtype: str = "float16"
    n_chunks: int | None = None

    def __post_init__(self) -> None:
        one_of(self.kind, KINDS, "block: kind")
        for key in ("layer", "chunk", "tokens", "kv_heads", "head_dim"):
            as_int(getattr(self, key), f"block: {key}", lo=0 if key in ("layer", "chunk") else 1)
        as_float(self.residency_hours, "block: residency_hours", lo=0.0, lo_open=True,
                 plain=False)
        as_float(self.reuse, "block: reuse", lo=0.0, plain=False)
        if self.n_chunks is not None and self.n_chunks <= self.chunk:
            raise ConfigError(f"block: n_chunks ({self.n_chunks}) must exceed chunk "
                              f"({self.chunk})")

    @property
    def label(self) -> str:
        return f"layer {self.layer} {self.kind.upper()} at chunk {self.chunk}"
