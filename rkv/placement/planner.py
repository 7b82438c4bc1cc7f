"""The placement planner: each block's tier, bit-width and code for a whole put.

Options per block are every tier x width x code (:mod:`rkv.placement.options`; a width is
(key bits, value bits): equal from ``bits``, different from ``kv_bits`` for blocks holding K
and V, whose KL is the profile's K entry at the key bits plus its V entry at the value
bits). An option
that misses ``max_p_due`` or ``max_p_sdc`` is not offered; the rest cost, in microseconds,

    reuse x (latency + record bytes / bandwidth)       reading it back, each expected read
  + P(DUE) x recompute(this chunk .. last chunk)       a lost block stops the read there
  + capacity_cost[tier] x record bytes                 what holding the bytes costs

and the choice minimises the sum subject to total KL <= ``quality_budget_kl`` and bytes per
tier <= its free capacity (:mod:`rkv.placement.solver`). Infeasible targets raise
:class:`InfeasiblePlanError` naming the constraint.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from operator import attrgetter
from typing import Any

import numpy as np
import numpy.typing as npt

from rkv.errors import ConfigError
from rkv.placement.config import BlockInput, PlacementConfig, TierInput
from rkv.placement.errors import InfeasiblePlanError
from rkv.placement.options import (
    DEFAULT_CACHE,
    LRU,
    MODELS,
    ReliabilityCache,
    Table,
    Template,
    block_widths,
    build_table,
    build_template,
    class_key,
    data_bytes,
    recompute_costs,
)
from rkv.placement.plan import Plan, PlannedBlock
from rkv.placement.solver import NoFeasibleChoice, Problem, Solution, solve_exact, solve_fast
from rkv.placement.streamed import search as streamed_search
from rkv.profiles import QualityProfile, as_profile
from rkv.quant.widths import width_text

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
ProfileLike = QualityProfile | Mapping[Any, Any] | Callable[[int, str, int], float] | None
_CHUNK, _N_CHUNKS, _REUSE = attrgetter("chunk"), attrgetter("n_chunks"), attrgetter("reuse")


#: What a block's row of the option table depends on (with the tiers, config and profile).
_STATIC = attrgetter("tokens", "kind", "kv_heads", "head_dim", "dtype", "residency_hours",
                     "layer")
_TABLES = 32     # put shapes kept per planner
_RECHECK = 0.01  # a warm-started plan further than this from its bound is checked cold


@dataclass(frozen=True)
class _Built:
    problem: Problem
    table: Table
    tiers: tuple[str, ...]
    reuse: F64
    recompute: F64


class Planner:
    """Plans puts under one :class:`PlacementConfig` and quality profile.

    Caches, all keyed by every input they depend on: ``predict`` answers (``cache``; default:
    a process-wide one); fault models per spec; per block class and tier set, the option
    template; per put shape (every block's tokens, kind, KV shape, dtype, residency and layer,
    and every tier's name, fault-model parameters, bandwidth and latency), the option table
    (:class:`~rkv.placement.options.Table`), so a put of a shape seen before only applies its
    reuse, chunk positions and free capacity, vectorised. With ``warm_start`` the search for
    the multipliers begins where the last plan of the same shape ended."""

    def __init__(self, config: PlacementConfig | Mapping[str, Any] | None = None,
                 profile: ProfileLike = None, cache: ReliabilityCache | None = None, *,
                 warm_start: bool = True) -> None:
        if config is None:
            config = PlacementConfig()
        elif not isinstance(config, PlacementConfig):
            config = PlacementConfig.from_dict(config)
        self.config = config
        self.profile = as_profile(profile)
        if self.profile is None and any(w[0] < 16 for w in config.widths):
            raise ConfigError(f"placement: bits {sorted(config.bits)} (kv_bits "
                              f"{[list(w) for w in config.split_widths]}) include lossy "
                              f"widths, which need a quality profile (or set bits = [16], "
                              f"kv_bits = [])")
        self.cache = cache if cache is not None else DEFAULT_CACHE
        self.warm_start = warm_start
        self._models = MODELS
        self._templates: dict[tuple[Any, ...], Template] = {}
        self._kl: dict[tuple[int, str], F64] = {}
        self._tables = LRU(_TABLES)
        self._start: F64 | None = None

    # ---------------------------------------------------------------- public API
    def plan(self, blocks: Sequence[BlockInput], tiers: Sequence[TierInput]) -> Plan:
        """The fast plan (Lagrangian relaxation + repair + local search; small puts are
        polished by bounded branch and bound)."""
        t0 = time.perf_counter()
        built = self._build(blocks, tiers)
        if self.config.layer_compute_us is not None:
            return self._streamed(built, blocks, tiers, t0)
        table = built.table
        warm = self.warm_start
        # A new shape starts from the last settled multipliers of any shape (the same
        # model and tiers price KL and bytes alike); its own plans take over after.
        start = table.start if table.start is not None else self._start
        try:
            sol = solve_fast(built.problem, start=start if warm else None,
                             hint=table.hint if warm else None)
            if warm and start is not None and not table.checked and _gap(sol) > _RECHECK:
                # The search is path-dependent: the first warm-started plan of a shape that
                # lands far from its bound is checked against a cold search, once per shape
                # (its plans after are never worse than the better of the two).
                table.checked = True
                cold = solve_fast(built.problem)
                lb = max(sol.lower_bound, cold.lower_bound)
                sol = cold if cold.cost < sol.cost else sol
                sol.lower_bound = lb
        except NoFeasibleChoice as exc:
            raise self._infeasible(exc, built, blocks) from None
        # A search that did not settle (multipliers still trading off after its rounds)
        # is no place to start the next one from; its choice still is a candidate.
        table.start = sol.multipliers if sol.converged and sol.multipliers.any() else None
        if table.start is not None:
            self._start = table.start
        table.hint = sol.choice
        return self._plan(sol, built, blocks, tiers, t0)

    def _streamed(self, built: _Built, blocks: Sequence[BlockInput],
                  tiers: Sequence[TierInput], t0: float) -> Plan:
        """The plan whose read cost is the stall under layer streaming
        (:func:`rkv.placement.streamed.search`)."""
        try:
            sol, prob, stall = streamed_search(
                built.table, built.problem, built.reuse, built.recompute, blocks,
                float(self.config.layer_compute_us or 0.0), self.config.parallel_reads)
        except NoFeasibleChoice as exc:
            raise self._infeasible(exc, built, blocks) from None
        plan = self._plan(sol, replace(built, problem=prob), blocks, tiers, t0)
        plan.extra["stall_us"] = stall
        return plan

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

    def clear(self, templates: bool = True) -> None:
        """Forget the option tables and warm starts, and with ``templates`` the per-class
        templates too (``predict`` answers are kept)."""
        self._tables.clear()
        self._start = None
        if templates:
            self._templates.clear()

    def warm(self, blocks: Sequence[BlockInput], tiers: Sequence[TierInput],
             workers: int = 1, progress: Callable[[int, int], None] | None = None) -> int:
        """Compute every ``predict`` a plan of these blocks needs, in ``workers`` processes
        (``progress(done, total)`` after each). Returns how many were new."""
        models = [self._models.get(t.fault_model)[0] for t in tiers]
        reqs = {(code, data_bytes(b, w), mi, b.residency_hours)
                for b in {class_key(b): b for b in blocks}.values()
                for _, w in block_widths(b, self.config) for code in self.config.codes
                for mi in range(len(models))}
        return self.cache.warm(((c, n, models[mi], h) for c, n, mi, h in sorted(reqs)),
                               workers, progress)

    # ---------------------------------------------------------------- building
    def _build(self, blocks: Sequence[BlockInput], tiers: Sequence[TierInput]) -> _Built:
        if not blocks:
            raise ConfigError("placement: a plan needs at least one block")
        if not tiers:
            raise ConfigError("placement: a plan needs at least one tier")
        names = tuple(t.name for t in tiers)
        if len(set(names)) != len(names):
            raise ConfigError(f"placement: tier names must be distinct, got {list(names)}")
        resolved = [self._models.get(t.fault_model) for t in tiers]
        tkey = tuple((t.name, k, t.read_gbps, t.latency_us)
                     for t, (_, k) in zip(tiers, resolved, strict=True))
        statics = tuple(map(_STATIC, blocks))
        key = (statics, tkey)
        table = self._tables.lookup(key)
        if table is None:
            table = self._table(blocks, statics, tiers, resolved, tkey)
            self._tables.store(key, table)
        n = len(blocks)
        chunk = np.fromiter(map(_CHUNK, blocks), np.int64, n)
        n_chunks = np.fromiter((-1 if c is None else c for c in map(_N_CHUNKS, blocks)),
                               np.int64, n)
        reuse = np.fromiter(map(_REUSE, blocks), np.float64, n)
        capacity = np.asarray([t.free_bytes for t in tiers], np.float64)
        # Per put, only these change; when none did, the last put's problem (and the
        # solver's view of it) serves again.
        dyn = (chunk.tobytes(), n_chunks.tobytes(), reuse.tobytes(), capacity.tobytes())
        if table.last is not None and table.last[0] == dyn:
            _, prob, rec = table.last
        else:
            rec = recompute_costs(chunk, n_chunks, table.tokens, self.config)
            prob = Problem(table.cost(reuse, rec), table.kl, table.nbytes, table.tier,
                           self.config.quality_budget_kl, capacity)
            table.last = (dyn, prob, rec)
        return _Built(prob, table, names, reuse, rec)

    def _table(self, blocks: Sequence[BlockInput], statics: tuple[tuple[Any, ...], ...],
               tiers: Sequence[TierInput], resolved: Sequence[tuple[Any, str]],
               tkey: tuple[Any, ...]) -> Table:
        """A new put shape's table (templates and KL rows come from their own caches)."""
        cfg = self.config
        classes: dict[tuple[Any, ...], int] = {}
        cls = np.fromiter((classes.setdefault(s[:6], len(classes)) for s in statics),
                          np.int64, len(statics))
        kinds: dict[tuple[int, str], int] = {}
        kl_idx = np.fromiter((kinds.setdefault((s[6], s[1]), len(kinds)) for s in statics),
                             np.int64, len(statics))
        first = np.unique(cls, return_index=True)[1]
        names = [t.name for t in tiers]
        models = [m for m, _ in resolved]
        mkeys = [k for _, k in resolved]
        templates = []
        for ck, i in zip(classes, first.tolist(), strict=True):
            t = self._templates.get((ck, tkey))
            if t is None:
                t = self._templates[ck, tkey] = build_template(blocks[i], tiers, models,
                                                               mkeys, cfg, self.cache)
            if not t.meets.any():
                raise self._reliability_error(blocks[i], t, names)
            templates.append(t)
        kl_rows = np.stack([self._kl_row(layer, kind) for layer, kind in kinds])
        prof = self.profile
        deg_kl = np.asarray([_degraded_kl(prof, layer, kind) for layer, kind in kinds],
                            np.float64)
        deg_kl_q = np.asarray([_degraded_kl_quantized(prof, layer, kind)
                               for layer, kind in kinds], np.float64)
        tokens = np.fromiter((s[0] for s in statics), np.int64, len(statics))
        return build_table(templates, cls, kl_rows, kl_idx, tokens, deg_kl, deg_kl_q)

    def _kl_row(self, layer: int, kind: str) -> F64:
        """KL per width of the config (a ``"kv"`` block: K at the key bits plus V at the
        value bits; a ``"k"`` or ``"v"`` block only takes equal widths)."""
        row = self._kl.get((layer, kind))
        if row is None:
            prof = self.profile

            def kl(kind: str, bits: int) -> float:
                return 0.0 if bits >= 16 or prof is None else prof.kl(layer, kind, bits)

            row = np.asarray([kl("k", kb) + kl("v", vb) if kind == "kv" else
                              kl(kind, kb) if kb == vb else np.inf
                              for kb, vb in self.config.widths])
            self._kl[(layer, kind)] = row
        return row

    # ---------------------------------------------------------------- results
    def _plan(self, sol: Solution, built: _Built, blocks: Sequence[BlockInput],
              tiers: Sequence[TierInput], t0: float) -> Plan:
        p, table = built.problem, built.table
        ch = sol.choice
        used = p.usage(ch)
        free = np.argmin(p.cost, axis=1)
        over = _over(p, p.usage(free))
        names = ("quality_budget_kl", *(f"{t} capacity" for t in built.tiers))
        binding = tuple(nm for nm, o in zip(names, over, strict=True) if o)
        opt = table.cols[ch]                                   # template option per block
        stack = {f: np.stack([getattr(t, f) for t in table.templates])[table.cls, opt]
                 for f in ("tier", "bits", "vbits", "code", "p_due")}
        codes = np.asarray(self.config.codes, dtype=object)
        tb = {nm: int(used[1 + k]) for k, nm in enumerate(built.tiers)}
        tfree = {t.name: t.free_bytes for t in tiers}
        lb = sol.cost if sol.method == "exact" else sol.lower_bound
        return Plan(partial(self._blocks, sol, built, blocks, over), sol.cost, float(used[0]),
                    p.kl_budget, tb, tfree, float(stack["p_due"].sum()), binding, sol.method,
                    float(lb), 1e6 * (time.perf_counter() - t0),
                    {"evaluations": sol.evaluations, "nodes": sol.nodes,
                     "multipliers": [float(x) for x in sol.multipliers]},
                    tuple(np.asarray(built.tiers, dtype=object)[stack["tier"]].tolist()),
                    tuple(stack["bits"].tolist()), tuple(codes[stack["code"]].tolist()),
                    tuple(stack["vbits"].tolist()))

    def _blocks(self, sol: Solution, built: _Built, blocks: Sequence[BlockInput],
                over: npt.NDArray[np.bool_]) -> tuple[PlannedBlock, ...]:
        """Per block what it got and why (computed when a plan's ``blocks`` are asked for)."""
        p, table, cfg = built.problem, built.table, self.config
        ch = sol.choice
        free = np.argmin(p.cost, axis=1)
        cheapest = np.argmin(table.full_cost(built.reuse, built.recompute), axis=1)
        out: list[PlannedBlock] = []
        for i, b in enumerate(blocks):
            t = table.templates[table.cls[i]]
            pj, pf, c0 = int(ch[i]), int(free[i]), int(cheapest[i])
            j, f = int(table.cols[pj]), int(table.cols[pf])
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
            assert t.vbits is not None
            out.append(PlannedBlock(
                b.layer, b.kind, b.chunk, built.tiers[int(t.tier[j])], int(t.bits[j]),
                cfg.codes[int(t.code[j])], float(t.p_due[j]), float(t.p_sdc[j]),
                int(t.record_bytes[j]), float(p.kl[i, pj]), float(p.cost[i, pj]), reason,
                int(t.vbits[j])))
        return tuple(out)

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
        assert t.vbits is not None
        width = width_text((int(t.bits[j]), int(t.vbits[j])))
        what = f"{cfg.codes[int(t.code[j])]} at {width} bits on {names[t.tier[j]]}"
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


def _gap(sol: Solution) -> float:
    lb = sol.lower_bound
    return sol.cost / lb - 1 if lb > 0 else (0.0 if sol.cost <= 0 else math.inf)


def _over(p: Problem, use: F64) -> npt.NDArray[np.bool_]:
    lim = np.concatenate(([p.kl_budget], p.capacity))
    return np.asarray(use > lim * (1 + 1e-9) + 1e-12)


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


def _degraded_kl(prof: QualityProfile | None, layer: int, kind: str) -> float:
    """A degraded read's KL for the block; inf (layouts that can degrade are not offered)
    without a profile entry to bound it."""
    if prof is None:
        return math.inf
    try:
        return prof.degraded_kl(layer, kind)
    except ConfigError:
        return math.inf


def degraded_factor(bits: int) -> float:
    """How many times the error variance of ``bits``-bit KIVI a degraded quantized read
    has: a damaged value lands anywhere in its group's range ``r`` (a uniform value against
    the true one, ``r^2 / 6``) where quantization leaves ``s^2 / 12`` with
    ``s = r / (2^bits - 1)``: ``2 (2^bits - 1)^2`` (18 at 2 bits, 450 at 4, 130050 at 8)."""
    return 2.0 * ((1 << bits) - 1) ** 2


def _degraded_kl_quantized(prof: QualityProfile | None, layer: int, kind: str) -> float:
    """A degraded quantized read's KL for the block (quantized planes whose codes failed):
    as if every value were damaged, the block's KL at the fewest bits its profile has
    times :func:`degraded_factor` of those bits (KL taken as proportional to the error
    variance); inf without a profile entry (such layouts are not offered)."""
    if prof is None:
        return math.inf
    for bits in (2, 4, 8):
        try:
            return degraded_factor(bits) * prof.kl(layer, kind, bits)
        except ConfigError:
            continue
    return math.inf
