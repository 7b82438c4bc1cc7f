"""What a scrub pass did (:class:`ScrubReport`) and how a scrubber works (:class:`ScrubConfig`);
see :mod:`rkv.store.scrub`."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from rkv.checks import as_bool, as_float, as_int, as_table, check_keys
from rkv.ui.tables import Column, check_format, render


@dataclass
class TierScrub:
    """What a pass did in one tier."""

    scanned: int = 0
    bytes_read: int = 0
    ok: int = 0
    corrected: int = 0          # read with corrections and rewritten
    refreshed: int = 0          # past the refresh age and rewritten
    moved: int = 0              # corrected again after a rewrite: moved a tier down
    repaired: int = 0           # uncorrectable, rebuilt from a copy in another tier
    lost: int = 0               # uncorrectable with no copy: chunk dropped
    skipped: int = 0            # moved, evicted or rewritten by others during the pass
    degraded: int = 0           # tolerant part damaged: left as it is (reads report it)


@dataclass
class ScrubReport:
    """A pass: per-tier counts, chunks dropped, time, and whether it was stopped early."""

    tiers: dict[str, TierScrub] = field(default_factory=dict)
    chunks_dropped: int = 0
    seconds: float = 0.0
    interrupted: bool = False
    total_blocks: int = 0

    def total(self, name: str) -> int:
        return sum(int(getattr(t, name)) for t in self.tiers.values())

    @property
    def bytes_read(self) -> int:
        return self.total("bytes_read")

    def to_dict(self) -> dict[str, Any]:
        return {"tiers": {n: vars(t).copy() for n, t in self.tiers.items()},
                "chunks_dropped": self.chunks_dropped, "seconds": self.seconds,
                "interrupted": self.interrupted, "total_blocks": self.total_blocks,
                "bytes_read": self.bytes_read}

    def rows(self) -> list[dict[str, Any]]:
        """One row per tier: what the pass did there (the table of :meth:`render`)."""
        return [{"tier": n, **vars(t)} for n, t in self.tiers.items()]

    def render(self, fmt: str = "text") -> str:
        """A ``zpool status``-like summary (``fmt`` text or markdown); ``json`` is
        :meth:`to_dict`, ``csv`` the per-tier rows."""
        check_format(fmt)
        if fmt == "json":
            return json.dumps(self.to_dict(), indent=2)
        if fmt == "csv":
            return render(self.rows(), [Column(k) for k in ("tier", *_FIELDS)], fmt="csv")
        state = "interrupted" if self.interrupted else "completed"
        mb = self.bytes_read / 1e6
        rate = mb / self.seconds if self.seconds > 0 else 0.0
        lines = [f"scrub {state}: {self.total('scanned')} of {self.total_blocks} blocks, "
                 f"{mb:,.1f} MB read in {self.seconds:,.1f} s ({rate:,.1f} MB/s)",
                 f"  corrected {self.total('corrected')}, refreshed "
                 f"{self.total('refreshed')}, moved {self.total('moved')}, repaired "
                 f"{self.total('repaired')}, lost "
                 f"{self.total('lost')} ({self.chunks_dropped} chunks dropped), skipped "
                 f"{self.total('skipped')}"]
        if self.tiers:
            lines += [""] if fmt == "markdown" else []
            lines.append(render(self.rows(), _COLUMNS, fmt=fmt, indent=2).rstrip("\n"))
        return "\n".join(lines)


_FIELDS = tuple(f.name for f in fields(TierScrub))
_COLUMNS = [Column("tier"), Column("scanned", align="right"),
            Column("bytes_read", "MB", "right", lambda b: f"{b / 1e6:,.1f}"),
            *(Column(k, align="right") for k in ("corrected", "refreshed", "moved",
                                                 "repaired", "lost", "degraded"))]


@dataclass(frozen=True)
class ScrubConfig:
    """How a scrubber works. ``budget_mbps``: read bandwidth limit (MB/s, None: as fast as
    the tiers go). ``tiers``: which tiers (None: all). ``refresh_hours``: per tier, the age
    at which a block is rewritten though it reads clean (a tier not named: from its fault
    model and the engine's ``scrub_target_p_due``; inf: never). ``margin``: corrected
    symbols at or above which a block is rewritten (header copies and erasures always are).
    ``interval_hours``: the background scrubber's time between pass starts (None: from the
    tiers' schedules, the shortest). ``batch``: blocks per rewrite transaction."""

    budget_mbps: float | None = None
    tiers: tuple[str, ...] | None = None
    refresh_hours: Mapping[str, float] = field(default_factory=dict)
    margin: int = 1
    interval_hours: float | None = None
    batch: int = 64

    def __post_init__(self) -> None:
        # inf is allowed where it means something: no limit, never refresh, no repeat.
        if self.budget_mbps is not None:
            as_float(self.budget_mbps, "scrub budget_mbps", lo=0, lo_open=True, finite=False)
        rh = as_table(self.refresh_hours, "scrub refresh_hours", what="a table of tier = hours",
                      plain=False)
        for name, h in rh.items():
            as_float(h, f"scrub refresh_hours[{name}]", lo=0, lo_open=True, finite=False)
        as_int(self.margin, "scrub margin", lo=1)
        if self.interval_hours is not None:
            as_float(self.interval_hours, "scrub interval_hours", lo=0, lo_open=True,
                     finite=False)
        as_int(self.batch, "scrub batch", lo=1)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ScrubConfig:
        """From an engine ``[scrub]`` table (keys as the fields; unknown keys are errors)."""
        check_keys(d, ("budget_mbps", "tiers", "refresh_hours", "margin", "interval_hours",
                       "batch", "enabled"), "scrub")
        as_bool(d.get("enabled", True), "scrub enabled")
        kw = {k: v for k, v in d.items() if k != "enabled"}
        if "tiers" in kw:
            kw["tiers"] = tuple(kw["tiers"])
        return cls(**kw)
