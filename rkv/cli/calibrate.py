"""``rkv calibrate``: measure the quality profile of SmolLM2-135M (:mod:`rkv.eval.calibrate`)."""

from __future__ import annotations

from typing import Any

import click

from rkv.cli.common import OUT_FILE, call, check_writable, command, quiet_flag, split_list
from rkv.errors import ConfigError


@command("calibrate")
@click.option("--windows", type=click.IntRange(min=1), default=24,
              help="text windows (576 tokens)")
@click.option("--text", default="topics,docs", callback=split_list,
              help="sources: topics, docs or both")
@click.option("--out", type=OUT_FILE, default="smollm2-135m.json", help="profile file to write")
@click.option("--cache", type=OUT_FILE, default=None,
              help="resume file (JSON Lines)  [default: under ~/.cache/rkv]")
@click.option("--limit", type=click.IntRange(min=1), default=None,
              help="measure only the first N windows")
@click.option("--threads", type=click.IntRange(min=1), default=2)
@quiet_flag()
def calibrate_cmd(**kw: Any) -> int:
    """Quality profile of SmolLM2-135M: the KL divergence when one layer's K or V is
    quantized to 8, 4 or 2 bits (docs/calibration.md)."""
    from rkv.eval.calibrate import cmd_calibrate

    if not kw["text"] or not set(kw["text"].split(",")) <= {"topics", "docs"}:
        raise ConfigError(f"--text takes topics, docs or both, got {kw['text']!r}")
    check_writable(kw["out"], "--out")
    return call(cmd_calibrate, **kw)
