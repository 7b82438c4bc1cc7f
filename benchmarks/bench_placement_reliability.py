"""Parts (b) and (c) of ``bench_placement_quality.py``: parity at a reliability target, and a
fault-injection campaign on a store written as planned. Run through that script; both take
one window's real SmolLM2-135M KV (weights 4-bit Q4_1), cast to fp16."""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
from bench_placement_quality import BITS, CHUNK, PREFIX, PROFILE, engine_config, spec, stored

from rkv import Engine, TierConfig
from rkv.eval.faults.planned import BlockPrediction, compare, predicted_totals, run_planned_campaign
from rkv.placement import DEFAULT_CODES
from rkv.placement.budget import uniform_codes, weakest_uniform
from rkv.placement.options import data_bytes, record_bytes, resolve_model
from rkv.store.plans import EnginePlacement
from rkv.tiers.faulty import FaultyTier

HOURS = 24.0
TARGET = 1e-9


def _warm(cfg: Any, sp: Any, workers: int) -> tuple[Any, list[Any], Any]:
    """The engine's planner for ``cfg`` (an EngineConfig), its blocks for the sample put
    and its tier input, with every ``predict`` the options need computed."""
    ep = EnginePlacement.for_engine(cfg)
    assert ep is not None
    planner = ep.planner(sp)
    blocks = ep.blocks(sp, [CHUNK] * (PREFIX // CHUNK), PREFIX // CHUNK)
    tier = ep.tier_input(cfg.tiers[0].name)
    t0 = time.perf_counter()
    n = planner.warm(blocks, [tier], workers=workers)
    print(f"predict: {n} new in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return planner, blocks, tier


def _store(root: Path, name: str, cfg: Any, sample: tuple[list[int], np.ndarray]
           ) -> list[dict[str, Any]]:
    sp = spec()
    with Engine.open(root / name, cfg) as e:
        e.put(sample[0], sample[1], model=sp)
        got = e.get(sample[0], model=sp)
        assert got.ok
        return stored(e, sp, sample[0])


# -- (b) ------------------------------------------------------------------------------------
def part_b(sample: tuple[list[int], np.ndarray], kl_budget: float | None,
           args: argparse.Namespace, root: Path, kl_budget44: float | None = None
           ) -> dict[str, Any]:
    sp = spec()
    nvme = TierConfig("nvme", medium="disk", path=str(root / "nvme-b"), capacity_bytes=1 << 34,
                      fault_model="nvme-tlc")
    base = {"max_p_due": TARGET, "bits": list(BITS), "codes": list(DEFAULT_CODES),
            "residency_hours": HOURS, "profile": PROFILE,
            "quality_budget_kl": 1.0 if kl_budget is None else kl_budget,
            "capacity_cost": {"nvme": 1e9}}
    planner, blocks, _ = _warm(engine_config(nvme, base), sp, args.workers)
    model = resolve_model("nvme-tlc")
    cases = {"16 bits": {**base, "bits": [16]}}
    if kl_budget is not None:
        cases["planned bits (40 % KL budget)"] = base
    if kl_budget44 is not None:
        cases["planned bits (uniform 4-bit bytes KL budget)"] = {
            **base, "quality_budget_kl": kl_budget44}
    out: dict[str, Any] = {"target_p_due": TARGET, "hours": HOURS,
                           "fault_model": "nvme-tlc (preset: 3000 P/E cycles, 30 C)",
                           "pe_cycles": model.params().get("pe_cycles"), "cases": {}}
    summary = {}
    for i, (name, pl) in enumerate(cases.items()):
        recs = _store(root, f"b{i}", engine_config(nvme, pl), sample)
        pairs = [(blocks[r["chunk"] * sp.n_layers + r["layer"]], r["bits"]) for r in recs]
        planned_parity = sum(r["bytes"] - record_bytes(b, bits, "none")
                             for r, (b, bits) in zip(recs, pairs, strict=True))
        sized = all(r["bytes"] == record_bytes(b, bits, _short(r["code"]))
                    for r, (b, bits) in zip(recs, pairs, strict=True))
        p_due = [planner.cache.get(_short(r["code"]), data_bytes(b, bits), model, HOURS)[0]
                 for r, (b, bits) in zip(recs, pairs, strict=True)]
        cands = uniform_codes(pairs, DEFAULT_CODES, model, TARGET, cache=planner.cache)
        weak = weakest_uniform(cands)
        row: dict[str, Any] = {
            "planned_codes": dict(Counter(f"{_short(r['code'])} @ {r['bits']} bits"
                                          for r in recs)),
            "planned_parity_bytes": planned_parity,
            "planned_record_bytes": sum(r["bytes"] for r in recs),
            "planned_max_p_due": max(p_due), "planned_sum_p_due": math.fsum(p_due),
            "records_sized_as_pipeline": sized,
            "uniform_code": weak.code, "uniform_parity_bytes": weak.parity_bytes,
            "uniform_max_p_due": weak.worst_p_due,
            "ratio_planned_to_uniform": planned_parity / weak.parity_bytes
            if weak.parity_bytes else math.nan,
            "candidates": [c.__dict__ for c in cands]}
        if all(bits == 16 for _, bits in pairs):
            # the uniform store written for real: the tier's own ecc, no placement
            urecs = _store(root, f"bu{i}", engine_config(replace_ecc(nvme, weak.code)), sample)
            row["uniform_engine_parity_bytes"] = sum(
                r["bytes"] - record_bytes(b, 16, "none") for r, (b, _) in
                zip(urecs, pairs, strict=True))
        out["cases"][name] = row
        summary[name] = {k: row[k] for k in ("planned_codes", "planned_parity_bytes",
                                             "uniform_code", "uniform_parity_bytes",
                                             "ratio_planned_to_uniform")}
    out["summary"] = summary
    return out


def replace_ecc(tier: TierConfig, code: str) -> TierConfig:
    from dataclasses import replace

    return replace(tier, ecc=code, path=tier.path + "-u")


def _short(spec_str: str) -> str:
    """A record's codec spec as the candidate list spells it."""
    for c in DEFAULT_CODES:
        from rkv.codec.stages import codec_for

        cod = codec_for(c)
        if (cod is None and spec_str == "none") or (cod is not None and cod.spec == spec_str):
            return c
    return spec_str


# -- (c) ------------------------------------------------------------------------------------
def part_c(sample: tuple[list[int], np.ndarray], kl_budget: float | None,
           args: argparse.Namespace, root: Path) -> dict[str, Any]:
    sp = spec()
    toml = root / "nvme-accel.toml"
    toml.write_text(f'preset = "nvme-tlc"\nlse_rate = {1.7e-4 * args.accel!r}\n'
                    f'silent_rate = {4.8e-8 * args.accel!r}\n')
    model = resolve_model(str(toml))
    nvme = TierConfig("nvme", medium="disk", path=str(root / "nvme-c"), capacity_bytes=1 << 34,
                      fault_model=str(toml))
    base = {"max_p_due": 1.0, "bits": list(BITS), "codes": list(DEFAULT_CODES),
            "residency_hours": HOURS, "profile": PROFILE, "recompute_us_per_chunk": 0.0,
            "quality_budget_kl": 1.0 if kl_budget is None else kl_budget,
            "capacity_cost": {"nvme": 1e9}}
    planner, blocks, tier = _warm(engine_config(nvme, base), sp, args.workers)
    # The target between the checksum alone at 2 and at 4 bits: 2-bit blocks keep no code,
    # larger ones need one.
    p2, p4 = (planner.cache.get("none", data_bytes(blocks[0], b), model, HOURS)[0]
              for b in (2, 4))
    target = math.sqrt(p2 * p4)
    cfg = engine_config(nvme, {**base, "max_p_due": target})
    ep = EnginePlacement.for_engine(cfg)
    assert ep is not None
    plan = ep.planner(sp).plan(blocks, [tier])
    with Engine.open(root / "c", cfg) as e:
        e.put(sample[0], sample[1], model=sp)
        recs = stored(e, sp, sample[0])
        as_planned = all(r["bits"] == b.bits and _short(r["code"]) == b.code
                         for r, b in zip(recs, plan.blocks, strict=True))
        preds = [BlockPrediction(b.chunk, b.layer, float(model.p_any_error(r["bytes"], HOURS)),
                                 b.p_due, b.p_sdc) for r, b in zip(recs, plan.blocks,
                                                                   strict=True)]
        faulty = e.wrap_tier("nvme", lambda t: FaultyTier(t))
        assert isinstance(faulty, FaultyTier)
        t0 = time.perf_counter()
        res = run_planned_campaign(e, faulty, sample[0], sp, model, HOURS, args.trials,
                                   seed=1, chunk_tokens=CHUNK)
        secs = time.perf_counter() - t0
    tot = predicted_totals(preds)
    n = len(preds)
    cmp = {"due": compare(res.counts["due"], res.trials, tot["due"], tot["due_var"], n),
           "sdc": compare(res.counts["sdc"], res.trials, tot["sdc"], tot["sdc_var"], n),
           "corrected+masked": compare(res.counts["corrected"] + res.counts["masked"],
                                       res.trials, tot["corrected"], tot["corrected_var"], n)}
    # DUEs by code class: blocks with the checksum alone versus blocks with a code
    by_class: dict[str, Any] = {}
    for cls in sorted({b.code for b in plan.blocks}):
        idx = [i for i, b in enumerate(plan.blocks) if b.code == cls]
        sub = predicted_totals([preds[i] for i in idx])
        obs = sum(res.per_block[(plan.blocks[i].chunk, plan.blocks[i].layer)]["due"]
                  for i in idx)
        by_class[cls] = {"blocks": len(idx),
                         "bits": dict(Counter(plan.blocks[i].bits for i in idx)),
                         **compare(obs, res.trials, sub["due"], sub["due_var"], len(idx))}
    out = {"acceleration": args.accel,
           "fault_model": f"nvme-tlc with lse_rate and silent_rate x {args.accel:g}",
           "hours": HOURS, "max_p_due": target, "trials": res.trials, "blocks_per_trial": n,
           "records_as_planned": as_planned, "counts": res.counts, "reads": res.reads,
           "corrected_symbols": res.corrected_symbols, "seconds": round(secs, 1),
           "plan_codes": dict(Counter(f"{b.code} @ {b.bits} bits" for b in plan.blocks)),
           "predicted_per_trial": tot, "compare": cmp, "due_by_code": by_class}
    out["summary"] = {k: out[k] for k in ("plan_codes", "counts", "max_p_due")} | {
        "due": cmp["due"], "corrected": cmp["corrected+masked"]}
    return out
