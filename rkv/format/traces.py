"""Request traces for policy replay: the Mooncake trace format and rkv's own access log.

Both are JSON Lines, one request per line, read lazily. Every problem with a file (missing,
unreadable, not a regular file, not JSON, a field of the wrong type or sign, a line over
16 MiB) raises :class:`~rkv.errors.InputError` naming the file and the line; nothing else
escapes.

* ``mooncake``: ``{"timestamp": ms, "input_length": tokens, "output_length": tokens,
  "hash_ids": [int, ...]}``; each hash id is one 512-token block of the prompt, chained as a
  prefix (equal ids mean an identical prefix up to and including that block).
* ``accesslog``: one line per engine get or put, ``{"t": seconds, "op": "get" | "put",
  "model": fingerprint hex, "chunks": [chunk key hex, ...], "tokens": n}`` with an optional
  ``"chunk_tokens"`` (default 256, the engine's default). Chunk keys already depend on the
  model fingerprint and on the whole prefix (see :mod:`rkv.format.keys`).

Tokens beyond the listed blocks (``tokens > len(blocks) * block_tokens``) are simply never
cached; the last block may be partial.
"""

from __future__ import annotations

import json
import math
import os
import string
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rkv.errors import InputError
from rkv.inputs import MAX_LINE_BYTES, open_regular  # the longest line a reader accepts

#: Tokens per hash id in the Mooncake traces.
MOONCAKE_BLOCK_TOKENS = 512
#: Default tokens per chunk of an access log (the engine's default ``chunk_tokens``).
ACCESSLOG_CHUNK_TOKENS = 256
#: Largest token count and chunk size a line may carry (keeps all sums within 64 bits).
MAX_TOKENS = 1 << 40
MAX_CHUNK_TOKENS = 1 << 20
FORMATS = ("mooncake", "accesslog")
_HEX = frozenset(string.hexdigits)


@dataclass(frozen=True, slots=True)
class Request:
    """One request of a trace: its prompt as a chain of block ids."""

    timestamp: float                 # seconds since the start of the trace
    tokens: int                      # input (prompt) tokens
    blocks: tuple[Hashable, ...]     # block ids, in prefix order
    block_tokens: int = MOONCAKE_BLOCK_TOKENS
    op: str = "get"                  # "get": a lookup that counts; "put": a write

    def block_token_counts(self) -> list[int]:
        """Tokens in each block (the last ones may be partial or empty)."""
        bt, n = self.block_tokens, self.tokens
        return [max(0, min(bt, n - j * bt)) for j in range(len(self.blocks))]


class _Bad(Exception):
    """A field problem inside one line; the reader adds the file and line."""


def _lines(path: str | os.PathLike[str], what: str) -> Iterator[tuple[int, Any]]:
    """(line number, parsed JSON object) for every non-blank line of ``path``."""
    p = Path(path)
    f = open_regular(p, what, error=InputError)     # /dev/zero, a FIFO: refused at once
    with f:
        lineno = 0
        while True:
            lineno += 1
            try:
                raw = f.readline(MAX_LINE_BYTES + 1)
            except OSError as exc:
                raise InputError(f"{p}:{lineno}: cannot read: {exc.strerror or exc}") from exc
            if not raw:
                return
            if len(raw) > MAX_LINE_BYTES:
                raise InputError(f"{p}:{lineno}: line longer than {MAX_LINE_BYTES >> 20} MiB")
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError:
                raise InputError(f"{p}:{lineno}: not UTF-8 text") from None
            except (ValueError, RecursionError) as exc:
                msg = exc.msg if isinstance(exc, json.JSONDecodeError) else type(exc).__name__
                raise InputError(f"{p}:{lineno}: not JSON ({msg})") from None
            yield lineno, obj


def _obj(obj: Any) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise _Bad(f"expected a JSON object, got {type(obj).__name__}")
    return obj


def _int(obj: dict[str, Any], name: str, *, default: int | None = None, minimum: int = 0,
         maximum: int = MAX_TOKENS) -> int:
    v = obj.get(name, default)
    if v is None:
        raise _Bad(f"missing field {name!r}")
    if isinstance(v, bool) or not isinstance(v, int):
        raise _Bad(f"{name!r} must be an integer, got {_show(v)}")
    if not minimum <= v <= maximum:
        raise _Bad(f"{name!r} must be in [{minimum}, {maximum}], got {_show(v)}")
    return v


def _number(obj: dict[str, Any], name: str) -> float:
    v = obj.get(name)
    if v is None:
        raise _Bad(f"missing field {name!r}")
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise _Bad(f"{name!r} must be a number, got {_show(v)}")
    if v < 0 or (isinstance(v, int) and v > 2**63) or not math.isfinite(v):
        raise _Bad(f"{name!r} must be a finite number in [0, 2**63], got {_show(v)}")
    return float(v)


def _list(obj: dict[str, Any], name: str) -> list[Any]:
    v = obj.get(name)
    if v is None:
        raise _Bad(f"missing field {name!r}")
    if not isinstance(v, list):
        raise _Bad(f"{name!r} must be a list, got {_show(v)}")
    return v


def _hex(v: Any, what: str) -> str:
    if not isinstance(v, str) or not v or len(v) > 256 or not _HEX.issuperset(v):
        raise _Bad(f"{what} must be a non-empty hex string of at most 256 digits, "
                   f"got {_show(v)}")
    return v.lower()


def _show(v: Any) -> str:
    try:
        text = json.dumps(v) if not isinstance(v, float) or math.isfinite(v) else repr(v)
    except (ValueError, RecursionError):
        text = type(v).__name__
    return text if len(text) <= 40 else text[:37] + "..."


def _mooncake(obj: Any) -> Request:
    d = _obj(obj)
    ts = _number(d, "timestamp")
    tokens = _int(d, "input_length")
    if "output_length" in d:
        _int(d, "output_length")
    ids = _list(d, "hash_ids")
    for j, h in enumerate(ids):
        if isinstance(h, bool) or not isinstance(h, int) or h < 0:
            raise _Bad(f"hash_ids[{j}] must be an integer >= 0, got {_show(h)}")
    return Request(ts / 1000.0, tokens, tuple(ids), MOONCAKE_BLOCK_TOKENS, "get")


def _accesslog(obj: Any) -> Request:
    d = _obj(obj)
    ts = _number(d, "t")
    op = d.get("op")
    if op not in ("get", "put"):
        raise _Bad(f"'op' must be \"get\" or \"put\", got {_show(op)}")
    _hex(d.get("model"), "'model'")
    tokens = _int(d, "tokens")
    chunk_tokens = _int(d, "chunk_tokens", default=ACCESSLOG_CHUNK_TOKENS, minimum=1,
                        maximum=MAX_CHUNK_TOKENS)
    chunks = _list(d, "chunks")
    keys = tuple(_hex(c, f"chunks[{j}]") for j, c in enumerate(chunks))
    return Request(ts, tokens, keys, chunk_tokens, op)


_PARSERS: dict[str, Callable[[Any], Request]] = {"mooncake": _mooncake, "accesslog": _accesslog}


def read_trace(path: str | os.PathLike[str], fmt: str = "mooncake", limit: int | None = None
               ) -> Iterator[Request]:
    """The requests of a trace file, lazily; at most ``limit`` of them."""
    parse = _PARSERS.get(fmt)
    if parse is None:
        raise InputError(f"unknown trace format {fmt!r} (known: {', '.join(FORMATS)})")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)
                              or limit < 0):
        raise InputError(f"limit must be an integer >= 0, got {limit!r}")
    return _read(path, parse, limit, fmt)


def _read(path: str | os.PathLike[str], parse: Callable[[Any], Request], limit: int | None,
          fmt: str) -> Iterator[Request]:
    if limit == 0:
        return
    for n, (lineno, obj) in enumerate(_lines(path, f"{fmt} trace"), 1):
        try:
            req = parse(obj)
        except _Bad as exc:
            raise InputError(f"{path}:{lineno}: {exc}") from None
        yield req
        if limit is not None and n >= limit:
            return

