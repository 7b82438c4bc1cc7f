"""Placement inside the engine: each block of a put gets the bits and code a plan chose.

The engine's decision site (:mod:`rkv.store.decisions`) still decides which tier a chunk lives in
(admission, capacity, eviction, demotion). With a placement config, what a block looks like in
that tier is planned: for the tier a put's chunks are offered, the planner chooses each block's
bit-width and code under the targets (P(SDC), P(DUE) per block, the put's KL budget), so
``chunk_size(tier)`` and the records written agree with the plan. A demotion re-plans the
block's code for the destination tier and keeps its bits; with ``lossy_demotion`` it may
take fewer bits within the quality budget (:mod:`rkv.store.demotion`).

Expected residency and reuse: with ``[placement] estimate = true`` (the default) each block
is planned with what :class:`policies.estimate.ReuseEstimator` has learned for the tier it is
planned into and its chunk's depth bucket (fed by :mod:`rkv.store.decisions` with the events it
tells the policies), snapped to a coarse grid (:func:`snap`) so the planner's option tables
stay cached; until a (tier, bucket) has seen enough departures, and with ``estimate =
false``, the config's ``residency_hours`` and ``reuse`` apply.

Profiles: ``PlacementConfig.profile`` (a path, or a shipped profile name); empty means the
shipped profile whose fingerprint matches the model, if any; without a profile only 16 bits
are planned (lossless), never a silent guess at quality.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from policies.estimate import ReuseEstimator
from rkv.codec.pipeline import Pipeline
from rkv.errors import ConfigError
from rkv.placement.config import BlockInput, PlacementConfig, TierInput
from rkv.placement.options import LRU
from rkv.placement.planner import Planner
from rkv.profiles import QualityProfile
from rkv.profiles import load_profile as named_profile
from rkv.quant.widths import Width, as_width
from rkv.quant.widths import quant_spec as quant_spec  # (re-exported: callers import here)

if TYPE_CHECKING:
    from rkv.format.model import ModelSpec
    from rkv.store.config import EngineConfig, TierConfig

#: Free capacity the planner sees: the decision site makes room (evicts or demotes) for
#: what the plan needs, so a tier is never "full" to the planner.
_UNBOUNDED = 1 << 62
#: What one put may set over the store's [placement] table.
PER_PUT = ("max_p_sdc", "max_p_due", "quality_budget_kl", "recompute_us_per_token",
           "recompute_us_per_chunk", "bits", "codes", "capacity_cost")
#: Residency is part of the planner's option-table key (and of every ``predict`` it asks,
#: seconds each for some fault models): it is snapped to powers of 2 hours within
#: ``_HOURS_RANGE`` and leaves its grid point only when ``_HYSTERESIS`` steps (log2) away,
#: so an estimate sitting on a boundary does not flip between two tables. Reuse only enters
#: the per-put costs (cheap), so it keeps 2 significant digits (0 below ``_REUSE_ZERO``) and
#: changes only when it moves more than ``_REUSE_SLACK`` (relative).
_HYSTERESIS = 0.75
_HOURS_RANGE = (2.0 ** -12, 2.0 ** 17)          # about 1 s to 15 years
_REUSE_ZERO, _REUSE_SLACK = 0.01, 0.05


def snap_hours(hours: float, last: float | None) -> float:
    """``hours`` as a power of 2 (clamped), ``last`` kept while within the hysteresis."""
    lo, hi = _HOURS_RANGE
    x = math.log2(min(max(hours, lo), hi))
    if last is not None and abs(x - math.log2(last)) <= _HYSTERESIS:
        return last
    return float(2.0 ** round(x))


def snap_reuse(reuse: float, last: float | None) -> float:
    """``reuse`` to 2 significant digits, ``last`` kept while within ``_REUSE_SLACK``."""
    if reuse < _REUSE_ZERO:
        return 0.0
    if last and abs(reuse / last - 1.0) <= _REUSE_SLACK:
        return last
    return float(f"{reuse:.2g}")


def load_profile(cfg: PlacementConfig, spec: ModelSpec | None) -> QualityProfile | None:
    """The quality profile a put of ``spec`` is planned with (None: lossless only; without
    ``spec`` only a named profile is loaded)."""
    if cfg.profile:
        from pathlib import Path

        if Path(cfg.profile).exists():
            return QualityProfile.load(cfg.profile)
        return _shipped(cfg.profile)
    return None if spec is None else _shipped(spec.fingerprint().hex(), quiet=True)


def check_plannable(config: EngineConfig) -> None:
    """Raise :class:`ConfigError` for what planning with ``config`` would refuse later
    (``rkv init`` runs it before it makes a store, so a store is never created with a config
    that ``rkv plan`` rejects): every tier's fault model, the ``[placement]`` table and the
    quality profile it names."""
    import faultmodels

    for t in config.tiers:
        try:
            faultmodels.get_model(t.fault_model)
        except (ValueError, TypeError, KeyError) as exc:   # FaultModelError is a ValueError
            raise ConfigError(f"tier {t.name}: fault_model {t.fault_model!r}: {exc}"
                              ) from None
    if config.placement_config is not None:
        load_profile(config.placement_config, None)


def _shipped(name: str, quiet: bool = False) -> QualityProfile | None:
    """The profile :func:`rkv.profiles.load_profile` finds for ``name`` (a shipped profile's
    file stem, model or fingerprint, or a ``.json`` path); none: None when ``quiet``, else a
    ConfigError."""
    try:
        return named_profile(name)
    except ConfigError:
        if quiet:
            return None
        raise ConfigError(f"placement: no quality profile {name!r} (a path, or a shipped "
                          "profile name)") from None


class EnginePlacement:
    """Plans for one engine: its tiers and placement config (one planner, caches shared).

    ``timing``: what planning has cost this engine, for benchmarks and ``stats``: ``plans``
    (puts planned), ``plan_us`` (their total time, from the put's blocks to its pipelines),
    ``last_plan_us``, and ``solve_us`` (the planner's own time, :attr:`Plan.plan_us`)."""

    def __init__(self, cfg: PlacementConfig, tiers: tuple[TierConfig, ...]) -> None:
        self.cfg = cfg
        self.tiers = {t.name: t for t in tiers}
        self._planners: dict[bytes | tuple[bytes, str], Planner] = {}
        self._fixed: dict[tuple[bytes, Width], Planner] = {}
        self._moves: dict[tuple[Any, ...], Pipeline] = {}
        self._blocks = LRU(64)
        self._tier_inputs: dict[str, TierInput] = {}
        self._pipes: dict[tuple[Width, str], Pipeline] = {}
        self.timing: dict[str, float] = {"plans": 0, "plan_us": 0.0, "last_plan_us": 0.0,
                                         "solve_us": 0.0}
        #: Learns residency and reuse per (tier, depth bucket) (None: the config's values).
        self.estimator = ReuseEstimator() if cfg.estimate else None
        self._used: dict[tuple[str, int], tuple[float, float]] = {}

    @classmethod
    def for_engine(cls, config: EngineConfig) -> EnginePlacement | None:
        """The placement of an engine config (None: its ``placement`` table is empty)."""
        if config.placement_config is None:
            return None
        return cls(config.placement_config, config.tiers)

    def planner(self, spec: ModelSpec, over: PlacementConfig | None = None) -> Planner:
        """The planner of ``spec``'s puts (``over``: a put's own targets, see
        :meth:`override`); one per model and set of targets, each keeping its tables."""
        fp = spec.fingerprint()
        key = fp if over is None else (fp, json.dumps(over.to_dict(), sort_keys=True))
        p = self._planners.get(key)
        if p is None:
            base = self._planners.get(fp)
            profile = base.profile if base is not None else load_profile(self.cfg, spec)
            cfg = over or self.cfg
            if profile is None:
                cfg = replace(cfg, bits=(16,), kv_bits=())
            p = self._planners[key] = Planner(cfg, profile)
        return p

    def override(self, over: Mapping[str, Any]) -> PlacementConfig:
        """The store's targets with a put's own (``Engine.put(..., placement={...})``):
        only what a single put may change; residency, reuse, lossy demotion, the profile and
        the estimator stay the store's. Raises ConfigError naming a bad key or value."""
        if not isinstance(over, Mapping):
            raise ConfigError(f"placement: a put's targets must be a table, got "
                              f"{type(over).__name__}")
        fixed = sorted(set(over) - set(PER_PUT))
        if fixed:
            raise ConfigError(f"placement: {fixed[0]!r} cannot be set per put (per put: "
                              f"{', '.join(PER_PUT)})")
        base = self.cfg.to_dict()
        if {"recompute_us_per_chunk", "recompute_us_per_token"} & set(over):
            base.pop("recompute_us_per_chunk", None)
            base.pop("recompute_us_per_token", None)
        return PlacementConfig.from_dict({**base, **over})

    def tier_input(self, name: str) -> TierInput:
        hit = self._tier_inputs.get(name)
        if hit is None:
            t = self.tiers[name]
            hit = self._tier_inputs[name] = TierInput(name, t.fault_model, _UNBOUNDED,
                                                      t.read_gbps, t.latency_us)
        return hit

    def expect(self, tier: str | None, pos: int) -> tuple[float, float]:
        """(residency hours, reuse) a block at chunk ``pos`` is planned with in ``tier``:
        the estimate for its (tier, depth bucket), snapped, once trusted; else the
        config's."""
        est = self.estimator
        if est is None or tier is None:
            return self.cfg.residency_hours, self.cfg.reuse
        cell = (tier, est.bucket(pos))
        got = est.estimate(tier, pos)
        if got is None:
            return self.cfg.residency_hours, self.cfg.reuse
        last = self._used.get(cell)
        hours = snap_hours(got.residency / 3600.0, last[0] if last else None)  # clamped
        used = self._used[cell] = (hours, snap_reuse(got.reuse, last[1] if last else None))
        return used

    def estimates(self) -> dict[str, Any]:
        """What the planner uses, for ``stats()``: per tier and depth bucket the estimator's
        ``reuse`` and ``residency_s`` (None: not trusted yet, the config's values apply),
        ``weight`` (decayed departures) and ``planned`` ([hours, reuse] of the last plan)."""
        cfg = self.cfg
        out: dict[str, Any] = {"on": self.estimator is not None,
                               "config": [cfg.residency_hours, cfg.reuse]}
        est = self.estimator
        if est is None:
            return out
        labels = {est.label(i): i for i in range(len(est.buckets))}
        for tier, rows in est.snapshot().items():
            out[tier] = {
                label: {"reuse": r["reuse"], "residency_s": r["residency"],
                        "weight": r["weight"],
                        "planned": list(self._used.get((tier, labels[label]),
                                                       (cfg.residency_hours, cfg.reuse)))}
                for label, r in rows.items()}
        return out

    def blocks(self, spec: ModelSpec, tokens: list[int], n_chunks: int,
               tier: str | None = None) -> list[BlockInput]:
        """One block per (chunk, layer), K and V together as the record stores them, with
        the residency and reuse expected in ``tier`` (None: the config's) (the same list for
        a put of the same model, chunk lengths and expectations)."""
        per: dict[int, tuple[float, float]] = {}
        bucket = self.estimator.bucket if self.estimator is not None else (lambda _: 0)
        for i in range(len(tokens)):
            b = bucket(i)
            if b not in per:
                per[b] = self.expect(tier, i)
        key = (spec.fingerprint(), tuple(tokens), n_chunks, tuple(sorted(per.items())))
        hit: list[BlockInput] | None = self._blocks.lookup(key)
        if hit is None:
            hit = []
            for i, n in enumerate(tokens):
                hours, reuse = per[bucket(i)]
                hit += [BlockInput(layer, "kv", i, n, hours, reuse, spec.n_kv_heads,
                                   spec.head_dim, spec.dtype, n_chunks)
                        for layer in range(spec.n_layers)]
            self._blocks.store(key, hit)
        return hit

    def put_plan(self, spec: ModelSpec, tokens: list[int], n_chunks: int,
                 tier: str, over: PlacementConfig | None = None) -> list[list[Pipeline]]:
        """Per chunk, per layer, the pipeline planned for ``tier`` (raises
        :class:`~rkv.placement.InfeasiblePlanError` when the targets cannot be met there);
        ``over``: the put's own targets."""
        planned = self._planned(spec, tokens, n_chunks, [tier], over)
        return [[p for _, p in chunk] for chunk in planned]

    def tiered_plan(self, spec: ModelSpec, tokens: list[int], n_chunks: int,
                    tiers: Sequence[str], over: PlacementConfig | None = None
                    ) -> list[list[tuple[str, Pipeline]]]:
        """Per chunk, per layer, the tier (one of ``tiers``) and pipeline the planner chose
        (``place_tiers``): the layers of one chunk may go to different tiers. Residency and
        reuse are the config's (the estimates are per tier, and the tier is what is being
        chosen)."""
        return self._planned(spec, tokens, n_chunks, list(tiers), over)

    def _planned(self, spec: ModelSpec, tokens: list[int], n_chunks: int, tiers: list[str],
                 over: PlacementConfig | None) -> list[list[tuple[str, Pipeline]]]:
        t0 = time.perf_counter()
        home = tiers[0] if len(tiers) == 1 else None
        plan = self.planner(spec, over).plan(self.blocks(spec, tokens, n_chunks, home),
                                             [self.tier_input(t) for t in tiers])
        pipes = [(t, self._pipe(w, c)) for t, w, c in zip(
            plan.block_tier, plan.block_widths, plan.block_code, strict=True)]
        layers = spec.n_layers
        out = [pipes[i * layers:(i + 1) * layers] for i in range(len(tokens))]
        took = 1e6 * (time.perf_counter() - t0)
        timing = self.timing
        timing["plans"] += 1
        timing["plan_us"] += took
        timing["last_plan_us"] = took
        timing["solve_us"] += plan.plan_us
        if "stall_us" in plan.extra:
            timing["last_stall_us"] = float(plan.extra["stall_us"])
        return out

    def _pipe(self, width: Width, code: str) -> Pipeline:
        hit = self._pipes.get((width, code))
        if hit is None:
            hit = self._pipes[width, code] = Pipeline.parse(quant_spec(width), code)
        return hit

    def demotion_code(self, spec: ModelSpec, layer: int, tokens: int, pos: int,
                      bits: int | Width, tier: str) -> Pipeline:
        """The pipeline for one block moving to ``tier``: its bits (an int for K and V, or
        (key bits, value bits)) kept, the code re-planned for the new tier's fault model
        (fewer bits: :mod:`rkv.store.demotion`)."""
        width = as_width(bits)
        # With the bits fixed the layer's quality does not enter: one plan per shape,
        # position and tier serves every layer of every chunk that moves there.
        fp = spec.fingerprint()
        hours, reuse = self.expect(tier, pos)
        move = (fp, tokens, pos, width, tier, hours, reuse)
        hit = self._moves.get(move)
        if hit is not None:
            return hit
        planner = self.planner(spec)
        one = self._fixed.get((fp, width))
        if one is None:
            # The bits are kept, so is the KL the block already costs: a budget lowered
            # since it was stored must not turn its re-plan into a fallback.
            fixed = planner.config.fixed(width)
            one = self._fixed[fp, width] = Planner(fixed, planner.profile, planner.cache)
        block = BlockInput(layer, "kv", pos, tokens, hours, reuse, spec.n_kv_heads,
                           spec.head_dim, spec.dtype, pos + 1)
        b = one.plan([block], [self.tier_input(tier)]).blocks[0]
        hit = self._moves[move] = Pipeline.parse(quant_spec(b.width), b.code)
        return hit
