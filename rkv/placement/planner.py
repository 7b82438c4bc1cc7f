"""The placement planner: each block's tier, bit-width and code for a whole put.

Options per block are every tier x bits x code (:mod:`rkv.placement.options`). An option
that misses ``max_p_due`` or ``max_p_sdc`` is not offered; the rest cost, in microseconds,

    reuse x (latency + record bytes / bandwidth)       reading it back, each expected read
  + P(DUE) x recompute(this chunk .. last chunk)       a lost block stops the read there
  + capacity_cost[tier] x record bytes                 what holding the bytes costs

and the choice minimises the sum subject to total KL <= ``quality_budget_kl`` and bytes per
tier <= its free capacity (:mod:`rkv.placement.solver`). Infeasible targets raise
:class:`InfeasiblePlanError` naming the constraint.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from rkv.errors import ConfigError
from rkv.placement.config import BlockInput, PlacementConfig, TierInput
from rkv.placement.errors import InfeasiblePlanError
from rkv.placement.options import (
    DEFAULT_CACHE,
    ReliabilityCache,
    Template,
    build_template,
    class_key,
    data_bytes,
    model_key,
    recompute_costs,
    resolve_model,
)
from rkv.placement.plan import Plan, PlannedBlock
from rkv.placement.profile import QualityProfile, as_profile
from rkv.placement.solver import NoFeasibleChoice, Problem, Solution, solve_exact, solve_fast

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
ProfileLike = QualityProfile | Mapping[Any, Any] | Callable[[int, str, int], float] | None


@dataclass(frozen=True)
class _Built:
    problem: Problem
    cls: I64                 # template index per block
    templates: list[Template]
    full_cost: F64           # (n, M) cost of every option, limits ignored
    tiers: tuple[str, ...]
    cols: I64                # template option index of each problem column


class Planner:
    """Plans puts under one :class:`PlacementConfig` and quality profile. Templates and
    ``predict`` answers are cached across calls (``cache``; default: a process-wide one)."""

    def __init__(self, config: PlacementConfig | Mapping[str, Any] | None = None,
                 profile: ProfileLike = None, cache: ReliabilityCache | None = None) -> None:
        if config is None:
            config = PlacementConfig()
        elif not isinstance(config, PlacementConfig):
            config = PlacementConfig.from_dict(config)
        self.config = config
        self.profile = as_profile(profile)
        if self.profile is None and any(b < 16 for b in config.bits):
            raise ConfigError(f"placement: bits {sorted(config.bits)} include lossy widths, "
                              f"which need a quality profile (or set bits = [16])")
        self.cache = cache if cache is not None else DEFAULT_CACHE
        self._templates: dict[tuple[Any, ...], Template] = {}
        self._kl: dict[tuple[int, str], F64] = {}

    # ---------------------------------------------------------------- public API
    def plan(self, blocks: Sequence[BlockInput], tiers: Sequence[TierInput]) -> Plan:
        """The fast plan (Lagrangian relaxation + repair + local search; small puts are
        polished by bounded branch and bound)."""
        t0 = time.perf_counter()
        built = self._build(blocks, tiers)
        try:
            sol = solve_fast(built.problem)
        except NoFeasibleChoice as exc:
            raise self._infeasible(exc, built, blocks) from None
        return self._plan(sol, built, blocks, tiers, t0)

    def plan_exact(self, blocks: Sequence[BlockInput], tiers: Sequence[TierInput], *,
                   max_nodes: int = 5_000_000) -> Plan:
        """The optimal plan by branch and bound (small puts: about 8 blocks)."""
        t0 = time.perf_counter()
        built = self._build(blocks, tiers)
        try:
            sol = solve_exact(built.problem, max_nodes=max_nodes)
        except NoFeasibleChoice as exc:
            raise self._infeasible(exc, built, blocks) from None
        return self._plan(sol, built, blocks, tiers, t0)

    def problem(self, blocks: Sequence[BlockInput], tiers: Sequence[TierInput]) -> Problem:
        """The option table the solvers see (for inspection and tests)."""
        return self._build(blocks, tiers).problem

    def warm(self, blocks: Sequence[BlockInput], tiers: Sequence[TierInput],
             workers: int = 1) -> int:
        """Compute every ``predict`` a plan of these blocks needs, in ``workers`` processes.
        Returns how many were new."""
        models = [resolve_model(t.fault_model) for t in tiers]
        reqs = {(code, data_bytes(b, bits), mi, b.residency_hours)
                for b in {class_key(b): b for b in blocks}.values()
                for bits in self.config.bits for code in self.config.codes
                for mi in range(len(models))}
        return self.cache.warm(((c, n, models[mi], h) for c, n, mi, h in sorted(reqs)),
                               workers)

    # ---------------------------------------------------------------- building
    def _build(self, blocks: Sequence[BlockInput], tiers: Sequence[TierInput]) -> _Built:
        if not blocks:
            raise ConfigError("placement: a plan needs at least one block")
        if not tiers:
            raise ConfigError("placement: a plan needs at least one tier")
        names = tuple(t.name for t in tiers)
        if len(set(names)) != len(names):
            raise ConfigError(f"placement: tier names must be distinct, got {list(names)}")
        models = [resolve_model(t.fault_model) for t in tiers]
        mkeys = [model_key(m) for m in models]
        tkey = tuple((t.name, k, t.read_gbps, t.latency_us) for t, k in zip(tiers, mkeys,
                                                                             strict=True))
        cls_of: dict[tuple[Any, ...], int] = {}
        templates: list[Template] = []
        cls = np.empty(len(blocks), np.int64)
        cfg = self.config
        bits_idx = {b: i for i, b in enumerate(cfg.bits)}
        klb = np.empty((len(blocks), len(cfg.bits)))
        reuse = np.empty(len(blocks))
        for i, b in enumerate(blocks):
            ck = class_key(b)
            c = cls_of.get(ck)
            if c is None:
                key = (ck, tkey)
                t = self._templates.get(key)
                if t is None:
                    t = self._templates[key] = build_template(b, tiers, models, mkeys, cfg,
                                                              self.cache)
                c = cls_of[ck] = len(templates)
                templates.append(t)
                if not t.meets.any():
                    raise self._reliability_error(b, t, names)
            cls[i] = c
            klb[i] = self._kl_row(b.layer, b.kind)
            reuse[i] = b.reuse
        stack = {f: np.stack([getattr(t, f) for t in templates])
                 for f in ("tier", "bits", "record_bytes", "read_us", "cap_cost", "p_due",
                           "kept")}
        rec = recompute_costs(blocks, cfg)
        full = (reuse[:, None] * stack["read_us"][cls] + stack["p_due"][cls] * rec[:, None]
                + stack["cap_cost"][cls])
        # Only the columns some block may take reach the solver (most options are pruned).
        cols = np.flatnonzero(stack["kept"].any(axis=0))
        cost = np.where(stack["kept"][cls][:, cols], full[:, cols], np.inf)
        bcol = np.vectorize(bits_idx.__getitem__, otypes=[np.int64])(stack["bits"][:, cols])
        kl = np.take_along_axis(klb, bcol[cls], axis=1)
        capacity = np.asarray([t.free_bytes for t in tiers], np.float64)
        prob = Problem(cost, kl, stack["record_bytes"][cls][:, cols],
                       stack["tier"][cls][:, cols], cfg.quality_budget_kl, capacity)
        return _Built(prob, cls, templates, full, names, cols)

    def _kl_row(self, layer: int, kind: str) -> F64:
        row = self._kl.get((layer, kind))
        if row is None:
            prof = self.profile
            row = np.asarray([0.0 if b >= 16 or prof is None else prof.kl(layer, kind, b)
                              for b in self.config.bits])
            self._kl[(layer, kind)] = row
        return row

    # ---------------------------------------------------------------- results
    def _plan(self, sol: Solution, built: _Built, blocks: Sequence[BlockInput],
              tiers: Sequence[TierInput], t0: float) -> Plan:
        p, cfg = built.problem, self.config
        n = len(blocks)
        rows = np.arange(n)
        ch = sol.choice
        lim = np.concatenate(([p.kl_budget], p.capacity))
        res, _ = p.resources()
        free = np.argmin(p.cost, axis=1)
        free_use = res[:, rows, free].sum(axis=1)
        over = free_use > lim * (1 + 1e-9) + 1e-12
        names = ("quality_budget_kl", *(f"{t} capacity" for t in built.tiers))
        binding = tuple(nm for nm, o in zip(names, over, strict=True) if o)
        cheapest = np.argmin(built.full_cost, axis=1)
        codes = self.config.codes
        out: list[PlannedBlock] = []
        for i, b in enumerate(blocks):
            t = built.templates[built.cls[i]]
            pj, pf, c0 = int(ch[i]), int(free[i]), int(cheapest[i])
            j, f = int(built.cols[pj]), int(built.cols[pf])
            if pj == pf or p.cost[i, pj] <= p.cost[i, pf]:
                if t.p_due[c0] > cfg.max_p_due:
                    reason = "cheapest meeting max_p_due"
                elif t.p_sdc[c0] > cfg.max_p_sdc:
                    reason = "cheapest meeting max_p_sdc"
                else:
                    reason = "cheapest"
            else:
                parts = []
                if over[0] and p.kl[i, pf] > p.kl[i, pj]:
                    parts.append("KL budget")
                tf = int(t.tier[f])
                if over[1 + tf] and (t.tier[j] != tf or t.record_bytes[j] < t.record_bytes[f]):
                    parts.append(f"{built.tiers[tf]} capacity")
                reason = " + ".join(parts) or "room for other blocks"
            out.append(PlannedBlock(
                b.layer, b.kind, b.chunk, built.tiers[int(t.tier[j])], int(t.bits[j]),
                codes[int(t.code[j])], float(t.p_due[j]), float(t.p_sdc[j]),
                int(t.record_bytes[j]), float(p.kl[i, pj]), float(p.cost[i, pj]), reason))
        used = res[:, rows, ch].sum(axis=1)
        tb = {nm: int(used[1 + k]) for k, nm in enumerate(built.tiers)}
        tfree = {t.name: t.free_bytes for t in tiers}
        exp_due = float(np.stack([t.p_due for t in built.templates])[built.cls,
                                                                     built.cols[ch]].sum())
        lb = sol.cost if sol.method == "exact" else sol.lower_bound
        return Plan(tuple(out), sol.cost, float(used[0]), p.kl_budget, tb, tfree, exp_due,
                    binding, sol.method, float(lb), 1e6 * (time.perf_counter() - t0),
                    {"evaluations": sol.evaluations, "nodes": sol.nodes,
                     "multipliers": [float(x) for x in sol.multipliers]})

    # ---------------------------------------------------------------- errors
    def _reliability_error(self, b: BlockInput, t: Template,
                           names: Sequence[str]) -> InfeasiblePlanError:
        cfg = self.config
        due_ok = t.p_due <= cfg.max_p_due
        if not due_ok.any():
            key, arr, limit = "max_p_due", t.p_due, cfg.max_p_due
        else:
            key, arr, limit = "max_p_sdc", np.where(due_ok, t.p_sdc, np.inf), cfg.max_p_sdc
        j = int(np.argmin(arr))
        what = f"{cfg.codes[int(t.code[j])]} at {int(t.bits[j])} bits on {names[t.tier[j]]}"
        extra = "" if key == "max_p_due" else " among those meeting max_p_due"
        return InfeasiblePlanError(
            f"no option for {b.label} meets {key}={limit:g}: the best{extra} is {what} at "
            f"{arr[j]:.2g}", key)

    def _infeasible(self, exc: NoFeasibleChoice, built: _Built,
                    blocks: Sequence[BlockInput]) -> InfeasiblePlanError:
        p = built.problem
        if exc.violated == [-1]:
            fits = np.isfinite(p.cost) & (p.nbytes <= p.capacity[p.tier])
            i = int(np.flatnonzero(~fits.any(axis=1))[0])
            small = float(np.where(np.isfinite(p.cost[i]), p.nbytes[i], np.inf).min())
            return InfeasiblePlanError(
                f"no option for {blocks[i].label} fits a tier's free capacity: its smallest "
                f"option meeting the reliability targets is {small:.0f} bytes (free: "
                f"{_free(built)})", "capacity")
        if exc.proven and exc.violated == [0]:
            return InfeasiblePlanError(
                f"quality_budget_kl={p.kl_budget:g} cannot be met: the least total KL of the "
                f"options meeting the reliability targets and fitting the tiers is "
                f"{exc.usage[0]:.4g}", "quality_budget_kl")
        if exc.proven and 0 not in exc.violated:
            return InfeasiblePlanError(
                f"tier capacity cannot hold the put: its smallest options need "
                f"{exc.usage[1]:.0f} bytes, the tiers have {p.capacity.sum():.0f} free "
                f"({_free(built)})", "capacity")
        names = [f"quality_budget_kl={p.kl_budget:g}" if k == 0 else
                 f"{built.tiers[k - 1]} capacity ({p.capacity[k - 1]:.0f} bytes free)"
                 for k in exc.violated]
        how = "no plan meets" if exc.proven else "the planner found no plan meeting"
        return InfeasiblePlanError(f"{how} {' and '.join(names)} together", "combined")


def _free(built: _Built) -> str:
    return ", ".join(f"{n} {c:.0f} B" for n, c in zip(built.tiers, built.problem.capacity,
                                                       strict=True))


def plan(blocks: Sequence[BlockInput], tiers: Sequence[TierInput],
         config: PlacementConfig | Mapping[str, Any] | None = None,
         profile: ProfileLike = None) -> Plan:
    """One-shot :meth:`Planner.plan` (keep a :class:`Planner` to reuse its caches)."""
    return Planner(config, profile).plan(blocks, tiers)


def plan_exact(blocks: Sequence[BlockInput], tiers: Sequence[TierInput],
               config: PlacementConfig | Mapping[str, Any] | None = None,
               profile: ProfileLike = None, *, max_nodes: int = 5_000_000) -> Plan:
    """One-shot :meth:`Planner.plan_exact`."""
    return Planner(config, profile).plan_exact(blocks, tiers, max_nodes=max_nodes)
