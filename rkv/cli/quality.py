"""``rkv quality``: the quality of KV stored through rkv on SmolLM2-135M. Every option (bits,
codec, quantizer, fault model) is checked before the model loads (a minute or more)."""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

import click

from rkv.cli.campaign import parse_params
from rkv.cli.common import call, command, complete_presets, output_options, quiet_flag, split_list
from rkv.errors import ConfigError

log = logging.getLogger(__name__)
BITS = (2, 4, 8, 16, 32)
SOURCES = ("topics", "docs")


@command("quality")
@click.option("--bits", default="16,8,4,2", callback=split_list,
              help="comma-separated bit-widths among 2, 4, 8, 16")
@click.option("--group", type=click.IntRange(min=1), default=32,
              help="quantization group size")
@click.option("--ber", type=click.FloatRange(min=0, max=1, max_open=True), default=1e-5,
              help="bit error rate of the fault rows (0: none)")
@click.option("--ecc", default="rs(255,239)", help="the ECC of the protected rows")
@click.option("--fault-model", default=None, shell_complete=complete_presets,
              help="inject a tier model's faults instead of --ber (e.g. nvme-tlc; "
                   "`rkv faultmodels` lists them)")
@click.option("--param", multiple=True, metavar="KEY=VALUE",
              help="fault model parameter override (repeatable)")
@click.option("--hours", type=click.FloatRange(min=0, min_open=True), default=24.0,
              help="residency for --fault-model")
@click.option("--windows", type=click.IntRange(min=1), default=4,
              help="windows (alternating sources)")
@click.option("--text", default="topics", callback=split_list,
              help="sources: topics, docs (unseen) or both")
@click.option("--prefix", type=click.IntRange(min=1), default=512,
              help="prefix tokens from the cache")
@click.option("--eval", "eval", type=click.IntRange(min=1), default=64,
              help="tokens scored per window")
@click.option("--threads", type=click.IntRange(min=1), default=2)
@output_options()
@quiet_flag()
def quality_cmd(**kw: Any) -> int:
    """Quality of KV through rkv on SmolLM2-135M: perplexity and KL at each bit-width, with
    injected faults on raw storage and through rkv with and without ECC."""
    kw["param"] = list(kw["param"])
    return call(cmd_quality, **kw)


def quality_settings(bits: list[int], ber: float, ecc: str, group: int,
                     fault_model: Any = None, hours: float = 1.0) -> list[tuple[str, Any]]:
    """The rows of the quality table: (label, transform) pairs. Fault rows use independent
    flips at ``ber``, or ``fault_model`` (a faultmodels spec) over ``hours`` when given."""
    from rkv.eval.quality import RkvRoundTrip, cast_to, raw_flips, raw_model_faults

    rows: list[tuple[str, Any]] = [("fp32 cache (reference)", None),
                                   ("stored as fp16", cast_to("float16"))]
    for b in bits:
        if b >= 16:
            rows.append(("rkv, 16+ bits (as computed)", RkvRoundTrip()))
        else:
            quant = f"kivi(bits={b},group={group})"
            rows.append((f"rkv, kivi {b} bits", RkvRoundTrip(quant=quant)))
    if fault_model is not None or ber > 0:
        fm: Any = fault_model if fault_model is not None else {"model": "raw-ber", "ber": ber}
        what = (f"{_model_name(fault_model)}, {hours:g} h" if fault_model is not None
                else f"BER {ber:g}")
        raw = (raw_model_faults(fault_model, hours) if fault_model is not None
               else raw_flips(ber))
        rows.append((f"raw storage, {what} (peers)", raw))
        rows.append((f"rkv none, {what}", RkvRoundTrip(fault_model=fm, hours=hours)))
        rows.append((f"rkv {ecc}, {what}", RkvRoundTrip(ecc=ecc, fault_model=fm, hours=hours)))
        low = min((b for b in bits if b < 16), default=None)
        if low is not None:
            rows.append((f"rkv kivi {low} bits + {ecc}, {what}",
                         RkvRoundTrip(quant=f"kivi(bits={low},group={group})", ecc=ecc,
                                      fault_model=fm, hours=hours)))
    return rows


def _model_name(spec: Any) -> str:
    if isinstance(spec, dict):
        return str(spec.get("preset") or spec.get("model") or "custom")
    return str(spec)


def check_settings(settings: list[tuple[str, Any]]) -> None:
    """Build every row's codec, quantizer and fault model now (a ConfigError naming the
    option), so a typo fails in a second rather than after the model has loaded."""
    import faultmodels
    from rkv.eval.quality import RkvRoundTrip
    from rkv.store.config import TierConfig

    seen: set[tuple[str, str]] = set()
    models: list[Any] = []
    for _label, transform in settings:
        if not isinstance(transform, RkvRoundTrip):
            continue
        if (transform.quant, transform.ecc) not in seen:
            seen.add((transform.quant, transform.ecc))
            try:
                TierConfig("quality", quant=transform.quant, ecc=transform.ecc)
            except ConfigError as exc:
                option = "--ecc" if "ecc" in str(exc) else "--bits/--group"
                raise ConfigError(f"{option}: {str(exc).removeprefix('tier quality: ')}"
                                  ) from None
        if transform.fault_model is not None and transform.fault_model not in models:
            models.append(transform.fault_model)
    for fm in models:
        try:
            faultmodels.get_model(fm)
        except (faultmodels.FaultModelError, ConfigError) as exc:
            raise ConfigError(f"--fault-model/--param: {exc}") from None


def cmd_quality(args: Any) -> int:
    try:
        bits = [int(b) for b in args.bits.split(",")]
    except ValueError:
        bits = []
    if not bits or any(b not in BITS for b in bits):
        raise ConfigError(f"--bits takes values among 2, 4, 8, 16, got {args.bits!r}")
    if not args.text or not set(args.text.split(",")) <= set(SOURCES):
        raise ConfigError(f"--text takes topics, docs or both, got {args.text!r}")
    fault_model: Any = None
    if args.fault_model:
        fault_model = args.fault_model
        if args.param:
            fault_model = {"preset": args.fault_model, **parse_params(args.param)}
    elif args.param:
        raise ConfigError("--param needs --fault-model")
    settings = quality_settings(bits, args.ber, args.ecc, args.group, fault_model, args.hours)
    check_settings(settings)
    log.info("quality: %d rows checked", len(settings))

    from rkv.eval.quality import evaluate, load_smollm2, text_windows
    from rkv.eval.quality_table import format_table
    from rkv.ui import Progress

    if not args.quiet:       # on a terminal or not: the model takes a minute to load
        print("loading SmolLM2-135M-Instruct (Q4_1 weights, fp32 compute)...", file=sys.stderr,
              flush=True)
    model, tok = load_smollm2(threads=args.threads)
    windows = text_windows(tok, args.windows, args.prefix + args.eval, sources=args.text)
    rows = []
    with Progress("quality", len(settings), unit="row", quiet=args.quiet, every_s=30.0) as bar:
        for label, transform in settings:
            bar.write(f"  {label}")
            log.info("evaluating %s", label)
            rows.append(evaluate(model, windows, transform, label=label, prefix=args.prefix))
            bar.update()
    if args.fmt == "json":
        print(json.dumps([q.row() for q in rows], indent=2))
    elif args.fmt == "csv":
        from rkv.ui import echo_table

        echo_table([{k: v for k, v in q.row().items() if k not in ("ci95", "per_window")}
                    for q in rows], fmt="csv")       # scalars only: one value per cell
    else:
        print(f"SmolLM2-135M-Instruct (weights 4-bit Q4_1), {len(windows)} windows of "
              f"{args.text}: {args.prefix}-token prefix from the cache under test, "
              f"{args.eval} tokens scored\n")
        print(format_table(rows))
    return 0
