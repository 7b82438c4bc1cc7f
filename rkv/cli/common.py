"""Shared pieces of the click commands: :func:`command` (a top-level command whose short help
comes from the registry in :mod:`rkv.cli.commands`), the common flags, and :func:`call`, which
hands a command's options to an implementation that reads them as attributes."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar, cast

import click

from rkv.cli.commands import COMMANDS
from rkv.errors import ConfigError, InputError

F = TypeVar("F", bound=Callable[..., Any])


def command(name: str, **kwargs: Any) -> Callable[[Callable[..., Any]], click.Command]:
    """``click.command(name)`` with the registry's short help (``rkv --help`` shows that
    without importing the command)."""
    return click.command(name, short_help=COMMANDS[name][1], **kwargs)


def call(fn: Callable[[Any], Any], **params: Any) -> int:
    """Run ``fn`` on the options as a namespace (``args.json``, ``args.quiet``, ...)."""
    return int(fn(SimpleNamespace(**params)) or 0)


def json_flag(help: str = "print JSON instead of text") -> Callable[[F], F]:
    return click.option("--json", "json", is_flag=True, help=help)


def quiet_flag(help: str = "no progress output") -> Callable[[F], F]:
    return click.option("-q", "--quiet", is_flag=True, help=help)


def output_options(with_csv: bool = True) -> Callable[[F], F]:
    """``--json`` (and ``--csv``) flags, passed to the command as ``fmt``: ``"text"``,
    ``"json"`` or ``"csv"``."""

    def deco(f: F) -> F:
        @functools.wraps(f)
        def wrapper(*args: Any, json: bool = False, csv: bool = False, **kw: Any) -> Any:
            if json and csv:
                raise click.UsageError("--json and --csv exclude each other")
            return f(*args, fmt="json" if json else "csv" if csv else "text", **kw)

        out: Any = wrapper
        if with_csv:
            out = click.option("--csv", "csv", is_flag=True, help="print CSV")(out)
        out = click.option("--json", "json", is_flag=True, help="print JSON")(out)
        return cast(F, out)

    return deco


def split_list(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Callback: a comma-separated option, whitespace around items dropped."""
    if value is None:
        return None
    return ",".join(p.strip() for p in value.split(",") if p.strip())


def complete_presets(ctx: click.Context, param: click.Parameter, incomplete: str
                     ) -> list[str]:
    """Shell completion of a fault-model preset name."""
    import faultmodels

    return [p for p in faultmodels.list_presets() if p.startswith(incomplete)]


def check_writable(path: str | None, option: str) -> None:
    """Refuse an output file whose directory is missing, before any work."""
    if path is None:
        return
    parent = Path(path).expanduser().resolve().parent
    if not parent.is_dir():
        raise InputError(f"{option} {path}: directory {parent} does not exist")


def load_engine_config(path: str, option: str = "--config") -> Any:
    """The EngineConfig in a TOML file (a regular file of at most 1 MiB: :mod:`rkv.inputs`);
    a problem is a ConfigError naming the option and file."""
    from rkv.inputs import read_text
    from rkv.store.config import EngineConfig

    text = read_text(path, option)
    try:
        return EngineConfig.from_toml(text)
    except ConfigError as exc:
        raise ConfigError(f"{option} {path}: {exc}") from None


#: A store directory (existence is the store's to check: its message says what is wrong).
STORE_PATH = click.Path(file_okay=True, dir_okay=True, path_type=str)
#: A file that must exist and be readable.
IN_FILE = click.Path(exists=True, dir_okay=False, readable=True, path_type=str)
#: A file to write (its directory is checked when the command writes it).
OUT_FILE = click.Path(dir_okay=False, writable=True, path_type=str)
