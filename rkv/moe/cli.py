"""``rkv moe ...``: the MoE model's command group.

:func:`add_moe_parser` registers ``moe`` on the top-level subparsers; each subcommand is one
``_add_<name>`` function registered in :data:`SUBCOMMANDS` (add a new one by appending its
function there). Heavy imports (torch, transformers) happen inside the commands.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rkv.errors import InputError


def _log(quiet: bool) -> Callable[[str], None]:
    def log(msg: str) -> None:
        if not quiet:
            print(msg, file=sys.stderr, flush=True)
    return log


def _add_model_args(p: argparse.ArgumentParser) -> None:
    """Arguments every subcommand that loads the MoE model takes."""
    p.add_argument("--experts", type=int, default=8, help="experts per layer (divides 1536)")
    p.add_argument("--top-k", type=int, default=2, help="experts per token and layer")
    p.add_argument("--cache-dir", default=None,
                   help="where the fit is cached (default ~/.cache/rkv/moe)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--quiet", action="store_true", help="no progress output")


def _add_trace(sub: Any) -> None:
    p = sub.add_parser("trace", help="record per-token routing of SmolLM2-135M-MoE over text "
                                     "(JSON Lines; docs/moe.md)")
    _add_model_args(p)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--text", metavar="FILE", help="a UTF-8 text file to run")
    src.add_argument("--topics", type=int, metavar="N", default=None,
                     help="N held-out windows of pydoc_data.topics (default 4)")
    p.add_argument("--window", type=int, default=256,
                   help="tokens per forward (each window starts a fresh context)")
    p.add_argument("--scores", action="store_true", help="also record router scores")
    p.add_argument("--hints", action="store_true",
                   help="also record speculative routing (layer l's router on layer l-1's "
                        "MLP input, per token)")
    p.add_argument("--out", required=True, help="trace file to write")
    p.set_defaults(fn=cmd_trace)


def _add_run(sub: Any) -> None:
    from rkv.moe.run import add_run

    add_run(sub)


SUBCOMMANDS: list[Callable[[Any], None]] = [_add_trace, _add_run]


def add_moe_parser(sub: Any) -> argparse.ArgumentParser:
    """Register ``moe`` and its subcommands on ``sub`` (an argparse subparsers object)."""
    p: argparse.ArgumentParser = sub.add_parser(
        "moe", help="SmolLM2-135M as a mixture of experts (docs/moe.md)")
    moe_sub = p.add_subparsers(dest="moe_command", required=True)
    for add in SUBCOMMANDS:
        add(moe_sub)
    return p


def _read_text(args: argparse.Namespace) -> str | None:
    if args.window < 1:
        raise InputError("--window must be positive")
    if args.topics is not None and args.topics < 1:
        raise InputError("--topics must be positive")
    if args.text is None:
        return None
    try:
        return Path(args.text).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{args.text}: cannot read text: {exc}") from exc


def _windows(args: argparse.Namespace, text: str | None, tok: Any) -> list[list[int]]:
    from rkv.moe.model import heldout_text

    if text is not None:
        ids = list(tok(text).input_ids)
        if not ids:
            raise InputError(f"{args.text}: no tokens")
        return [ids[i:i + args.window] for i in range(0, len(ids), args.window)]
    return heldout_text(tok, 4 if args.topics is None else args.topics, args.window)


def cmd_trace(args: argparse.Namespace) -> int:
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
    return 0
