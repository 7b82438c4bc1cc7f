"""``rkv moe ...``: the MoE model's command group.

:data:`moe_group` is the ``moe`` click group; its subcommands are listed in
:data:`SUBCOMMANDS` and imported when run (add one there). Heavy imports (torch,
transformers) happen inside the commands.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, TypeVar

import click

from rkv.cli import LazyGroup
from rkv.cli.commands import COMMANDS
from rkv.errors import InputError

logger = logging.getLogger(__name__)
F = TypeVar("F", bound=Callable[..., Any])

#: ``rkv moe`` subcommands: name -> ("module:attr", short help), imported when run.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "trace": ("rkv.cli.moe:trace_cmd",
              "record per-token routing of SmolLM2-135M-MoE over text"),
    "run": ("rkv.cli.moe_run:run_cmd", "generate text with the MoE model's experts streamed "
            "from an rkv store"),
}


def _log(quiet: bool) -> Callable[[str], None]:
    def log(msg: str) -> None:
        if not quiet:
            print(msg, file=sys.stderr, flush=True)
    return log


def model_options(threads: int = 2) -> Callable[[F], F]:
    """Options of every subcommand that loads the MoE model."""
    options = [
        click.option("--experts", type=click.IntRange(min=1), default=8,
                     help="experts per layer (divides 1536)"),
        click.option("--top-k", type=click.IntRange(min=1), default=2,
                     help="experts per token and layer"),
        click.option("--cache-dir", type=click.Path(file_okay=False), default=None,
                     help="where the fit is cached  [default: ~/.cache/rkv/moe]"),
        click.option("--threads", type=click.IntRange(min=1), default=threads,
                     help="compute threads"),
        click.option("-q", "--quiet", is_flag=True, help="no progress output"),
    ]

    def deco(f: F) -> F:
        for option in reversed(options):
            f = option(f)
        return f

    return deco


@click.command("trace", short_help=SUBCOMMANDS["trace"][1])
@model_options()
@click.option("--text", type=click.Path(exists=True, dir_okay=False), default=None,
              metavar="FILE", help="a UTF-8 text file to run")
@click.option("--topics", type=click.IntRange(min=1), default=None, metavar="N",
              help="N held-out windows of pydoc_data.topics  [default: 4]")
@click.option("--window", type=click.IntRange(min=1), default=256,
              help="tokens per forward (each window starts a fresh context)")
@click.option("--scores", is_flag=True, help="also record router scores")
@click.option("--hints", is_flag=True,
              help="also record speculative routing (layer l's router on layer l-1's MLP "
                   "input, per token)")
@click.option("--out", type=click.Path(dir_okay=False), required=True,
              help="trace file to write")
def trace_cmd(**kw: Any) -> int:
    """Record the per-token expert routing of SmolLM2-135M-MoE over text as JSON Lines
    (docs/moe.md)."""
    if kw["text"] is not None and kw["topics"] is not None:
        raise click.UsageError("--text and --topics exclude each other")
    return cmd_trace(SimpleNamespace(**kw))


@click.group("moe", cls=LazyGroup, registry=SUBCOMMANDS, short_help=COMMANDS["moe"][1])
def moe_group() -> None:
    """SmolLM2-135M as a mixture of experts: routing traces and generation with experts
    streamed from an rkv store (docs/moe.md)."""


def _read_text(args: Any) -> str | None:
    if args.window < 1:
        raise InputError("--window must be positive")
    if args.topics is not None and args.topics < 1:
        raise InputError("--topics must be positive")
    if args.text is None:
        return None
    from rkv.inputs import MAX_TEXT_BYTES, read_text

    return read_text(args.text, "--text", limit=MAX_TEXT_BYTES, error=InputError)


def _windows(args: Any, text: str | None, tok: Any) -> list[list[int]]:
    from rkv.moe.model import heldout_text

    if text is not None:
        ids = list(tok(text).input_ids)
        if not ids:
            raise InputError(f"{args.text}: no tokens")
        return [ids[i:i + args.window] for i in range(0, len(ids), args.window)]
    return heldout_text(tok, 4 if args.topics is None else args.topics, args.window)


def cmd_trace(args: Any) -> int:
    from rkv.moe.model import load_moe_smollm2
    from rkv.moe.trace import MoETraceWriter

    log = _log(args.quiet)
    if not 1 <= args.top_k <= args.experts:
        raise InputError(f"--top-k must be in 1..{args.experts}")
    text = _read_text(args)
    moe, tok = load_moe_smollm2(args.experts, 1, cache_dir=args.cache_dir, hint=False,
                                threads=args.threads, log=log)
    moe.set_top_k(args.top_k)
    windows = _windows(args, text, tok)
    with MoETraceWriter(args.out, moe.trace_header()) as w:
        for i, ids in enumerate(windows):
            r = moe.route(ids)
            for t in range(len(ids)):
                hints = ([[], *r.hints[t, 1:].tolist()] if args.hints else None)
                scores = ([[float(f"{x:.6g}") for x in row] for row in r.scores[t].tolist()]
                          if args.scores else None)
                w.write(r.experts[t].tolist(), scores, hints)
            log(f"window {i + 1}/{len(windows)}: {len(ids)} tokens")
        n = w.t
    log(f"wrote {n} tokens x {moe.spec.layers} layers to {args.out}")
    logger.info("trace %s: %d tokens, %d windows, top-%d of %d", args.out, n, len(windows),
                args.top_k, args.experts)
    return 0
