"""The planner's result: per block its tier, bits and code, why, and the totals."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from functools import cached_property
from typing import Any

from rkv.quant.widths import Width, width_text


@dataclass(frozen=True)
class PlannedBlock:
    """One block's choice: ``bits`` are its keys' bits and ``vbits`` its values' (equal
    unless the plan splits them; a ``"k"`` or ``"v"`` block's own bits are ``bits``)."""

    layer: int
    kind: str
    chunk: int
    tier: str
    bits: int
    code: str
    p_due: float
    p_sdc: float
    record_bytes: int
    kl: float
    expected_cost_us: float
    reason: str
    vbits: int = -1           # -1 in the constructor: equal to bits

    def __post_init__(self) -> None:
        if self.vbits < 0:
            object.__setattr__(self, "vbits", self.bits)

    @property
    def width(self) -> Width:
        """(key bits, value bits)."""
        return self.bits, self.vbits


@dataclass(frozen=True, eq=False)
class Plan:
    """``blocks`` in the order given (per block what it got and why, built when first
    asked for: the engine only needs ``block_tier``, ``block_bits`` and ``block_code``, the
    choice per block in the same order); ``total_cost_us`` the objective; ``kl`` the total
    KL; ``tier_bytes`` bytes placed per tier; ``expected_due`` the sum of P(DUE); ``binding``
    the constraints at their limit; ``method`` how it was solved; ``lower_bound_us`` a bound
    no plan beats (Lagrangian dual; the exact cost for ``plan_exact``); ``plan_us`` time
    taken (without the per-block reasons, which are computed on demand)."""

    source: tuple[PlannedBlock, ...] | Callable[[], tuple[PlannedBlock, ...]] = field(
        repr=False)
    total_cost_us: float
    kl: float
    kl_budget: float
    tier_bytes: dict[str, int]
    tier_free: dict[str, int]
    expected_due: float
    binding: tuple[str, ...]
    method: str
    lower_bound_us: float
    plan_us: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    block_tier: tuple[str, ...] = ()
    block_bits: tuple[int, ...] = ()
    block_code: tuple[str, ...] = ()
    block_vbits: tuple[int, ...] = ()     # the values' bits per block (equal to block_bits
                                          # unless split)

    @property
    def block_widths(self) -> tuple[Width, ...]:
        """(key bits, value bits) per block, in order."""
        v = self.block_vbits or self.block_bits
        return tuple(zip(self.block_bits, v, strict=True))

    @cached_property
    def blocks(self) -> tuple[PlannedBlock, ...]:
        src = self.source
        return src if isinstance(src, tuple) else src()

    @property
    def gap_bound(self) -> float:
        """Relative distance to the lower bound: the plan is at most this far from optimal."""
        if self.lower_bound_us <= 0:
            return 0.0 if self.total_cost_us <= 0 else float("inf")
        return max(0.0, self.total_cost_us / self.lower_bound_us - 1.0)

    def to_dict(self) -> dict[str, Any]:
        skip = ("source", "block_tier", "block_bits", "block_code", "block_vbits")
        d: dict[str, Any] = {"blocks": [asdict(b) for b in self.blocks]}
        d.update({f.name: getattr(self, f.name) for f in fields(self) if f.name not in skip})
        d["tier_bytes"], d["tier_free"] = dict(self.tier_bytes), dict(self.tier_free)
        d["binding"], d["extra"] = list(self.binding), dict(self.extra)
        return d

    def table(self, limit: int | None = 60, fmt: str = "text") -> str:
        """The blocks as a table through :mod:`rkv.ui` (``limit`` rows; text and markdown
        end with the plan's totals, json and csv are the rows alone)."""
        from rkv.ui import Column, render
        from rkv.ui.sizes import human_bytes, human_capacity

        cols = [Column("layer", align="right"), Column("kind"), Column("chunk", align="right"),
                Column("tier"), Column("bits", align="right"), Column("code"),
                Column("p_due", "P(DUE)", "right", ".2g"),
                Column("p_sdc", "P(SDC)", "right", ".2g"),
                Column("bytes", align="right"), Column("kl", "KL", "right", ".3g"),
                Column("cost_us", "cost us", "right", ".4g"), Column("reason")]
        rows = [{"layer": b.layer, "kind": b.kind.upper(), "chunk": b.chunk, "tier": b.tier,
                 "bits": width_text(b.width), "code": b.code, "p_due": b.p_due, "p_sdc": b.p_sdc,
                 "bytes": b.record_bytes, "kl": b.kl, "cost_us": b.expected_cost_us,
                 "reason": b.reason}
                for b in (self.blocks if limit is None else self.blocks[:limit])]
        out = render(rows, cols, fmt=fmt)
        if fmt in ("json", "csv"):
            return out
        used = ", ".join(f"{k} {human_bytes(v)} of {human_capacity(self.tier_free[k])}"
                         for k, v in self.tier_bytes.items())
        foot = (f"total cost {self.total_cost_us:.6g} us (bound {self.lower_bound_us:.6g}), "
                f"KL {self.kl:.4g}/{self.kl_budget:.4g}, expected DUE {self.expected_due:.3g}, "
                f"{used}; binding: {', '.join(self.binding) or 'none'}; {self.method}")
        if limit is not None and len(self.blocks) > limit:
            foot = f"({len(self.blocks) - limit} more blocks)\n" + foot
        return out.rstrip("\n") + "\n" + foot
