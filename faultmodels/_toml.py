"""A small TOML writer for model parameters (internal).

Uses `tomli_w` when it is importable, else writes the subset of TOML the models need:
strings, booleans, integers, floats (incl. inf/nan), lists of those, and nested tables.
Reading uses the standard library's `tomllib`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

from .errors import FaultModelError

_BARE = re.compile(r"^[A-Za-z0-9_-]+$")


def _key(k: str) -> str:
    return k if _BARE.match(k) else _string(k)


def _string(s: str) -> str:
    return json.dumps(s, ensure_ascii=False).replace("\x7f", "\\u007f")


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return _string(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    raise FaultModelError(f"cannot write {type(v).__name__} value {v!r} to TOML")


def _table(d: Mapping[str, Any], path: list[str], out: list[str]) -> None:
    scalars = [(k, v) for k, v in d.items() if not isinstance(v, Mapping)]
    tables = [(k, v) for k, v in d.items() if isinstance(v, Mapping)]
    if path and (scalars or not tables):
        out.append("")
        out.append("[" + ".".join(_key(p) for p in path) + "]")
    for k, v in scalars:
        out.append(f"{_key(str(k))} = {_value(v)}")
    for k, v in tables:
        _table(v, [*path, str(k)], out)


def dumps_plain(d: Mapping[str, Any]) -> str:
    """TOML text for a nested mapping of plain values, written without any library."""
    out: list[str] = []
    _table(d, [], out)
    return "\n".join(out).lstrip("\n") + "\n"


def dumps(d: Mapping[str, Any]) -> str:
    """TOML text for a nested mapping of plain values (`tomli_w` if importable)."""
    try:
        import tomli_w
    except ImportError:  # pragma: no cover - depends on the environment
        return dumps_plain(d)
    text: str = tomli_w.dumps(dict(d))
    return text
