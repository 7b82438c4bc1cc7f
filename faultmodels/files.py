"""Bounded reads of the files a config names: the one implementation rkv and faultmodels share.

A path a user gives may name anything: ``/dev/zero`` (endless), ``/dev/urandom``, a FIFO
(an ``open`` that blocks until someone writes), a directory, a multi-gigabyte file, or a
document nested a million levels deep. Every reader of such a file goes through here:

* :func:`open_regular` opens without blocking and refuses anything but a regular file;
* :func:`read_bytes` / :func:`read_text` read at most ``limit`` bytes (more is an error, never
  a silent truncation);
* :func:`check_nesting` refuses JSON or TOML nested deeper than ``limit`` before a recursive
  parser sees it (TOML's dotted keys count too: ``a.b.c = 1`` is three tables deep, and
  :mod:`tomllib` is quadratic in a key's length); :func:`load_toml` parses after that check.

Every problem raises ``error`` (default :class:`FaultModelError`; :mod:`rkv.inputs` binds
:class:`rkv.errors.ConfigError` and :class:`rkv.errors.InputError`) with a one-line message
that starts with ``what`` and the path.
"""

from __future__ import annotations

import os
import re
import stat
import tomllib
from typing import Any, BinaryIO

from .errors import FaultModelError

#: Deepest nesting :func:`check_nesting` allows by default (rkv's own documents nest < 8).
MAX_NESTING = 64
#: Largest TOML file :func:`faultmodels.load` reads (a preset is under 2 KiB).
MAX_TOML_BYTES = 1 << 20

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISSOCK, "a socket"))
# Strings and comments are skipped whole, so brackets and dots inside them do not count.
_JSON_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.DOTALL)
_TOML_TOKENS = re.compile(r'"""(?:[^\\]|\\.)*?"""|\'\'\'.*?\'\'\'|"(?:[^"\\\n]|\\.)*"'
                          r"|'[^'\n]*'|#[^\n]*|[\[\]{}.=,\n]", re.DOTALL)


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "a special file")


def open_regular(path: str | os.PathLike[str], what: str, *,
                 error: type[Exception] = FaultModelError) -> BinaryIO:
    """``path`` opened for binary reading; ``error`` when it cannot be opened or is not a
    regular file (a FIFO is opened without blocking, then refused)."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except (OSError, ValueError) as exc:   # ValueError: a NUL byte in the path
        raise error(f"{what} {path}: cannot open: "
                    f"{getattr(exc, 'strerror', None) or exc}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise error(f"{what} {path}: cannot open: it is {_kind(mode)}, not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} bytes"


def read_bytes(path: str | os.PathLike[str], what: str, *, limit: int,
               error: type[Exception] = FaultModelError) -> bytes:
    """The bytes of the regular file ``path``; ``error`` if it has more than ``limit``."""
    with open_regular(path, what, error=error) as f:
        try:
            if os.fstat(f.fileno()).st_size > limit:
                raise error(f"{what} {path}: larger than {_size(limit)}")
            data = f.read(limit + 1)     # the file may grow after the fstat
        except OSError as exc:
            raise error(f"{what} {path}: cannot read: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise error(f"{what} {path}: larger than {_size(limit)}")
    return data


def read_text(path: str | os.PathLike[str], what: str, *, limit: int,
              error: type[Exception] = FaultModelError) -> str:
    """The UTF-8 text of the regular file ``path`` (at most ``limit`` bytes)."""
    data = read_bytes(path, what, limit=limit, error=error)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{what} {path}: not UTF-8 text (byte {exc.start})") from None


def nesting(text: str, syntax: str) -> int:
    """An upper bound of how deep ``text`` (``"json"`` or ``"toml"``) nests, reading no
    further than needed: brackets and braces, and for TOML also the dots of a dotted key
    (each one a table deeper). Linear in ``text``; exact enough to refuse a hostile file
    without refusing a real one."""
    if syntax == "json":
        if text.count("[") + text.count("{") <= MAX_NESTING:
            return text.count("[") + text.count("{")
        tokens = _JSON_TOKENS
    else:
        bound = text.count("[") + text.count("{") + text.count(".")
        if bound <= MAX_NESTING:
            return bound
        tokens = _TOML_TOKENS
    depth = run = deepest = 0
    for m in tokens.finditer(text):
        c = m.group()[0]
        if c in "[{":
            depth += 1
            run = 0
        elif c in "]}":
            depth = max(0, depth - 1)
            run = 0
        elif c == ".":                 # a dotted key's part (a float has one per value)
            run += 1
        elif c in "=,\n":
            run = 0
        else:                          # a string or a comment
            continue
        if depth + run > deepest:
            deepest = depth + run
            if deepest > MAX_NESTING:  # far enough: the caller refuses it anyway
                return deepest
    return deepest


def check_nesting(text: str, what: str, *, syntax: str,
                  error: type[Exception] = FaultModelError) -> None:
    """``error`` if ``text`` nests deeper than :data:`MAX_NESTING` levels."""
    if nesting(text, syntax) > MAX_NESTING:
        raise error(f"{what}{': ' if what else ''}nested deeper than {MAX_NESTING} levels")


def load_toml(text: str, what: str, *, error: type[Exception] = FaultModelError
              ) -> dict[str, Any]:
    """``text`` parsed as TOML after :func:`check_nesting`; bad TOML is ``error`` (its message
    starts with ``what``, when given)."""
    check_nesting(text, what, syntax="toml", error=error)
    prefix = f"{what}: " if what else ""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{prefix}not valid TOML: {exc}") from None
    except RecursionError:   # pragma: no cover - check_nesting keeps the parser shallow
        raise error(f"{prefix}nested too deeply") from None


__all__ = ["MAX_NESTING", "MAX_TOML_BYTES", "check_nesting", "load_toml", "nesting",
           "open_regular", "read_bytes", "read_text"]
