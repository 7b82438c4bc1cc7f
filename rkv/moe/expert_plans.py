"""Per-expert placement: each MoE expert's tier, bit-width and code, chosen like a KV block's
(docs/moe.md, "Per-expert bits and codes").

The same multiple-choice knapsack as a put (:mod:`rkv.placement.solver`), with the same
targets (:class:`PlacementConfig`: ``max_p_sdc``, ``max_p_due`` per record over
``residency_hours``, ``bits``, ``codes``, ``capacity_cost``) and the same reliability answers
(:class:`ReliabilityCache`, i.e. :func:`rkv.reliability.analytic.predict` on the record's
payload). What differs is what an option costs, per generated token:

* reading: ``loads`` (expected loads of the expert from its tier per token: the device
  cache's misses; by default its activation rate) x (latency + record bytes / bandwidth);
* an uncorrectable read: ``loads x P(DUE) x due_cost_us`` (reloading a copy or failing);
* storage: ``capacity_cost[tier]`` per GiB stored, in the same per-token units;

and quality: the expert quality profile's KL of storing that expert at that bit-width
(:class:`rkv.moe.profile.ExpertProfile`), summed over the experts and kept within
``kl_budget`` (default the config's ``quality_budget_kl``). Without a profile only 16 bits is
offered. Byte-plane layouts are not offered: an expert is used exactly or not at all.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from rkv.errors import ConfigError
from rkv.format.dtypes import check_dtype
from rkv.placement.config import PlacementConfig, TierInput
from rkv.placement.errors import InfeasiblePlanError
from rkv.placement.options import DEFAULT_CACHE, GIB, MODELS, ReliabilityCache, by_value
from rkv.placement.solver import NoFeasibleChoice, Problem, solve_exact, solve_fast

if TYPE_CHECKING:
    from rkv.moe.profile import ExpertProfile

EXPERT_BITS = (16, 8, 4)
DEFAULT_DUE_COST_US = 1e6      # an unreadable expert: reload from elsewhere, or fail (1 s)


@dataclass(frozen=True)
class ExpertInput:
    """One expert: ``neurons`` rows of gate and up (``d_model`` wide) and ``down``, in
    ``dtype``; ``loads``: expected loads from its tier per generated token."""

    layer: int
    expert: int
    neurons: int
    d_model: int
    dtype: str = "float16"
    loads: float = 0.0

    def __post_init__(self) -> None:
        for key in ("layer", "expert", "neurons", "d_model"):
            v = getattr(self, key)
            lo = 0 if key in ("layer", "expert") else 1
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ConfigError(f"expert: {key} must be an integer >= {lo}, got {v!r}")
        check_dtype(self.dtype, "expert: dtype")
        if isinstance(self.loads, bool) or not (self.loads >= 0 and math.isfinite(self.loads)):
            raise ConfigError(f"expert: loads must be a finite number >= 0, got {self.loads!r}")

    @property
    def shape(self) -> tuple[int, int, int, int]:
        rows = 3 * self.neurons + (3 * self.neurons) % 2
        return (2, rows // 2, 1, self.d_model)


@dataclass(frozen=True)
class ExpertChoice:
    layer: int
    expert: int
    tier: str
    bits: int
    code: str
    record_bytes: int
    p_due: float
    p_sdc: float
    kl: float
    cost_us: float         # per token: reads, uncorrectable reads, storage


@dataclass(frozen=True, eq=False)
class ExpertPlan:
    """The plan: ``choices`` in the order the experts were given, and its totals."""

    choices: tuple[ExpertChoice, ...]
    cost_us: float
    kl: float
    kl_budget: float
    tier_bytes: Mapping[str, int]
    tier_free: Mapping[str, int]
    method: str
    lower_bound: float
    _index: dict[tuple[int, int], int] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._index.update({(c.layer, c.expert): i for i, c in enumerate(self.choices)})

    def get(self, layer: int, expert: int) -> ExpertChoice:
        try:
            return self.choices[self._index[(layer, expert)]]
        except KeyError:
            raise ConfigError(f"the plan has no expert {layer}/{expert}") from None

    def assignments(self) -> dict[tuple[int, int], tuple[str, int, str]]:
        """``{(layer, expert): (tier, bits, code)}``: what :class:`RkvExperts` writes."""
        return {(c.layer, c.expert): (c.tier, c.bits, c.code) for c in self.choices}

    def mix(self) -> dict[str, int]:
        """How many experts got each ``tier bits code``."""
        out: dict[str, int] = {}
        for c in self.choices:
            k = f"{c.tier} {c.bits} {c.code}"
            out[k] = out.get(k, 0) + 1
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))

    def summary(self) -> str:
        lines = [f"{len(self.choices)} experts, {self.cost_us:.1f} us/token expected, KL "
                 f"{self.kl:.4f} of {self.kl_budget:g} ({self.method})"]
        for name, used in self.tier_bytes.items():
            lines.append(f"  {name}: {used / 2**20:.1f} MiB of {self.tier_free[name] / 2**20:.1f}"
                         " MiB free")
        lines += [f"  {n:4d} x {k}" for k, n in self.mix().items()]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"cost_us": self.cost_us, "kl": self.kl, "kl_budget": self.kl_budget,
                "tier_bytes": dict(self.tier_bytes), "method": self.method,
                "lower_bound": self.lower_bound, "mix": self.mix(),
                "choices": [c.__dict__ for c in self.choices]}


@dataclass(frozen=True)
class _Options:
    """One expert shape's candidate options (tier-major, then bits, then code)."""

    tier: np.ndarray
    bits: np.ndarray
    code: np.ndarray
    record_bytes: np.ndarray
    read_us: np.ndarray
    p_due: np.ndarray
    p_sdc: np.ndarray
    cap_us: np.ndarray


def _sizes(shape: tuple[int, int, int, int], dtype: str, bits: int, code: str
           ) -> tuple[int, int]:
    """(payload bytes the code protects, record bytes) of an expert at ``bits``/``code``."""
    from rkv.moe.store import pipeline_for

    p = pipeline_for(bits, code).for_block(shape, dtype)
    data = p.data_bytes(shape, dtype)
    return int(data), int(p.record_bytes(shape, dtype))


def _options(e: ExpertInput, tiers: Sequence[TierInput], bits: Sequence[int],
             cfg: PlacementConfig, hours: float, cache: ReliabilityCache) -> _Options:
    rows: list[tuple[float, ...]] = []
    sizes = {(b, ci): _sizes(e.shape, e.dtype, b, code) for b in bits
             for ci, code in enumerate(cfg.codes) if not by_value(code)}
    for ti, t in enumerate(tiers):
        model, mkey = MODELS.get(t.fault_model)
        per_gib = float(cfg.capacity_cost.get(t.name, 0.0)) / GIB
        for b in bits:
            for ci, code in enumerate(cfg.codes):
                if (b, ci) not in sizes:
                    continue
                data, rec = sizes[(b, ci)]
                p_due, p_sdc, _ = cache.outcomes(code, data, model, hours, mkey)
                read = t.latency_us + rec / (t.read_gbps * 1e3)
                rows.append((ti, b, ci, rec, read, p_due, p_sdc, per_gib * rec))
    if not rows:
        raise ConfigError("expert placement: every code in the config is a byte-plane layout")
    a = [np.asarray(col) for col in zip(*rows, strict=True)]
    return _Options(a[0].astype(np.int64), a[1].astype(np.int64), a[2].astype(np.int64),
                    a[3], a[4], a[5], a[6], a[7])


def plan_experts(experts: Sequence[ExpertInput], tiers: Sequence[TierInput],
                 config: PlacementConfig | Mapping[str, Any] | None = None,
                 profile: ExpertProfile | None = None, *, kl_budget: float | None = None,
                 hours: float | None = None, due_cost_us: float = DEFAULT_DUE_COST_US,
                 fixed_bits: Mapping[tuple[int, int], int] | None = None,
                 cache: ReliabilityCache = DEFAULT_CACHE, exact: bool = False) -> ExpertPlan:
    """The cheapest (tier, bits, code) per expert meeting every target (module docstring).
    ``fixed_bits``: per ``(layer, expert)``, the only bit-width it may take (re-placing
    stored experts without their original weights); their KL then counts as fixed.
    ``exact``: branch and bound (small inputs; the tests' oracle). Raises
    :class:`InfeasiblePlanError` naming the constraint that cannot be met."""
    cfg = config if isinstance(config, PlacementConfig) else PlacementConfig.from_dict(
        config or {})
    if not experts or not tiers:
        raise ConfigError("expert placement needs at least one expert and one tier")
    if len({(e.layer, e.expert) for e in experts}) != len(experts):
        raise ConfigError("expert placement: an expert is listed twice")
    if len({t.name for t in tiers}) != len(tiers):
        raise ConfigError("expert placement: tier names must be distinct")
    budget = cfg.quality_budget_kl if kl_budget is None else float(kl_budget)
    if not (budget >= 0 and math.isfinite(budget)) or not due_cost_us >= 0:
        raise ConfigError("expert placement: kl_budget and due_cost_us must be >= 0")
    fixed = dict(fixed_bits or {})
    if any(b not in EXPERT_BITS for b in fixed.values()):
        raise ConfigError(f"expert placement: fixed bits must be in {EXPERT_BITS}")
    bits = sorted({b for b in cfg.bits if b in EXPERT_BITS and (b == 16 or (
        profile is not None and b in profile.bits))} | set(fixed.values()), reverse=True)
    if not bits:
        raise ConfigError(f"expert placement: none of bits {list(cfg.bits)} can be planned "
                          f"(16 always; 8 and 4 with an expert profile that has them)")
    h = cfg.residency_hours if hours is None else float(hours)
    shapes: dict[tuple[Any, ...], _Options] = {}
    for e in experts:                       # one options table per expert shape
        if (e.shape, e.dtype) not in shapes:
            shapes[(e.shape, e.dtype)] = _options(e, tiers, bits, cfg, h, cache)
    opts = [shapes[(e.shape, e.dtype)] for e in experts]
    m = max(len(o.tier) for o in opts)
    n = len(experts)
    cost = np.full((n, m), np.inf)
    kl = np.zeros((n, m))
    nbytes = np.zeros((n, m))
    tier = np.zeros((n, m), np.int64)
    for i, (e, o) in enumerate(zip(experts, opts, strict=True)):
        k = len(o.tier)
        b_fix = fixed.get((e.layer, e.expert))
        if fixed and b_fix is None:
            raise ConfigError(f"expert placement: fixed_bits misses expert {e.layer}/"
                              f"{e.expert}")
        ok = (o.p_due <= cfg.max_p_due) & (o.p_sdc <= cfg.max_p_sdc) & (
            True if b_fix is None else o.bits == b_fix)
        if not ok.any():
            raise _reliability_error(e, o, cfg, tiers)
        c = e.loads * (o.read_us + o.p_due * due_cost_us) + o.cap_us
        cost[i, :k] = np.where(ok, c, np.inf)
        if profile is not None and b_fix is None:
            kl[i, :k] = [profile.kl(e.layer, e.expert, int(b)) for b in o.bits]
        nbytes[i, :k], tier[i, :k] = o.record_bytes, o.tier
    # An option whose KL alone exceeds the budget is in no feasible plan: dropping it spares
    # the solver a multiplier that would have to grow without bound (budget 0).
    cost[kl > budget] = np.inf
    if not np.isfinite(cost).any(axis=1).all():
        raise InfeasiblePlanError(f"kl_budget={budget:g} cannot be met: an expert has no "
                                  f"option within it", "quality_budget_kl")
    cap = np.asarray([t.free_bytes for t in tiers], np.float64)
    prob = Problem(cost, kl, nbytes, tier, budget, cap)
    try:
        sol = solve_exact(prob) if exact else solve_fast(prob, hint=_greedy(prob))
    except NoFeasibleChoice as exc:
        raise _infeasible(exc, prob, tiers) from None
    names = [t.name for t in tiers]
    choices = []
    for i, (e, o) in enumerate(zip(experts, opts, strict=True)):
        j = int(sol.choice[i])
        choices.append(ExpertChoice(e.layer, e.expert, names[int(o.tier[j])], int(o.bits[j]),
                                    cfg.codes[int(o.code[j])], int(o.record_bytes[j]),
                                    float(o.p_due[j]), float(o.p_sdc[j]), float(kl[i, j]),
                                    float(cost[i, j])))
    used = prob.usage(sol.choice)
    return ExpertPlan(tuple(choices), float(sol.cost), float(used[0]), budget,
                      {nm: int(used[1 + k]) for k, nm in enumerate(names)},
                      {t.name: t.free_bytes for t in tiers}, sol.method,
                      float(sol.cost if sol.method == "exact" else sol.lower_bound))


def _greedy(p: Problem) -> np.ndarray | None:
    """A feasible start for the solver: experts by regret (their worst offered option's cost
    less their best's) take their cheapest option that still fits, keeping enough KL budget
    for the rest's least-KL options. Many experts of one size compete for the same tier room
    here, where the Lagrangian multipliers alone land up to 15 % above this (measured)."""
    cost = np.where(np.isfinite(p.cost), p.cost, np.nan)
    regret = np.nan_to_num(np.nanmax(cost, axis=1) - np.nanmin(cost, axis=1))
    min_kl = np.where(np.isfinite(p.cost), p.kl, np.inf).min(axis=1)
    free, kl_left = p.capacity.astype(np.float64).copy(), p.kl_budget - float(min_kl.sum())
    choice = np.zeros(p.shape[0], np.int64)
    for i in np.argsort(-regret, kind="stable"):
        kl_left += min_kl[i]
        ok = np.isfinite(p.cost[i]) & (p.nbytes[i] <= free[p.tier[i]]) & (p.kl[i] <= kl_left)
        if not ok.any():
            return None
        j = int(np.argmin(np.where(ok, p.cost[i], np.inf)))
        choice[i] = j
        free[p.tier[i, j]] -= p.nbytes[i, j]
        kl_left -= p.kl[i, j]
    return choice


def _reliability_error(e: ExpertInput, o: _Options, cfg: PlacementConfig,
                       tiers: Sequence[TierInput]) -> InfeasiblePlanError:
    due_ok = o.p_due <= cfg.max_p_due
    key, arr, limit = (("max_p_due", o.p_due, cfg.max_p_due) if not due_ok.any() else
                       ("max_p_sdc", np.where(due_ok, o.p_sdc, np.inf), cfg.max_p_sdc))
    j = int(np.argmin(arr))
    return InfeasiblePlanError(
        f"no option for expert {e.layer}/{e.expert} meets {key}={limit:g}: the best is "
        f"{cfg.codes[int(o.code[j])]} at {int(o.bits[j])} bits on {tiers[int(o.tier[j])].name} "
        f"at {arr[j]:.2g}", key)


def _infeasible(exc: NoFeasibleChoice, p: Problem, tiers: Sequence[TierInput]
                ) -> InfeasiblePlanError:
    free = ", ".join(f"{t.name} {t.free_bytes / 2**20:.1f} MiB" for t in tiers)
    if exc.proven and exc.violated == [0]:
        return InfeasiblePlanError(
            f"kl_budget={p.kl_budget:g} cannot be met: the least total KL of the options "
            f"that fit is {exc.usage[0]:.4g}", "quality_budget_kl")
    if 0 not in exc.violated or exc.violated == [-1]:
        return InfeasiblePlanError(f"the tiers cannot hold the experts (free: {free})",
                                   "capacity")
    return InfeasiblePlanError(f"no plan meets kl_budget={p.kl_budget:g} and the tiers' "
                               f"capacity together (free: {free})", "combined")
