"""The sweep file's tables: which keys each holds and what each value must be.

The file nests tables in lists in tables (axes, layouts, rules, per-preset parameters). Each
table here is a frozen dataclass whose ``from_dict`` refuses keys it does not declare (naming
them and the allowed ones) and checks every value through :mod:`rkv.checks`, as every other
rkv config does, so every error is a one-line :class:`~rkv.errors.ConfigError` naming the
value's path, e.g. ``axes.bits[2] must be one of 16, 8, 4 or 2, got 3`` or
``axes.layout[0]: unknown key(s) plane; allowed: chunk_tokens, planes``. What needs more than
the file (codec specs, preset names and parameters, placement tables, rules, combinations of
axes) is checked by :mod:`rkv.eval.sweep.spec` as it expands the cells. The format is
documented in docs/sweeps.md.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from rkv.checks import as_float, as_int, as_str, as_table, check_keys, one_of
from rkv.errors import ConfigError

T = TypeVar("T")
Scalar = bool | int | float | str

METRICS = ("reliability", "quality", "cost")
TIERS = ("dram", "cxl", "nvme")
TEXTS = ("topics", "docs")
BITS = (16, 8, 4, 2)
SAMPLING = ("auto", "direct", "conditional")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def _got(value: Any) -> str:
    # A table or a long list in the message would not be one short line: its type says enough.
    if value is None or value == [] or isinstance(value, str | int | float):
        return repr(value)
    return type(value).__name__


def _keys(d: Any, cls: type, where: str) -> Mapping[str, Any]:
    """``d`` as a table that holds only ``cls``'s fields."""
    table = as_table(d, where)
    check_keys(table, [f.name for f in fields(cls)], where)
    return table


def _list(d: Mapping[str, Any], key: str, where: str, default: list[T],
          check: Callable[[Any, str], T]) -> list[T]:
    """The non-empty list ``d[key]``, each item checked by ``check`` (given its path), or
    ``default`` when the key is absent."""
    if key not in d:
        return list(default)
    value, name = d[key], f"{where}.{key}"
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{name} must be a non-empty list, got {_got(value)}")
    return [check(v, f"{name}[{i}]") for i, v in enumerate(value)]


def _choice(choices: tuple[T, ...]) -> Callable[[Any, str], T]:
    return lambda v, name: one_of(v, choices, name)


def _table(v: Any, name: str) -> dict[str, Any]:
    return dict(as_table(v, name))


def _scalar(v: Any, name: str) -> Scalar:
    if not isinstance(v, bool | int | float | str):
        raise ConfigError(f"{name} must be a number, a string or true/false, got {_got(v)}")
    return v


@dataclass(frozen=True)
class Layout:
    """How a block is laid out: tokens per block (chunk) and, optionally, byte planes (the
    axis code protects the values' high bytes, ``planes`` is the low plane's code)."""

    chunk_tokens: int = 256
    planes: str | None = None

    @classmethod
    def from_dict(cls, d: Any, where: str) -> Layout:
        t = _keys(d, cls, where)
        planes = t.get("planes")
        return cls(as_int(t.get("chunk_tokens", 256), f"{where}.chunk_tokens", lo=16, hi=4096),
                   None if planes is None else as_str(planes, f"{where}.planes"))


@dataclass(frozen=True)
class SweepSection:
    """``[sweep]``: the sweep's name, description, metrics, seeds and results file."""

    name: str = "sweep"
    description: str = ""
    metrics: list[str] = field(default_factory=lambda: list(METRICS))
    seeds: list[int] = field(default_factory=lambda: [0])
    results: str = ""

    @classmethod
    def from_dict(cls, d: Any, where: str = "sweep") -> SweepSection:
        t = _keys(d, cls, where)
        name = as_str(t.get("name", "sweep"), f"{where}.name")
        if not _NAME.fullmatch(name):
            raise ConfigError(f"{where}.name must be letters, digits, '_', '.' or '-', "
                              f"starting with a letter or digit, got {name!r}")
        return cls(name, as_str(t.get("description", ""), f"{where}.description"),
                   _list(t, "metrics", where, list(METRICS), _choice(METRICS)),
                   _list(t, "seeds", where, [0], lambda v, n: as_int(v, n, lo=0)),
                   as_str(t.get("results", ""), f"{where}.results"))


@dataclass(frozen=True)
class Axes:
    """``[axes]``: the lists whose product is the grid (``tier`` and ``preset``: ``None``
    when the file leaves them out)."""

    tier: list[str] | None = None
    preset: list[str] | None = None
    bits: list[int] = field(default_factory=lambda: [16])
    code: list[str] = field(default_factory=lambda: ["default"])
    ber_multiplier: list[float] = field(default_factory=lambda: [1.0])
    hours: list[float] = field(default_factory=lambda: [24.0])
    layout: list[Layout] = field(default_factory=lambda: [Layout()])
    placement: list[dict[str, Any]] = field(default_factory=lambda: [{}])

    @classmethod
    def from_dict(cls, d: Any, where: str = "axes") -> Axes:
        t = _keys(d, cls, where)
        return cls(
            None if t.get("tier") is None else _list(t, "tier", where, [], _choice(TIERS)),
            None if t.get("preset") is None else _list(t, "preset", where, [], as_str),
            _list(t, "bits", where, [16], _choice(BITS)),
            _list(t, "code", where, ["default"], as_str),
            _list(t, "ber_multiplier", where, [1.0],
                  lambda v, n: as_float(v, n, lo=0, lo_open=True)),
            _list(t, "hours", where, [24.0], lambda v, n: as_float(v, n, lo=0)),
            _list(t, "layout", where, [Layout()], Layout.from_dict),
            _list(t, "placement", where, [{}], _table))


@dataclass(frozen=True)
class ReliabilitySettings:
    """``[reliability]``: campaign trials and blocks per cell, and the sampling."""

    trials: int = 20
    blocks: int = 4
    sampling: str = "auto"
    # Planned cells only: chunks of the put whose (bits, code) mix weighs their campaigns
    # (unset: rkv.eval.sweep.spec.PLANNED_CHUNKS; left out of unplanned cells' keys).
    chunks: int | None = None

    @classmethod
    def from_dict(cls, d: Any, where: str = "reliability") -> ReliabilitySettings:
        t = _keys(d, cls, where)
        chunks = t.get("chunks")
        return cls(as_int(t.get("trials", 20), f"{where}.trials", lo=1),
                   as_int(t.get("blocks", 4), f"{where}.blocks", lo=1),
                   one_of(t.get("sampling", "auto"), SAMPLING, f"{where}.sampling"),
                   None if chunks is None else as_int(chunks, f"{where}.chunks", lo=1, hi=64))


@dataclass(frozen=True)
class QualitySettings:
    """``[quality]``: the text windows, the model's tokens and threads, and the fault
    multiplier of the quality windows per preset or tier (``ber_multiplier``: a preset or
    tier it leaves out injects at the cell's own ``ber_multiplier``)."""

    windows: int = 2                   # per text source
    text: list[str] = field(default_factory=lambda: list(TEXTS))
    prefix: int = 256                  # tokens whose KV goes through rkv
    scored: int = 32                   # tokens scored after the prefix
    threads: int = 1                   # torch threads per worker
    ber_multiplier: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: Any, where: str = "quality") -> QualitySettings:
        t = _keys(d, cls, where)
        mult = as_table(t.get("ber_multiplier", {}), f"{where}.ber_multiplier")
        return cls(as_int(t.get("windows", 2), f"{where}.windows", lo=1, hi=64),
                   _list(t, "text", where, list(TEXTS), _choice(TEXTS)),
                   as_int(t.get("prefix", 256), f"{where}.prefix", lo=16),
                   as_int(t.get("scored", 32), f"{where}.scored", lo=2),
                   as_int(t.get("threads", 1), f"{where}.threads", lo=1, hi=256),
                   {str(k): as_float(v, f"{where}.ber_multiplier.{k}", lo=0, lo_open=True)
                    for k, v in mult.items()})


@dataclass(frozen=True)
class CostSettings:
    """``[cost]``: the put whose bytes and throughput a cost cell measures."""

    chunks: int = 4                    # chunks of one put (SmolLM2-shaped KV)
    repeats: int = 3                   # put/get repeats; the median is kept

    @classmethod
    def from_dict(cls, d: Any, where: str = "cost") -> CostSettings:
        t = _keys(d, cls, where)
        return cls(as_int(t.get("chunks", 4), f"{where}.chunks", lo=1),
                   as_int(t.get("repeats", 3), f"{where}.repeats", lo=1))


def _params(d: Any, where: str = "params") -> dict[str, dict[str, Scalar | list[Scalar]]]:
    """``[params.<preset>]``: per preset, each parameter a value or a list (an axis)."""
    out: dict[str, dict[str, Scalar | list[Scalar]]] = {}
    for preset, table in as_table(d, where).items():
        name = f"{where}.{preset}"
        values: dict[str, Scalar | list[Scalar]] = {}
        for key, v in as_table(table, name).items():
            values[key] = ([_scalar(x, f"{name}.{key}[{i}]") for i, x in enumerate(v)]
                           if isinstance(v, list) else _scalar(v, f"{name}.{key}"))
        out[preset] = values
    return out


def _rules(d: Mapping[str, Any], key: str) -> list[dict[str, Any]]:
    """``include`` or ``exclude``: a list of tables (what they may name: spec's rules)."""
    value = d.get(key, [])
    if not isinstance(value, list):
        raise ConfigError(f"{key} must be a list of tables, got {_got(value)}")
    return [_table(v, f"{key}[{i}]") for i, v in enumerate(value)]


@dataclass(frozen=True)
class SweepFile:
    """A whole sweep file, its tables checked; every table the file leaves out has its
    defaults."""

    sweep: SweepSection = field(default_factory=SweepSection)
    axes: Axes = field(default_factory=Axes)
    params: dict[str, dict[str, Scalar | list[Scalar]]] = field(default_factory=dict)
    reliability: ReliabilitySettings = field(default_factory=ReliabilitySettings)
    quality: QualitySettings = field(default_factory=QualitySettings)
    cost: CostSettings = field(default_factory=CostSettings)
    include: list[dict[str, Any]] = field(default_factory=list)
    exclude: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def from_dict(cls, data: Any, source: str = "<sweep>") -> SweepFile:
        """The file's tables, checked; errors start with ``source`` (the file's name)."""
        t = _keys(data, cls, source)
        try:
            return cls(SweepSection.from_dict(t.get("sweep", {})),
                       Axes.from_dict(t.get("axes", {})), _params(t.get("params", {})),
                       ReliabilitySettings.from_dict(t.get("reliability", {})),
                       QualitySettings.from_dict(t.get("quality", {})),
                       CostSettings.from_dict(t.get("cost", {})),
                       _rules(t, "include"), _rules(t, "exclude"))
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from exc
