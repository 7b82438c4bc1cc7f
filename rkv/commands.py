"""Top-level subcommands that live outside :mod:`rkv.cli`: each entry of :data:`COMMANDS` is
``"module:function"``, and the function registers its parser(s) on the top-level subparsers.
Add a command by appending its entry here (``rkv.cli`` stays small)."""

from __future__ import annotations

import importlib
from typing import Any

COMMANDS: list[str] = [
    "rkv.calibrate:register",
    "rkv.placement.cli:register",
    "rkv.moe.cli:add_moe_parser",
    "rkv.sweep.report_cli:register",
    "rkv.sweep.cli:register",
    "rkv.scrub_cli:register",
]


def register_all(sub: Any) -> None:
    """Register every command of :data:`COMMANDS` on ``sub``."""
    for entry in COMMANDS:
        module, _, name = entry.partition(":")
        getattr(importlib.import_module(module), name)(sub)
