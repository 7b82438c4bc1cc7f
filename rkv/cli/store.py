"""Store commands: ``rkv init``, ``info``, ``verify``, ``migrate``, ``destroy`` and ``demo``."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

import click

from rkv.cli.common import (
    IN_FILE,
    STORE_PATH,
    call,
    command,
    json_flag,
    load_engine_config,
    output_options,
    quiet_flag,
)
from rkv.errors import InputError, StoreError

log = logging.getLogger(__name__)


# -- init ------------------------------------------------------------------------------------
@command("init")
@click.argument("path", type=STORE_PATH)
@click.option("--config", type=IN_FILE, default=None,
              help="engine config (TOML: chunk_tokens, [[tiers]], ...); default: the built-in "
                   "dram, cxl and nvme tiers")
@json_flag("print the created store's settings as JSON")
def init_cmd(**kw: Any) -> int:
    """Create an rkv store at PATH from an engine config.

    An existing store is left alone: with the same config this succeeds and says so, with
    another config it is an error (exit 2).
    """
    return call(cmd_init, **kw)


def cmd_init(args: Any) -> int:
    from rkv.store.config import EngineConfig
    from rkv.store.engine import Engine
    from rkv.store.envconfig import apply_env

    root = Path(args.path).expanduser()
    wanted = apply_env(load_engine_config(args.config) if args.config else None)
    wanted = wanted or EngineConfig()
    if (root / "index" / "data.mdb").exists():
        with Engine.open(root, create=False, readonly=True) as engine:
            have = engine.config
        if have.to_dict() != wanted.to_dict():
            diff = sorted(k for k, v in wanted.to_dict().items() if have.to_dict()[k] != v)
            raise StoreError(f"{root} is an rkv store with another config (differs in: "
                             f"{', '.join(diff)}); nothing was changed")
        log.info("%s exists with the same config", root)
        _print_created(root, have, args.json, existed=True)
        return 0
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise StoreError(f"{root} exists and is not an rkv store; nothing was created")
    from rkv.store.paths import undo_on_failure
    from rkv.store.plans import check_plannable

    check_plannable(wanted)          # what `rkv plan` would refuse: before anything exists
    log.info("creating %s", root)
    with undo_on_failure(root, wanted), Engine.open(root, wanted, create=True) as engine:
        cfg = engine.config
    _print_created(root, cfg, args.json, existed=False)
    return 0


def _print_created(root: Path, cfg: Any, as_json: bool, *, existed: bool) -> None:
    from rkv.store.results import human_bytes

    if as_json:
        print(json.dumps({"path": str(root), "created": not existed, "config": cfg.to_dict()},
                         indent=2))
        return
    print(f"{root}: {'exists already with this config' if existed else 'created'}; "
          f"chunk_tokens {cfg.chunk_tokens}, {len(cfg.tiers)} tier(s):")
    for t in cfg.tiers:
        where = t.path or ("memory-backed directory" if t.medium == "memory"
                           else f"{root}/tiers/{t.name}")
        if t.kind != "lmdb":         # a remote tier: its server, never its credentials
            from rkv.tiers.remote_config import redact_url

            where = f"{t.kind} at {redact_url(t.url)}"
        print(f"  {t.name}: {t.medium}, {human_bytes(t.capacity_bytes)}, ecc {t.ecc}, quant "
              f"{t.quant}, fault model {t.fault_model}, policy {t.policy} ({where})")


# -- info ------------------------------------------------------------------------------------
@command("info")
@click.argument("path", type=STORE_PATH)
@output_options()
@click.option("--schedule", is_flag=True, help="also compute each tier's refresh age and "
              "scrub interval (docs/scrub-schedule.md; slow)")
def info_cmd(**kw: Any) -> int:
    """Show a store's tiers, usage, blocks and model fingerprints (read-only). --json prints
    everything; --csv the tiers table."""
    return call(cmd_info, **kw)


def _tier_columns() -> list[Any]:
    from rkv.ui import Column, human_bytes

    def used(v: Any) -> str:
        return v if isinstance(v, str) else human_bytes(v)

    return [Column("name"), Column("kind"), Column("medium"), Column("blocks", align="right"),
            Column("bytes", "used", "right", used),
            Column("capacity_bytes", "capacity", "right", human_bytes), Column("ecc"),
            Column("fault_model", "fault model"), Column("path")]


def _shown(tier: dict[str, Any]) -> dict[str, Any]:
    """A tier's row of the text table: a shared tier's index figures marked as such (its
    server holds more than this store's index knows of)."""
    if not tier.get("shared"):
        return tier
    if not tier["blocks"]:
        return {**tier, "blocks": "not counted", "bytes": "(shared)"}
    from rkv.ui import human_bytes

    return {**tier, "blocks": f"{tier['blocks']} indexed",
            "bytes": f"{human_bytes(tier['bytes'])} indexed"}


def cmd_info(args: Any) -> int:
    from rkv.store.engine import Engine
    from rkv.ui import echo_table

    with Engine.open(args.path, create=False, readonly=True) as engine:
        st = engine.stats()
    if args.schedule:  # seconds per tier: predict runs a handful of times
        from rkv.store.schedule_info import add_schedule, schedule_text
        log.info("computing the scrub schedules")
        add_schedule(st, engine.config.scrub_target_p_due)
    tiers = [{"name": name, **t} for name, t in st["tiers"].items()]
    if args.fmt == "json":
        print(json.dumps(st, indent=2, sort_keys=True))
        return 0
    if args.fmt == "csv":
        echo_table(tiers, _tier_columns(), fmt="csv")
        return 0
    print(f"store        {st['path']}")
    print(f"chunk_tokens {st['chunk_tokens']}")
    print(f"chunks       {st['chunks']} ({st['tokens']} tokens; {st['shared_chunks']} shared, "
          f"{st['pinned_chunks']} pinned)")
    print("tiers:")
    sys.stdout.flush()
    echo_table([_shown(t) for t in tiers], _tier_columns())
    for t in tiers:
        if t.get("shared"):
            print(f"  {t['name']} is shared: blocks and used count only the blocks this store's "
                  "index holds there (adopted, or moved there); copies written through to it "
                  "are counted in the tier they were put in, and other nodes' blocks are not "
                  "counted (this session's writes: Engine.stats(), rkv serve-metrics)")
    from rkv.store.storemix import mix_table
    print(mix_table(st["tiers"]), end="")
    if args.schedule:
        print(schedule_text(st), end="")
    print("models:")
    for m in st["models"]:
        print(f"  {m['fingerprint']}  {m['model_id']} {m['dtype']} layers={m['n_layers']} "
              f"kv_heads={m['n_kv_heads']} head_dim={m['head_dim']} tp={m['tp_rank']}/"
              f"{m['tp_size']}")
    return 0


# -- verify ----------------------------------------------------------------------------------
#: VerifyReport counts printed when the engine reports them (newer engines add them).
_VERIFY_EXTRA = ("degraded", "unreachable", "unreadable_chunks", "reclaimed", "usage_fixed")


@command("verify")
@click.argument("path", type=STORE_PATH)
@json_flag("print the summary as JSON")
@quiet_flag()
@click.option("--repair", is_flag=True,
              help="rewrite blocks that needed correction from their corrected data")
def verify_cmd(**kw: Any) -> int:
    """Read and check every record of a store; exit 1 if anything is corrupt."""
    return call(cmd_verify, **kw)


def cmd_verify(args: Any) -> int:
    from rkv.store.engine import Engine
    from rkv.ui import Progress

    with (Engine.open(args.path, create=False, readonly=not args.repair) as engine,
          Progress("verify", None, unit="chunk", quiet=args.quiet) as bar):
        rep = engine.verify(progress=bar.advance_to, repair=args.repair)
    log.info("verified %s: %d chunks, clean=%s", args.path, rep.chunks, rep.clean)
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


# -- migrate, destroy ------------------------------------------------------------------------
@command("migrate")
@click.argument("path", type=STORE_PATH)
def migrate_cmd(path: str) -> int:
    """Upgrade a store's index to the current format (a no-op when it is current)."""
    from rkv.store.engine import Engine
    from rkv.store.index import INDEX_FORMAT

    if not (Path(path).expanduser() / "index").is_dir():
        raise InputError(f"{path} is not an rkv store (no index)")
    with Engine.open(path, create=False) as engine:
        was = engine.migrated_from
    if was is None:
        print(f"{path}: index format {INDEX_FORMAT} already; nothing to do")
    else:
        print(f"{path}: index format {was} -> {INDEX_FORMAT}")
    return 0


@command("destroy")
@click.argument("path", type=STORE_PATH)
@click.option("--yes", is_flag=True, help="do not ask for confirmation")
def destroy_cmd(path: str, yes: bool) -> int:
    """Delete a store and its tier files kept outside it (asks first on a terminal). A
    directory that does not carry an rkv store's marker or index is refused (exit 2)."""
    from rkv.store.engine import Engine
    from rkv.store.paths import check_store

    check_store(Path(path).expanduser())
    if not yes:
        if not sys.stdin.isatty():
            raise InputError(f"refusing to destroy {path} without --yes "
                             "(stdin is not a terminal)")
        try:
            answer = input(f"destroy the rkv store {path} and its tier files? [y/N] ")
        except EOFError:
            answer = ""
        if answer.strip().lower() not in ("y", "yes"):
            raise InputError(f"not confirmed; {path} was not destroyed")
    log.info("destroying %s", path)
    Engine.destroy(path)
    return 0


# -- demo ------------------------------------------------------------------------------------
@command("demo")
@click.option("--path", type=STORE_PATH, default=None,
              help="store directory (new or an rkv store)  [default: a temporary one]")
@click.option("--prompts", type=click.IntRange(min=1), default=6, help="number of prompts")
@click.option("--keep", is_flag=True, help="keep the store afterwards")
@click.option("--faults/--no-faults", default=True,
              help="inject faults into stored records and show rkv catching them "
                   "(--no-faults skips that part)")
@quiet_flag()
def demo_cmd(path: str | None, prompts: int, keep: bool, faults: bool, quiet: bool) -> int:
    """Store and reload KV for prompts with shared prefixes, verified byte for byte; then
    inject faults into stored records and show rkv catching them where raw storage returns
    wrong values."""
    from rkv.eval.demo import run_demo

    if path is not None:
        p = Path(path).expanduser()
        if p.exists() and not p.is_dir():
            raise InputError(f"--path {path}: exists and is not a directory")
        if p.is_dir() and any(p.iterdir()) and not (p / "index").is_dir():
            raise InputError(f"--path {path}: a directory that is not an rkv store")
    return run_demo(path=path, prompts=prompts, keep=keep, faults=faults, quiet=quiet)
