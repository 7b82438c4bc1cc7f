"""``rkv plan``: the plan placement makes for a put, explained (per block: tier, bits, code,
predicted P(DUE) and P(SDC), bytes, expected cost, and why), without writing anything."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import click

from rkv.cli.common import (
    IN_FILE,
    OUT_FILE,
    call,
    check_writable,
    command,
    load_engine_config,
    quiet_flag,
)
from rkv.errors import ConfigError

log = logging.getLogger(__name__)


@command("plan")
@click.option("--model", default="smollm2-135m",
              help="'smollm2-135m', or a JSON file with a ModelSpec")
@click.option("--tokens", type=click.IntRange(min=1, max=1 << 20), default=1024,
              help="tokens in the put (at most 1 Mi: a plan is linear in them, about 90 s "
                   "for 1 Mi)")
@click.option("--config", type=IN_FILE, default=None,
              help="engine config TOML with a [placement] table  [default: the default tiers "
                   "and placement defaults]")
@click.option("--tier", default=None,
              help="the tier the chunks go to  [default: the first tier; with place_tiers, "
                   "every tier]")
@click.option("--rows", type=click.IntRange(min=0), default=60,
              help="table rows to print (0: all)")
@click.option("--json", "json", type=OUT_FILE, default=None,
              help="also write the plan to this file")
@click.option("--workers", type=click.IntRange(min=1, max=256), default=1,
              help="processes that compute the fault models' predictions (the slow stage: "
                   "seconds each for some models)")
@quiet_flag()
def plan_cmd(**kw: Any) -> int:
    """Print the placement plan of a put without writing anything: per block its tier, bits
    and code, predicted P(DUE) and P(SDC), bytes, expected cost, and why
    (docs/placement.md)."""
    return call(cmd_plan, **kw)


def _model(name: str) -> Any:
    from rkv.format.model import ModelSpec

    if name == "smollm2-135m":
        from rkv.eval.calibrate import smollm2_spec

        return smollm2_spec()
    path = Path(name)
    if not path.exists():
        raise ConfigError(f"--model: no model {name!r} (use 'smollm2-135m' or a JSON file "
                          "with a ModelSpec)")
    from rkv.inputs import read_json

    doc = read_json(path, "--model")
    try:
        return ModelSpec.from_dict(doc)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ConfigError(f"--model {name}: not a model spec: {exc}") from exc


def cmd_plan(args: Any) -> int:
    from rkv.placement.config import PlacementConfig
    from rkv.store.config import EngineConfig
    from rkv.store.plans import EnginePlacement
    from rkv.ui.progress import Progress

    check_writable(args.json, "--json")
    cfg = load_engine_config(args.config) if args.config else EngineConfig()
    spec = _model(args.model)
    pcfg = cfg.placement_config or PlacementConfig.from_dict({})
    # With place_tiers the planner chooses among every tier (unless --tier pins one).
    names = ([args.tier] if args.tier else [t.name for t in cfg.tiers] if pcfg.place_tiers
             else [cfg.tiers[0].name])
    for name in names:
        cfg.tier(name)
    placement = EnginePlacement(pcfg, cfg.tiers)
    n = cfg.chunk_tokens
    tokens = [min(n, args.tokens - s) for s in range(0, args.tokens, n)]
    planner = placement.planner(spec)
    blocks = placement.blocks(spec, tokens, len(tokens))
    tier_inputs = [placement.tier_input(t) for t in names]
    # Two stages: the fault models' predictions (per code, width and tier: seconds each for
    # some models, minutes in all) with a count, then the search itself (fast once warm).
    with Progress("plan: predictions", unit="prediction", quiet=args.quiet) as p:
        planner.warm(blocks, tier_inputs, args.workers, progress=p.advance_to)
    with Progress("plan: search", 1, unit="plan", quiet=args.quiet) as p:
        plan = planner.plan(blocks, tier_inputs)
        p.update()
    where = ", ".join(f"{t} ({cfg.tier(t).fault_model})" for t in names)
    log.info("plan: %d blocks for %d tokens on %s", len(plan.blocks), args.tokens, where)
    stall = (f"; streamed-restore stall {plan.extra['stall_us']:.1f} us"
             if "stall_us" in plan.extra else "")
    print(f"plan: {spec.model_id}, {args.tokens} tokens in {len(tokens)} chunk(s) of {n}, "
          f"tier{'s' if len(names) > 1 else ''} {where}, {len(plan.blocks)} blocks; "
          f"profile: {planner.profile.model if planner.profile else 'none (16 bits only)'}"
          f"{stall}")
    print(plan.table(None if args.rows == 0 else args.rows))
    if args.json:
        Path(args.json).write_text(json.dumps(plan.to_dict(), indent=2, default=str))
    return 0
