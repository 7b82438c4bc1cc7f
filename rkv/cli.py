"""The ``rkv`` command line."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rkv.engine import Engine
from rkv.errors import ConfigError, InputError, IntegrityError, RkvError
from rkv.results import human_bytes


def cmd_info(args: argparse.Namespace) -> int:
    with Engine.open(args.path, create=False, readonly=True) as engine:
        st = engine.stats()
    if args.schedule:  # seconds per tier: predict runs a handful of times
        from rkv.faults.schedule_info import add_schedule, schedule_text
        add_schedule(st, engine.config.scrub_target_p_due)
    if args.json:
        print(json.dumps(st, indent=2, sort_keys=True))
        return 0
    print(f"store        {st['path']}")
    print(f"chunk_tokens {st['chunk_tokens']}")
    print(f"chunks       {st['chunks']} ({st['tokens']} tokens; {st['shared_chunks']} shared, "
          f"{st['pinned_chunks']} pinned)")
    print("tiers:")
    print(f"  {'name':<6} {'medium':<7} {'blocks':>8} {'used':>11} {'capacity':>11} "
          f"{'ecc':<18} {'fault model':<12} path")
    for name, t in st["tiers"].items():
        print(f"  {name:<6} {t['medium']:<7} {t['blocks']:>8} {human_bytes(t['bytes']):>11} "
              f"{human_bytes(t['capacity_bytes']):>11} {t['ecc']:<18} {t['fault_model']:<12} "
              f"{t['path']}")
    from rkv.storemix import mix_table
    print(mix_table(st["tiers"]), end="")
    if args.schedule:
        print(schedule_text(st), end="")
    print("models:")
    for m in st["models"]:
        print(f"  {m['fingerprint']}  {m['model_id']} {m['dtype']} layers={m['n_layers']} "
              f"kv_heads={m['n_kv_heads']} head_dim={m['head_dim']} tp={m['tp_rank']}/"
              f"{m['tp_size']}")
    return 0


#: VerifyReport counts printed when the engine reports them (newer engines add them).
_VERIFY_EXTRA = ("degraded", "unreachable", "unreadable_chunks", "reclaimed", "usage_fixed")


def cmd_verify(args: argparse.Namespace) -> int:
    def progress(done: int, total: int) -> None:
        if not args.quiet and sys.stderr.isatty() and (done == total or done % 64 == 0):
            print(f"\rverifying chunk {done}/{total}", end="", file=sys.stderr, flush=True)

    with Engine.open(args.path, create=False, readonly=not args.repair) as engine:
        rep = engine.verify(progress=progress, repair=args.repair)
    if not args.quiet and sys.stderr.isatty():
        print(file=sys.stderr)
    extra = {name: getattr(rep, name, 0) for name in _VERIFY_EXTRA}
    summary: dict[str, Any] = {
        "chunks": rep.chunks, "blocks": rep.blocks, "ok": rep.ok, "corrected": rep.corrected,
        "uncorrectable": rep.uncorrectable, "missing": rep.missing, "orphans": rep.orphans,
        "repaired": rep.repaired, **extra, "clean": rep.clean,
        "problems": [{"chunk": c, "layer": lay, "tier": t, "error": e}
                     for c, lay, t, e in rep.problems],
    }
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        shown = "".join(f"; {n} {name.replace('_', ' ')}" for name, n in extra.items() if n)
        print(f"{rep.chunks} chunks, {rep.blocks} blocks: {rep.ok} ok, {rep.corrected} "
              f"corrected, {rep.uncorrectable} uncorrectable, {rep.missing} missing; "
              f"{rep.orphans} unreferenced records{shown}"
              + (f"; {rep.repaired} repaired" if args.repair else ""))
        for c, lay, t, e in rep.problems[:50]:
            print(f"  chunk {c[:16]}… layer {lay} ({t}): {e}")
        if len(rep.problems) > 50:
            print(f"  … and {len(rep.problems) - 50} more")
        print("OK" if rep.clean else "CORRUPT")
    return 0 if rep.clean else 1


def cmd_migrate(args: argparse.Namespace) -> int:
    from rkv.index import INDEX_FORMAT

    if not (Path(args.path).expanduser() / "index").is_dir():
        raise InputError(f"{args.path} is not an rkv store (no index)")
    with Engine.open(args.path, create=False) as engine:
        was = engine.migrated_from
    if was is None:
        print(f"{args.path}: index format {INDEX_FORMAT} already; nothing to do")
    else:
        print(f"{args.path}: index format {was} -> {INDEX_FORMAT}")
    return 0


def cmd_destroy(args: argparse.Namespace) -> int:
    if not (Path(args.path).expanduser() / "index").is_dir():
        raise InputError(f"{args.path} is not an rkv store (no index); nothing was destroyed")
    if not args.yes:
        if not sys.stdin.isatty():
            raise InputError(f"refusing to destroy {args.path} without --yes "
                             "(stdin is not a terminal)")
        try:
            answer = input(f"destroy the rkv store {args.path} and its tier files? [y/N] ")
        except EOFError:
            answer = ""
        if answer.strip().lower() not in ("y", "yes"):
            raise InputError(f"not confirmed; {args.path} was not destroyed")
    Engine.destroy(args.path)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from rkv.demo import run_demo

    return run_demo(path=args.path, prompts=args.prompts, keep=args.keep)


def _campaign_config(args: argparse.Namespace) -> Any:
    from rkv.faults.campaign import CampaignConfig

    base: dict[str, Any] = {}
    if args.config:
        base = CampaignConfig.load(args.config).to_dict()
    for name in ("tier", "protection", "hours", "trials", "blocks", "seed", "workers",
                 "sampling", "rows", "chunk_tokens", "kv_heads", "head_dim", "dtype", "bits",
                 "ber_multiplier"):
        value = getattr(args, name)
        if value is not None:
            base[name] = value
    if getattr(args, "tilt", None) is not None:
        base["tilt"] = args.tilt if args.tilt == "auto" else _parse_tilt(args.tilt)
    if args.fault_model is not None or args.param:
        fm: Any = args.fault_model if args.fault_model is not None else base.get("fault_model")
        if args.param:
            table = dict(fm) if isinstance(fm, dict) else ({"preset": fm} if fm else {})
            if not table.get("preset") and not table.get("model"):
                from rkv.config import default_tiers

                tier = base.get("tier", "nvme")
                table["preset"] = next(t for t in default_tiers() if t.name == tier).fault_model
            for item in args.param:
                key, sep, raw = item.partition("=")
                if not sep:
                    raise ConfigError(f"--param expects KEY=VALUE, got {item!r}")
                table[key.strip()] = _parse_scalar(raw)
            fm = table
        base["fault_model"] = fm
    return CampaignConfig.from_dict(base)


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


def cmd_campaign(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from rkv.faults.campaign import (
        format_summary,
        replay_trial,
        run_campaign,
        stderr_progress,
    )

    cfg = _campaign_config(args)
    if args.days is not None:
        from rkv.faults.overtime_cli import run_time_campaign
        return run_time_campaign(args, cfg)
    if args.replay is not None:
        print(json.dumps(replay_trial(cfg, args.replay), indent=2))
        return 0
    quiet = args.json or args.quiet
    summary = run_campaign(cfg, progress=None if quiet else stderr_progress)
    result: dict[str, Any] = summary.to_json()
    raw = None
    if args.compare_raw and summary.protection != "raw":
        raw = run_campaign(replace(cfg, protection="raw", rows=""),
                           progress=None if quiet else stderr_progress)
        result["raw"] = raw.to_json()
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(format_summary(summary))
        if raw is not None:
            print("\nthe same campaign on raw storage (no header, no checksum: what peers do):")
            print(format_summary(raw))
        if cfg.rows:
            print(f"\nper-trial rows: {cfg.rows} (replay one with --replay TRIAL)")
    return 0


def quality_settings(bits: list[int], ber: float, ecc: str, group: int,
                     fault_model: Any = None, hours: float = 1.0) -> list[tuple[str, Any]]:
    """The rows of the quality table: (label, transform) pairs. Fault rows use independent
    flips at ``ber``, or ``fault_model`` (a faultmodels spec) over ``hours`` when given."""
    from rkv.quality import RkvRoundTrip, cast_to, raw_flips, raw_model_faults

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


def cmd_quality(args: argparse.Namespace) -> int:
    from rkv.quality import evaluate, format_table, load_smollm2, text_windows

    bits = [int(b) for b in str(args.bits).split(",") if b.strip()]
    if any(b not in (2, 4, 8, 16, 32) for b in bits):
        raise ConfigError(f"--bits takes values among 2, 4, 8, 16, got {args.bits!r}")
    if not {x.strip() for x in args.text.split(",")} <= {"topics", "docs"}:
        raise ConfigError(f"--text takes topics, docs or both, got {args.text!r}")
    if not quiet_tty(args):
        print("loading SmolLM2-135M-Instruct (Q4_1 weights, fp32 compute)...", file=sys.stderr)
    model, tok = load_smollm2(threads=args.threads)
    windows = text_windows(tok, args.windows, args.prefix + args.eval, sources=args.text)
    rows = []
    fault_model: Any = None
    if args.fault_model:
        fault_model = args.fault_model
        if args.param:
            fault_model = {"preset": args.fault_model}
            for item in args.param:
                key, sep, raw = item.partition("=")
                if not sep:
                    raise ConfigError(f"--param expects KEY=VALUE, got {item!r}")
                fault_model[key.strip()] = _parse_scalar(raw)
    settings = quality_settings(bits, args.ber, args.ecc, args.group, fault_model, args.hours)
    for label, transform in settings:
        if not quiet_tty(args):
            print(f"  {label}", file=sys.stderr)
        rows.append(evaluate(model, windows, transform, label=label, prefix=args.prefix))
    if args.json:
        print(json.dumps([q.row() for q in rows], indent=2))
    else:
        print(f"SmolLM2-135M-Instruct (weights 4-bit Q4_1), {len(windows)} windows of "
              f"{args.text}: {args.prefix}-token prefix from the cache under test, "
              f"{args.eval} tokens scored\n")
        print(format_table(rows))
    return 0


def quiet_tty(args: argparse.Namespace) -> bool:
    return bool(args.json or args.quiet or not sys.stderr.isatty())


def cmd_replay(args: argparse.Namespace) -> int:
    from rkv.replay_report import cli_replay

    return cli_replay(args)


def cmd_validate(args: argparse.Namespace) -> int:
    from rkv.faults.validate import Z_LIMIT, markdown, run_matrix, to_json

    if args.trials < 1 or args.workers < 1:
        raise InputError("--trials and --workers must be at least 1")

    def progress(i: int, n: int, cell: Any) -> None:
        print(f"\r{i}/{n} cells ({cell.model}, {cell.protection})", end="", file=sys.stderr,
              flush=True)

    cells = run_matrix(args.quick, trials=args.trials, workers=args.workers,
                       progress=None if args.quiet or not sys.stderr.isatty() else progress)
    print(markdown(cells))
    bad = [c for c in cells if not c.ok]
    print(f"\n{len(cells) - len(bad)} of {len(cells)} cells agree within |z| <= {Z_LIMIT:g}")
    if args.json:
        Path(args.json).write_text(json.dumps(to_json(cells), indent=2) + "\n")
    return 1 if bad else 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rkv", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="show tiers, usage, blocks and model fingerprints")
    info.add_argument("path")
    info.add_argument("--json", action="store_true", help="print JSON")
    info.add_argument("--schedule", action="store_true", help="also compute each tier's "
                      "refresh age and scrub interval (docs/scrub-schedule.md; slow)")
    info.set_defaults(fn=cmd_info)
    ver = sub.add_parser("verify", help="read and check every record; exit 1 if corrupt")
    ver.add_argument("path")
    ver.add_argument("--json", action="store_true", help="print the summary as JSON")
    ver.add_argument("--quiet", action="store_true", help="no progress output")
    ver.add_argument("--repair", action="store_true",
                     help="rewrite blocks that needed correction from their corrected data")
    ver.set_defaults(fn=cmd_verify)
    val = sub.add_parser("validate", help="campaigns against the analytic model, every preset "
                         "x every code; exit 1 if a cell disagrees (|z| > 4)")
    val.add_argument("--quick", action="store_true", help="a small subset (seconds)")
    val.add_argument("--trials", type=int, default=40, help="trials of 10 blocks per cell")
    val.add_argument("--workers", type=int, default=1)
    val.add_argument("--json", metavar="PATH", help="write every cell as JSON here")
    val.add_argument("--quiet", action="store_true", help="no progress output")
    val.set_defaults(fn=cmd_validate)
    mig = sub.add_parser("migrate", help="upgrade a store's index to the current format")
    mig.add_argument("path")
    mig.set_defaults(fn=cmd_migrate)
    des = sub.add_parser("destroy", help="delete a store and its tier files kept outside it")
    des.add_argument("path")
    des.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    des.set_defaults(fn=cmd_destroy)
    demo = sub.add_parser("demo", help="store and reload KV for prompts with shared prefixes")
    demo.add_argument("--path", default=None, help="store directory (default: a temporary one)")
    demo.add_argument("--prompts", type=int, default=6, help="number of prompts")
    demo.add_argument("--keep", action="store_true", help="keep the store afterwards")
    demo.set_defaults(fn=cmd_demo)
    camp = sub.add_parser("campaign", help="fault-injection campaign through the real engine")
    camp.add_argument("--config", help="TOML file with the campaign settings")
    camp.add_argument("--tier", choices=["dram", "cxl", "nvme"], default=None,
                      help="start from this default tier's fault model and protection")
    camp.add_argument("--fault-model", default=None,
                      help="fault model preset (dram-ddr4, dram-ddr5, cxl, nvme-tlc, raw-ber)")
    camp.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                      help="override a fault model parameter (repeatable), e.g. pe_cycles=3000")
    camp.add_argument("--protection", default=None,
                      help="codec spec (rs(255,239), bch(m=13,t=8), shardrs(k=16,m=2)), "
                           "'none' (end-to-end checksum only) or 'raw' (nothing)")
    camp.add_argument("--hours", type=float, default=None, help="residency time in hours")
    camp.add_argument("--ber-multiplier", dest="ber_multiplier", type=float, default=None,
                      help="every fault x times as frequent (accelerated testing)")
    camp.add_argument("--trials", type=int, default=None)
    camp.add_argument("--blocks", type=int, default=None, help="blocks per trial")
    camp.add_argument("--chunk-tokens", dest="chunk_tokens", type=int, default=None)
    camp.add_argument("--kv-heads", dest="kv_heads", type=int, default=None)
    camp.add_argument("--head-dim", dest="head_dim", type=int, default=None)
    camp.add_argument("--dtype", default=None, choices=["float16", "bfloat16", "float32"])
    camp.add_argument("--bits", type=int, default=None, choices=[16, 8, 4, 2],
                      help="quantize blocks to this many bits (KIVI) before protecting them")
    camp.add_argument("--seed", type=int, default=None)
    camp.add_argument("--workers", type=int, default=None)
    camp.add_argument("--sampling", choices=["auto", "direct", "conditional"], default=None)
    camp.add_argument("--tilt", default=None, metavar="auto|FACTOR",
                      help="importance sampling for rare outcomes: 'auto', or a count tilt "
                           "factor (0: off; see docs/rare-events.md)")
    camp.add_argument("--rows", default=None, help="write per-trial rows (JSONL) here")
    camp.add_argument("--replay", type=int, default=None, metavar="TRIAL",
                      help="run one trial again and print its row")
    camp.add_argument("--no-raw", dest="compare_raw", action="store_false",
                      help="skip the comparison run on raw storage")
    camp.add_argument("--json", action="store_true", help="print the summary as JSON")
    camp.add_argument("--quiet", action="store_true", help="no progress output")
    from rkv.faults.overtime_cli import add_time_args
    add_time_args(camp)
    camp.set_defaults(fn=cmd_campaign)
    qual = sub.add_parser("quality", help="quality of KV through rkv on SmolLM2-135M "
                                          "(bit-widths, injected faults, with and without ECC)")
    qual.add_argument("--bits", default="16,8,4,2", help="comma-separated bit-widths")
    qual.add_argument("--group", type=int, default=32, help="quantization group size")
    qual.add_argument("--ber", type=float, default=1e-5,
                      help="bit error rate of the fault rows (0: none)")
    qual.add_argument("--ecc", default="rs(255,239)", help="the ECC of the protected rows")
    qual.add_argument("--fault-model", default=None,
                      help="inject a tier model's faults instead of --ber (e.g. nvme-tlc)")
    qual.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                      help="fault model parameter override (repeatable)")
    qual.add_argument("--hours", type=float, default=24.0,
                      help="residency for --fault-model")
    qual.add_argument("--windows", type=int, default=4, help="windows (alternating sources)")
    qual.add_argument("--text", default="topics", help="sources: topics, docs (unseen) or both")
    qual.add_argument("--prefix", type=int, default=512, help="prefix tokens from the cache")
    qual.add_argument("--eval", type=int, default=64, help="tokens scored per window")
    qual.add_argument("--threads", type=int, default=2)
    qual.add_argument("--json", action="store_true")
    qual.add_argument("--quiet", action="store_true")
    qual.set_defaults(fn=cmd_quality)
    rep = sub.add_parser("replay", help="replay a request trace through eviction policies "
                                        "(hit ratios, modeled TTFT, Belady and infinite cache)")
    rep.add_argument("trace", help="trace file (JSON Lines)")
    rep.add_argument("--format", choices=["mooncake", "accesslog"], default="mooncake")
    rep.add_argument("--policy", action="append", default=[], metavar="SPEC",
                     help="policy spec, e.g. lru or s3fifo(small=0.1), optionally with an "
                          "admission policy: prefix+after(n=2) (repeatable; default: every "
                          "registered policy)")
    rep.add_argument("--markdown", action="store_true", help="print Markdown tables")
    rep.add_argument("--lookahead", type=int, action="append", default=[], metavar="N",
                     help="also replay with a scheduler that knows the next N queued "
                          "requests (their cached blocks are not evicted; with --tiers they "
                          "are also prefetched into the top tier); repeatable; "
                          "0 = no look-ahead (default: 0)")
    rep.add_argument("--capacity", action="append", default=[], metavar="C",
                     help="cache size: a fraction of the trace's unique blocks (0.05, 5%%) or "
                          "bytes (2GiB) (repeatable; default without --tiers: 0.01 0.02 0.05 "
                          "0.1 0.2)")
    rep.add_argument("--tiers", action="append", default=[], metavar="LAYOUT",
                     help="tiers top to bottom, NAME=C[@GBPS/US],...: dram=2%%,cxl=5%%,"
                          "nvme=20%% (dram, cxl and nvme have rkv's default bandwidth and "
                          "latency; other names need @GBPS/US) (repeatable)")
    rep.add_argument("--promote", default=None, metavar="hit|never",
                     help="with --tiers: move a block hit in a lower tier to the top tier "
                          "(hit, the default) or leave it there (never)")
    rep.add_argument("--prefetch-policy", dest="prefetch_policy", default=None,
                     metavar="SPEC", help="which queued blocks a budget moves: queue "
                     "(default) or shallow")
    rep.add_argument("--prefetch-budget", dest="prefetch_budget", default=None, metavar="B",
                     help="with --tiers and --lookahead: bytes prefetched per request, as "
                          "bytes (2GiB) or a fraction of the top tier (default 0.25; "
                          "0: queued blocks are protected but not prefetched)")
    rep.add_argument("--block-bytes", dest="block_bytes", type=int, default=None, metavar="N",
                     help="bytes of one block (default: 11796480, 512 tokens of SmolLM2-135M "
                          "fp16 KV)")
    rep.add_argument("--limit", type=int, default=None, metavar="N",
                     help="replay only the first N requests")
    rep.add_argument("--recompute-tps", dest="recompute_tps", type=float, default=None,
                     metavar="X", help="prefill tokens per second on a miss (default: 530, "
                                       "SmolLM2-135M on 2 CPU threads)")
    rep.add_argument("--bandwidth", type=float, default=20.0, metavar="GBPS",
                     help="GB/s when loading hit blocks (default: 20, DRAM-like)")
    rep.add_argument("--latency", type=float, default=0.1, metavar="US",
                     help="microseconds per loaded block (default: 0.1)")
    rep.add_argument("--json", metavar="PATH", help="write every result as JSON here")
    rep.add_argument("--plot", metavar="PNG",
                     help="plot prefix-token hit ratio against capacity (needs matplotlib)")
    rep.add_argument("--quiet", action="store_true", help="no progress output")
    rep.add_argument("--store", metavar="DIR", default=None,
                     help="also replay every policy through real one-tier stores created "
                          "(and destroyed) under this new directory")
    rep.set_defaults(fn=cmd_replay)
    from rkv.moe.replay_cli import register as register_moe

    register_moe(rep)
    from rkv.commands import register_all

    register_all(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; every failure is one line on stderr and a non-zero exit.

    Exit 1: corruption found (an integrity error, or ``verify`` found the store not clean);
    2: a usage, configuration or input error, or any other rkv or OS error; 130: interrupted.
    """
    args = build_parser().parse_args(argv)
    try:
        return int(args.fn(args))
    except KeyboardInterrupt:
        print("rkv: interrupted", file=sys.stderr)
        return 130
    except RkvError as exc:
        print(f"rkv: error: {_one_line(exc)}", file=sys.stderr)
        return 1 if isinstance(exc, IntegrityError) else 2
    except OSError as exc:
        print(f"rkv: error: {_one_line(exc)}", file=sys.stderr)
        return 2


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


if __name__ == "__main__":
    sys.exit(main())
