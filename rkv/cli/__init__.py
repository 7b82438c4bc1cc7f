"""The ``rkv`` command line (click).

The subcommands live in their own modules and are imported only when one runs (the registry
is :mod:`rkv.cli.commands`), so ``rkv --help`` and shell completion stay fast. :func:`main` turns
every user mistake into one line on stderr and a non-zero exit status (docs/cli.md).
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

import click

from rkv.cli.commands import COMMANDS, SECTIONS

log = logging.getLogger(__name__)

#: Exit statuses (docs/cli.md).
EXIT_OK, EXIT_CORRUPT, EXIT_USAGE, EXIT_INTERNAL, EXIT_INTERRUPTED = 0, 1, 2, 70, 130
COMPLETE_VAR = "_RKV_COMPLETE"   # eval "$(_RKV_COMPLETE=bash_source rkv)"
LOG_LEVELS = ("debug", "info", "warning", "error")
#: Loggers whose level --log-level sets (third-party libraries stay at warning).
_OUR_LOGGERS = ("rkv", "faultmodels", "policies")
#: Exception types (module, class) that are user mistakes although not RkvErrors; checked
#: only when their module is already imported (a module not loaded cannot have raised).
_USER_ERRORS = (("faultmodels.errors", "FaultModelError"), ("policies.base", "PolicyError"))


class LazyGroup(click.Group):
    """A group whose subcommands come from a ``{name: ("module:attr", help)}`` registry and
    are imported on first use; help and completion list them from the registry alone."""

    def __init__(self, *args: Any, registry: dict[str, tuple[str, str]],
                 sections: Sequence[tuple[str, Sequence[str]]] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.registry = registry
        self.sections = sections

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.registry)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = self.registry.get(cmd_name)
        if entry is None:
            return None
        module, _, attr = entry[0].partition(":")
        cmd = getattr(importlib.import_module(module), attr)
        if not isinstance(cmd, click.Command):
            raise TypeError(f"{entry[0]} is not a click command")
        return cmd

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        listed: set[str] = set()
        for title, names in self.sections or (("Commands", list(self.registry)),):
            rows = [(n, self.registry[n][1]) for n in names if n in self.registry]
            listed.update(n for n, _ in rows)
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)
        rest = [(n, h) for n, (_, h) in self.registry.items() if n not in listed]
        if rest:
            with formatter.section("Other commands"):
                formatter.write_dl(rest)

    def shell_complete(self, ctx: click.Context, incomplete: str) -> list[Any]:
        from click.shell_completion import CompletionItem

        names = [CompletionItem(n, help=h) for n, (_, h) in self.registry.items()
                 if n.startswith(incomplete)]
        return names + [c for c in super().shell_complete(ctx, incomplete)
                        if c.value not in self.registry]


class _Formatter(logging.Formatter):
    """``rkv: warning: message`` (and the logger's name at debug level)."""

    def __init__(self, names: bool) -> None:
        super().__init__("%(asctime)s rkv: %(levelname)s: %(name)s: %(message)s" if names
                         else "rkv: %(levelname)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        record.levelname = record.levelname.lower()
        return super().format(record)


#: What setup_logging changed, for teardown_logging: (handler, {logger: its old level}).
_installed: list[tuple[logging.Handler, dict[str, int]]] = []


def setup_logging(level: str) -> None:
    """One stderr handler on the root logger; rkv's own loggers at ``level`` (others at
    warning). :func:`main` undoes it when the command returns."""
    teardown_logging()
    root = logging.getLogger()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Formatter(level.lower() == "debug"))
    old = {"": root.level, **{n: logging.getLogger(n).level for n in _OUR_LOGGERS}}
    root.addHandler(handler)
    if root.level == logging.NOTSET or root.level > logging.WARNING:
        root.setLevel(logging.WARNING)
    for name in _OUR_LOGGERS:
        logging.getLogger(name).setLevel(level.upper())
    _installed.append((handler, old))


def teardown_logging() -> None:
    """Remove the handler and restore the levels :func:`setup_logging` set."""
    while _installed:
        handler, old = _installed.pop()
        logging.getLogger().removeHandler(handler)
        for name, lvl in old.items():
            logging.getLogger(name or None).setLevel(lvl)


@click.group(cls=LazyGroup, registry=COMMANDS, sections=SECTIONS,
             context_settings={"help_option_names": ["-h", "--help"], "show_default": True,
                               "max_content_width": 100})
@click.version_option(package_name="rkv", prog_name="rkv", message="%(prog)s %(version)s")
@click.option("--log-level", type=click.Choice(LOG_LEVELS, case_sensitive=False),
              default="warning",
              help="messages of rkv's loggers at this level and above go to stderr")
@click.pass_context
def cli(ctx: click.Context, log_level: str) -> None:
    """rkv: a reliability-aware tiered storage engine for LLM KV caches.

    Run `rkv COMMAND --help` for a command's options. Exit status: 0 ok, 1 corruption found,
    2 a usage, configuration or input error, 130 interrupted (docs/cli.md).
    """
    setup_logging(log_level)
    log.debug("rkv %s, log level %s", ctx.invoked_subcommand, log_level)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default: ``sys.argv[1:]``); return the exit status.

    Every failure is one line on stderr: 1 for corruption found (an integrity error, or
    ``verify`` found the store not clean); 2 for a usage, configuration or input error, or
    any other rkv or OS error; 130 interrupted; 70 for an internal error (its traceback with
    ``--log-level debug``).
    """
    if argv is None and os.environ.get(COMPLETE_VAR):
        from click.shell_completion import shell_complete

        return shell_complete(cli, {}, "rkv", COMPLETE_VAR, os.environ[COMPLETE_VAR])
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        with cli.make_context("rkv", args) as ctx:
            return int(cli.invoke(ctx) or 0)
    except click.exceptions.Exit as exc:          # --help, --version
        return int(exc.exit_code)
    except click.UsageError as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":     # `rkv`, `rkv moe`: the help
            print(exc.format_message(), file=sys.stderr)
            return EXIT_USAGE
        where = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
        return _fail(f"{_one_line(exc.format_message())}{where}", EXIT_USAGE)
    except click.ClickException as exc:           # e.g. a bad file for click.File
        return _fail(_one_line(exc.format_message()), EXIT_USAGE)
    except (KeyboardInterrupt, click.Abort):
        print("rkv: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:                       # `rkv ... | head`: not an error
        _silence_stdout()
        return EXIT_OK
    except Exception as exc:
        from rkv.errors import IntegrityError, RkvError

        if isinstance(exc, RkvError | OSError) or _is_user_error(exc):
            code = EXIT_CORRUPT if isinstance(exc, IntegrityError) else EXIT_USAGE
            log.debug("details", exc_info=exc)
            return _fail(_one_line(str(exc)) or type(exc).__name__, code)
        log.debug("internal error", exc_info=exc)
        return _fail(f"internal error: {type(exc).__name__}: {_one_line(str(exc))} (run with "
                     "--log-level debug for the traceback)", EXIT_INTERNAL)
    finally:
        teardown_logging()


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush of a closed pipe does not
    fail again at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):   # no real file descriptor (captured)
        pass


def _is_user_error(exc: BaseException) -> bool:
    for module, name in _USER_ERRORS:
        mod = sys.modules.get(module)
        cls = getattr(mod, name, None) if mod is not None else None
        if isinstance(cls, type) and isinstance(exc, cls):
            return True
    return False


def _fail(message: str, code: int) -> int:
    print(f"rkv: error: {message}", file=sys.stderr)
    return code


def _one_line(text: str) -> str:
    return " ".join(str(text).split())

