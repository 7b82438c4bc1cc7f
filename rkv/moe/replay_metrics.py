"""The expert replay's results and summary metrics (:mod:`rkv.moe.replay` defines them in
its module docstring): one :class:`MoEResult` per replay, and :func:`summarize`, which fills
the metrics that compare a run with others of the same layout and budget (recall, extra
misses, traffic, the gap closed against each end).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

BELADY = "belady"
NONE = "none"
HINTS = "hints"
ORACLE = "oracle"
PER_LAYER, GLOBAL = "per-layer", "global"


@dataclass
class MoEResult:
    """One replay: a policy, a prefetcher, a budget and a layout."""

    policy: str
    prefetch: str
    layout: str                   # "per-layer" or "global"
    budget: str                   # as asked
    budget_experts: int
    budget_fraction: float        # of all experts
    tokens: int
    accesses: int
    hits: int
    demand_bytes: int             # bytes of experts loaded on a miss
    prefetched: int               # prefetches issued
    prefetch_bytes: int           # what they moved on the link (a dropped one: its part)
    prefetch_used: int            # prefetched experts hit before leaving the cache
    evictions: int
    stall: float                  # modeled seconds, all tokens
    stall_no_hide: float          # what the same misses would cost without any overlap
    seconds: float                # wall time of the replay loop
    cancel_chunk: int = 0         # bytes a dropped prefetch still moves to (0: instant)
    interference: float = 0.0     # compute seconds added per second of overlapping copy
    interference_stall: float = 0.0   # the part of ``stall`` that interference added
    recall: float | None = None   # filled by :func:`summarize` (rkv.moe.replay's docstring)
    extra_misses: float | None = None
    gap_closed: float | None = None
    gap_prefetch: float | None = None
    traffic: float | None = None

    @property
    def label(self) -> str:
        pf = "" if self.prefetch == NONE else f" +{self.prefetch}"
        return f"{self.policy}{pf} ({self.layout})"

    @property
    def misses(self) -> int:
        return self.accesses - self.hits

    @property
    def hit_ratio(self) -> float:
        return self.hits / self.accesses if self.accesses else 0.0

    @property
    def link_bytes(self) -> int:
        """Every byte the link moved: demand loads and prefetches (dropped ones' parts)."""
        return self.demand_bytes + self.prefetch_bytes

    @property
    def bytes_per_token(self) -> float:
        return self.link_bytes / self.tokens if self.tokens else 0.0

    @property
    def precision(self) -> float | None:
        return self.prefetch_used / self.prefetched if self.prefetched else None

    @property
    def stall_per_token(self) -> float:
        return self.stall / self.tokens if self.tokens else 0.0

    def row(self) -> dict[str, Any]:
        return {**asdict(self), "label": self.label, "misses": self.misses,
                "hit_ratio": self.hit_ratio, "bytes_per_token": self.bytes_per_token,
                "link_bytes": self.link_bytes, "precision": self.precision,
                "stall_per_token": self.stall_per_token}


def gap(r: MoEResult, lru: MoEResult | None, ref: MoEResult | None) -> float | None:
    """``(S_lru - S) / (S_lru - S_ref)``: the share of the stall between ``lru`` and ``ref``
    that ``r`` removes (1 at ``ref``, 0 at ``lru``, negative when worse than LRU, above 1
    when better than ``ref``); None without both ends or when they stall the same."""
    if lru is None or ref is None or lru.stall - ref.stall <= 1e-12:
        return None
    return (lru.stall - r.stall) / (lru.stall - ref.stall)


def summarize(results: Sequence[MoEResult]) -> list[MoEResult]:
    """Fill, per run, against runs of the same layout and budget: recall and extra misses
    (against the same policy without prefetch), traffic (over LRU without prefetch), the
    demand-only gap closed (demand-only runs only: between LRU and Belady without prefetch)
    and the gap to the prefetch-aware reference (every run: between LRU without prefetch and
    Belady + oracle), where those runs exist."""
    by = {(r.policy, r.prefetch, r.layout, r.budget): r for r in results}
    out = []
    for r in results:
        base = by.get((r.policy, NONE, r.layout, r.budget))
        lru = by.get(("lru", NONE, r.layout, r.budget))
        opt = by.get((BELADY, NONE, r.layout, r.budget))
        ref = by.get((BELADY, ORACLE, r.layout, r.budget))
        recall = extra = None
        if r.prefetch != NONE:
            need = r.prefetch_used + r.misses
            recall = r.prefetch_used / need if need else None
            if base is not None and base.misses:
                extra = (need - base.misses) / base.misses
        traffic = (r.link_bytes / lru.demand_bytes if lru is not None and lru.demand_bytes
                   else None)
        out.append(replace(r, recall=recall, extra_misses=extra, traffic=traffic,
                           gap_closed=gap(r, lru, opt) if r.prefetch == NONE else None,
                           gap_prefetch=gap(r, lru, ref)))
    return out
