"""The one spec grammar: ``name`` or ``name(arg, ..., key=value, ...)``.

Policies (``s3fifo(small=0.1)``, ``prefix+after(n=2)``) and rkv's codecs and quantizers
(``rs(255,239,interleave=16)``, ``kivi(bits=4)``, ``planes(high=rs(255,223),low=none)``) are
written in it, so one string means the same wherever it is given. This module knows no
policy and no codec (rkv's registries, :mod:`rkv.specs`, use it too; that is why it lives in
a package that imports nothing of rkv).

- ``name``: a letter or ``_``, then letters, digits, ``_`` or ``-``; compared lower-cased.
- Arguments are split at the commas outside parentheses; positional ones come first.
- A value is an integer (``12``, ``-3``), a float (``0.1``, ``1e-9``), ``true``/``false``
  (any case), a quoted string (``'crc32c'``, ``"x"``), or else the text as written
  (``none``, ``crc32c``, a nested spec such as ``rs(255,223)``), stripped.

Errors are :class:`SpecError` (a ``ValueError``) with a one-line message; each registry
turns it into its own error type.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

_CALL = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_-]*)\s*(?:\((.*)\))?\s*$", re.DOTALL)
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_INT = re.compile(r"^[+-]?\d+$")
_FLOAT = re.compile(r"^[+-]?(?:\d+\.\d*|\.\d+|\d+(?:\.\d*)?[eE][+-]?\d+|\.\d+[eE][+-]?\d+)$")
#: Longest spec accepted (a spec is a short string; this bounds hostile input).
MAX_SPEC = 4096


class SpecError(ValueError):
    """A spec string that does not follow the grammar."""


@dataclass(frozen=True)
class Call:
    """A parsed spec: its lower-cased name, positional and keyword arguments."""

    name: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


def value(text: str) -> Any:
    """One argument's value (see the module docstring)."""
    text = text.strip()
    if _INT.match(text):
        return int(text)
    if _FLOAT.match(text):
        return float(text)
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


def split_top(body: str) -> list[str]:
    """``body`` split at the commas outside parentheses, so that an argument may itself be a
    spec: ``high=rs(255,223),low=none`` -> ``["high=rs(255,223)", "low=none"]``."""
    parts: list[str] = []
    depth = start = 0
    for i, ch in enumerate(body):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise SpecError(f"unbalanced parentheses in {body!r}")
        elif ch == "," and depth == 0:
            parts.append(body[start:i])
            start = i + 1
    if depth:
        raise SpecError(f"unbalanced parentheses in {body!r}")
    parts.append(body[start:])
    return parts


def parse_call(spec: Any, what: str = "spec") -> Call:
    """``spec`` parsed: ``"rs(255, 239, interleave=16)"`` -> ``Call("rs", (255, 239),
    {"interleave": 16})``. ``what`` names the spec in error messages."""
    if not isinstance(spec, str):
        raise SpecError(f"{what} must be a string, got {type(spec).__name__}")
    if len(spec) > MAX_SPEC:
        raise SpecError(f"{what} is longer than {MAX_SPEC} characters")
    m = _CALL.match(spec)
    if m is None:
        raise SpecError(f"malformed {what} {spec!r}")
    name, body = m.group(1).lower(), m.group(2)
    if body is None or not body.strip():
        return Call(name)
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for part in split_top(body):
        part = part.strip()
        if not part:
            raise SpecError(f"empty argument in {what} {spec!r}")
        key, eq, val = part.partition("=")
        if eq and _KEY.match(key.strip()):
            key = key.strip()
            if key in kwargs:
                raise SpecError(f"parameter {key!r} given twice in {what} {spec!r}")
            kwargs[key] = value(val)
        elif eq and "(" not in key:
            raise SpecError(f"bad parameter name {key.strip()!r} in {what} {spec!r}")
        else:
            if kwargs:
                raise SpecError(f"positional argument after keyword in {what} {spec!r}")
            args.append(value(part))
    return Call(name, tuple(args), kwargs)
