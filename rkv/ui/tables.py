"""One way to print a table: rows (dicts) and an optional column spec, rendered as

* ``text``: a :mod:`rich` table; styled on a terminal, plain (no ANSI codes, never wrapped
  to a terminal width) when captured or when ``plain=True``;
* ``json``: a list of objects with the rows' raw values (numbers stay numbers; a non-finite
  float becomes ``null``, which JSON lacks);
* ``csv``: a header of column keys, then the raw values;
* ``markdown``: a GitHub table of the formatted values.

Formatters apply to ``text`` and ``markdown`` only: machine formats get the values as they are.
"""

from __future__ import annotations

import csv
import io
import json
import math
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TextIO

from rkv.errors import InputError

__all__ = ["FORMATS", "Column", "check_format", "columns_of", "echo_table", "render"]

FORMATS = ("text", "json", "csv", "markdown")
Align = Literal["left", "right", "center"]
#: The width a captured table may take before rich would squeeze its columns.
_PLAIN_WIDTH = 1000


@dataclass(frozen=True)
class Column:
    """A column: the row key it shows, its header (default: the key), alignment, and how a
    value becomes text (a format spec such as ``".3g"`` or ``"{:,}"``, or a callable; default:
    ``str``, with ``None`` shown as ``-``)."""

    key: str
    header: str = ""
    align: Align = "left"
    fmt: str | Callable[[Any], str] | None = None

    @property
    def title(self) -> str:
        return self.header or self.key

    def text(self, value: Any) -> str:
        if value is None:
            return "-"
        f = self.fmt
        if f is None:
            return str(value)
        if callable(f):
            return f(value)
        return f.format(value) if "{" in f else format(value, f)


def check_format(fmt: str) -> str:
    """``fmt`` if it is one of :data:`FORMATS`, else an :class:`InputError`."""
    if fmt not in FORMATS:
        raise InputError(f"output format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    return fmt


def columns_of(rows: Sequence[Mapping[str, Any]]) -> list[Column]:
    """Columns for every key of ``rows`` in first-seen order; numbers right-aligned."""
    keys: dict[str, Align] = {}
    for row in rows:
        for k, v in row.items():
            num = isinstance(v, int | float) and not isinstance(v, bool)
            if k not in keys or (num and keys[k] == "left"):
                keys[k] = "right" if num else "left"
    return [Column(k, align=a) for k, a in keys.items()]


def _json_value(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, Mapping):
        return {str(k): _json_value(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_json_value(x) for x in v]
    return v


def _csv_value(v: Any) -> Any:
    if v is None:
        return ""
    if isinstance(v, Mapping | list | tuple):
        return json.dumps(_json_value(v), default=str)
    return v


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(rows: Iterable[Mapping[str, Any]], columns: Sequence[Column] | None = None, *,
           fmt: str = "text", title: str = "", plain: bool = True,
           width: int | None = None, indent: int = 0) -> str:
    """The table as a string in ``fmt`` (see the module docstring). ``plain=False`` keeps
    rich's styles (ANSI codes) in ``text``; ``width`` caps a text table's width (default: as
    wide as its content); ``indent`` shifts a text table right by that many spaces."""
    check_format(fmt)
    rows = list(rows)
    cols = list(columns) if columns is not None else columns_of(rows)
    if fmt == "json":
        return json.dumps([{c.key: _json_value(r.get(c.key)) for c in cols} for r in rows],
                          indent=2, default=str) + "\n"
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow([c.key for c in cols])
        for r in rows:
            w.writerow([_csv_value(r.get(c.key)) for c in cols])
        return buf.getvalue()
    if fmt == "markdown":
        sep = {"left": "---", "right": "---:", "center": ":---:"}
        lines = ([f"**{title}**", ""] if title else []) + [
            "| " + " | ".join(_md_cell(c.title) for c in cols) + " |",
            "|" + "|".join(sep[c.align] for c in cols) + "|"]
        lines += ["| " + " | ".join(_md_cell(c.text(r.get(c.key))) for c in cols) + " |"
                  for r in rows]
        return "\n".join(lines) + "\n"
    buf = io.StringIO()
    _print_rich(rows, cols, title, buf, styled=not plain, width=width)
    if not plain:
        return buf.getvalue()
    # rich pads every line to the table's width: trailing blanks only get in the way of
    # diffs and doc snippets.
    pad = " " * indent
    return "".join((pad + line).rstrip() + "\n" for line in buf.getvalue().splitlines())


def _print_rich(rows: list[Mapping[str, Any]], cols: list[Column], title: str, file: TextIO,
                *, styled: bool, width: int | None) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    # Text objects, not strings: a cell such as "[1e-9, 2e-9]" is not rich markup.
    table = Table(title=title or None, title_justify="left", box=box.SIMPLE_HEAD,
                  header_style="bold" if styled else "", title_style="bold" if styled else "",
                  show_edge=False, pad_edge=False)
    for c in cols:
        table.add_column(Text(c.title), justify=c.align, no_wrap=not styled and width is None,
                         overflow="fold")
    for r in rows:
        table.add_row(*(Text(c.text(r.get(c.key))) for c in cols))
    if styled:
        console = Console(file=file, force_terminal=True, width=width)
    else:
        console = Console(file=file, force_terminal=False, no_color=True, color_system=None,
                          highlight=False, width=width or _PLAIN_WIDTH, legacy_windows=False)
    console.print(table, soft_wrap=False)


def _is_tty(file: TextIO) -> bool:
    try:
        return bool(file.isatty())
    except (AttributeError, ValueError):
        return False


def echo_table(rows: Iterable[Mapping[str, Any]], columns: Sequence[Column] | None = None, *,
               fmt: str = "text", title: str = "", file: TextIO | None = None) -> None:
    """Print the table to ``file`` (default stdout): styled and fitted to the terminal when
    ``file`` is one, plain text otherwise."""
    out = sys.stdout if file is None else file
    check_format(fmt)
    rows = list(rows)
    if fmt == "text" and _is_tty(out):
        cols = list(columns) if columns is not None else columns_of(rows)
        _print_rich(rows, cols, title, out, styled=True, width=None)
        return
    out.write(render(rows, columns, fmt=fmt, title=title))
    out.flush()
