"""``rkv campaign`` (one residency, or ``--days`` over time) and ``rkv validate``."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

import click

from rkv.cli.common import (
    IN_FILE,
    OUT_FILE,
    call,
    check_writable,
    command,
    complete_presets,
    json_flag,
    quiet_flag,
)
from rkv.cli.overtime import time_options
from rkv.errors import ConfigError
from rkv.format.dtypes import NAMES

log = logging.getLogger(__name__)

#: CampaignConfig defaults shown in --help (importing rkv.eval.faults.campaign takes ~0.5 s; a test
#: checks these against it).
SHOWN_DEFAULTS: dict[str, Any] = {"hours": 24.0, "trials": 100, "blocks": 8, "chunk_tokens": 256,
                                  "kv_heads": 3, "head_dim": 64, "dtype": "float16",
                                  "bits": 16, "seed": 0, "workers": 1, "sampling": "auto",
                                  "tier": "nvme", "ber_multiplier": 1.0}


def _d(name: str) -> str:
    return f"  [default: {SHOWN_DEFAULTS[name]}, or --config's]"


#: Campaign options that override the --config file when given.
_OVERRIDES = ("tier", "protection", "hours", "trials", "blocks", "seed", "workers", "sampling",
              "rows", "chunk_tokens", "kv_heads", "head_dim", "dtype", "bits", "ber_multiplier")


@command("campaign")
@click.option("--config", type=IN_FILE, default=None,
              help="TOML file with the campaign settings (options override it)")
@click.option("--tier", type=click.Choice(["dram", "cxl", "nvme"]), default=None,
              help="start from this default tier's fault model and protection" + _d("tier"))
@click.option("--fault-model", default=None, shell_complete=complete_presets,
              help="fault model preset (`rkv faultmodels` lists them: dram-ddr4, dram-ddr5, "
                   "cxl, nvme-tlc, raw-ber, ...)")
@click.option("--param", multiple=True, metavar="KEY=VALUE",
              help="override a fault model parameter (repeatable), e.g. pe_cycles=3000")
@click.option("--protection", default=None,
              help="codec spec (rs(255,239), bch(m=13,t=8), shardrs(k=16,m=2)), 'none' "
                   "(end-to-end checksum only) or 'raw' (nothing)")
@click.option("--hours", type=float, default=None,
              help="residency time in hours" + _d("hours"))
@click.option("--ber-multiplier", type=float, default=None,
              help="every fault x times as frequent (accelerated testing)"
              + _d("ber_multiplier"))
@click.option("--trials", type=click.IntRange(min=1), default=None,
              help="trials (independent stores)" + _d("trials"))
@click.option("--blocks", type=click.IntRange(min=1), default=None,
              help="blocks per trial" + _d("blocks"))
@click.option("--chunk-tokens", type=click.IntRange(min=1), default=None,
              help="tokens per block" + _d("chunk_tokens"))
@click.option("--kv-heads", type=click.IntRange(min=1), default=None,
              help="KV heads of the block shape" + _d("kv_heads"))
@click.option("--head-dim", type=click.IntRange(min=1), default=None,
              help="head dimension of the block shape" + _d("head_dim"))
@click.option("--dtype", type=click.Choice(NAMES), default=None,
              help="KV dtype" + _d("dtype"))
@click.option("--bits", type=click.Choice(["16", "8", "4", "2"]), default=None,
              help="quantize blocks to this many bits (KIVI) before protecting them"
              + _d("bits"))
@click.option("--seed", type=int, default=None, help="random seed" + _d("seed"))
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="worker processes" + _d("workers"))
@click.option("--sampling", type=click.Choice(["auto", "direct", "conditional"]), default=None,
              help="how faults are drawn (docs/rare-events.md)" + _d("sampling"))
@click.option("--tilt", default=None, metavar="auto|FACTOR",
              help="importance sampling for rare outcomes: 'auto', or a count tilt factor "
                   "(0: off; see docs/rare-events.md)")
@click.option("--rows", type=OUT_FILE, default=None, help="write per-trial rows (JSONL) here")
@click.option("--replay", type=click.IntRange(min=0), default=None, metavar="TRIAL",
              help="run one trial again and print its row")
@click.option("--raw/--no-raw", "compare_raw", default=True,
              help="also run the trials on raw storage, for comparison (--no-raw skips it)")
@json_flag("print the summary as JSON")
@click.option("--csv", is_flag=True, help="print the outcome table as CSV (one row per "
              "storage and outcome; not with --days)")
@quiet_flag()
@time_options
def campaign_cmd(**kw: Any) -> int:
    """Fault-injection campaign through the real engine: blocks written, faults injected
    from a tier's fault model, read back; counts of silent corruptions (SDC), detected
    losses (DUE) and corrections, with the same campaign on raw storage for comparison.
    With --days, a store over time with and without scrubbing (docs/campaigns.md)."""
    if kw["json"] and kw["csv"]:
        raise click.UsageError("--json and --csv exclude each other")
    if kw["bits"] is not None:
        kw["bits"] = int(kw["bits"])
    kw["param"] = list(kw["param"])
    return call(cmd_campaign, **kw)


def campaign_config(args: Any) -> Any:
    """The CampaignConfig of the options (the --config file, then the options over it)."""
    from rkv.eval.faults.campaign import CampaignConfig

    base: dict[str, Any] = {}
    if args.config:
        base = CampaignConfig.load(args.config).to_dict()
    for name in _OVERRIDES:
        value = getattr(args, name)
        if value is not None:
            base[name] = value
    if args.tilt is not None:
        base["tilt"] = args.tilt if args.tilt == "auto" else _parse_tilt(args.tilt)
    if args.fault_model is not None or args.param:
        fm: Any = args.fault_model if args.fault_model is not None else base.get("fault_model")
        if args.param:
            table = dict(fm) if isinstance(fm, dict) else ({"preset": fm} if fm else {})
            if not table.get("preset") and not table.get("model"):
                from rkv.store.config import default_tiers

                tier = base.get("tier", "nvme")
                table["preset"] = next(t for t in default_tiers() if t.name == tier).fault_model
            table.update(parse_params(args.param))
            fm = table
        base["fault_model"] = fm
    return CampaignConfig.from_dict(base)


def parse_params(items: list[str]) -> dict[str, Any]:
    """``--param KEY=VALUE`` items as a dict (numbers and booleans converted)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--param expects KEY=VALUE, got {item!r}")
        out[key.strip()] = _parse_scalar(raw)
    return out


def _parse_tilt(raw: str) -> float:
    try:
        return float(raw)
    except ValueError:
        raise ConfigError(f"--tilt expects 'auto' or a number, got {raw!r}") from None


def _parse_scalar(raw: str) -> Any:
    raw = raw.strip()
    for conv in (int, float):
        try:
            return conv(raw)
        except ValueError:
            pass
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    return raw


def cmd_campaign(args: Any) -> int:

    from rkv.eval.faults.campaign import replay_trial, run_with_raw
    from rkv.eval.faults.campaign_report import format_report

    given = [f"--{n.replace('_', '-')}" for n in ("refresh_hours", "residency_hours")
             if getattr(args, n) is not None]
    given += ["--scrub"] * (args.scrub != "auto") + ["--target"] * (args.target != 1e-9)
    if args.days is None and given:
        raise ConfigError(f"{', '.join(given)}: only with --days")
    cfg = campaign_config(args)
    check_writable(args.rows, "--rows")
    log.info("campaign: %s", cfg.to_dict())
    if args.days is not None:
        if args.csv:
            raise ConfigError("--csv: not with --days (use --json)")
        from rkv.cli.overtime import run_time_campaign
        return run_time_campaign(args, cfg)
    if args.replay is not None:
        print(json.dumps(replay_trial(cfg, args.replay), indent=2))
        return 0
    quiet = args.json or args.csv or args.quiet
    summary, raw = run_with_raw(cfg, compare_raw=args.compare_raw, progress=not quiet)
    if args.json:           # Summary.to_json() with "raw", "verdict" and "fault_model"
        print(format_report(summary, raw, "json"), end="")
    elif args.csv:
        print(format_report(summary, raw, "csv"), end="")
    else:                   # the verdict first, then the fault model and the tables
        print(format_report(summary, raw), end="")
        if cfg.rows:
            print(f"\nper-trial rows: {cfg.rows} (replay one with --replay TRIAL)")
    return 0


# -- validate --------------------------------------------------------------------------------
@command("validate")
@click.option("--quick", is_flag=True, help="the quick subset (a few cells, seconds)")
@click.option("--trials", type=click.IntRange(min=1), default=None,
              help="trials per cell instead of the sizing (cells that then fall below 80 % "
                   "power are reported as not informative)  [default: sized per cell]")
@click.option("--workers", type=click.IntRange(min=1), default=1)
@click.option("--level", type=click.FloatRange(0, 1, min_open=True, max_open=True),
              default=0.01, help="false-alarm rate of the whole matrix (Bonferroni over "
                                 "its cells)")
@click.option("--json", "json", type=OUT_FILE, default=None, metavar="PATH",
              help="write every cell as JSON here")
@click.option("--csv", is_flag=True, help="print the cells as CSV (instead of a Markdown "
              "table; the verdict line goes to stderr)")
@quiet_flag()
def validate_cmd(**kw: Any) -> int:
    """Campaigns against the analytic model in cells where it could be wrong, each sized for
    80 % power against a 2x error; exit 1 if an informative cell rejects the model (exact
    two-sided binomial test) or a block came back silently corrupted."""
    return call(cmd_validate, **kw)


def cmd_validate(args: Any) -> int:
    from rkv.eval.faults.validate import markdown, run_matrix, to_json, verdict
    from rkv.ui import Progress, render

    check_writable(args.json, "--json")

    with Progress("validate", None, unit="cell", quiet=args.quiet) as bar:
        def progress(i: int, n: int, cell: Any) -> None:
            bar.advance_to(i, n)
            bar.write(f"{cell.name}: {cell.due} of {cell.blocks} faulty blocks lost, model "
                      f"{cell.p_due:.3g}, p = {cell.p_value:.2g}, power "
                      f"{min(cell.power_2x, cell.power_half):.2f} "
                      f"({cell.seconds:.0f} s)")

        cells = run_matrix(args.quick, trials=args.trials, workers=args.workers,
                           level=args.level, progress=progress)
    line = verdict(cells)
    if args.csv:
        print(render(to_json(cells), fmt="csv"), end="")
        print(line, file=sys.stderr)
    else:
        print(markdown(cells))
        print(f"\n{line}")
    if args.json:
        Path(args.json).write_text(json.dumps(to_json(cells), indent=2) + "\n")
    if not all(c.ok for c in cells):
        return 1
    if not any(c.informative for c in cells):
        # Agreement nobody could have failed is not a pass.
        raise ConfigError("no cell was informative (below 80 % power against a 2x error): "
                          "too few --trials; leave it out to size each cell")
    return 0
