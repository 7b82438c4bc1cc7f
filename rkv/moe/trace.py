"""Routing traces of a MoE model: JSON Lines, validated on read.

Line 1 is the header::

    {"format": "rkv-moe-trace", "version": 1, "model": "<name>", "fingerprint": "<hex>",
     "layers": L, "experts": E, "top_k": k, "expert_bytes": <bytes of one expert at fp16>}

then one line per token, ``t`` counting 0, 1, 2, ... in line order::

    {"t": 0, "layers": [[e, ...], ...], "scores": [[s, ...], ...], "hints": [[e, ...], ...]}

``layers`` holds one list per layer of the token's ``k`` distinct chosen experts (ids in
``0..E-1``, by descending router score); ``scores`` (optional) the router scores of those
experts, same shape, finite; ``hints`` (optional) one list per layer of the distinct experts
the model's speculative router predicted for that layer before its router ran (issued during
the previous layer; any number of ids, ``[]`` when none, e.g. for layer 0).

Unknown keys, duplicate keys, booleans for numbers, NaN or infinity, blank lines and bad
UTF-8 are errors, and so are a header beyond :data:`MAX_LAYERS` layers, :data:`MAX_EXPERTS`
experts per layer or :data:`MAX_EXPERT_BYTES` bytes per expert, a line over
:data:`rkv.inputs.MAX_LINE_BYTES`, and a path that is not a regular file (``/dev/zero``, a
FIFO). :func:`read_moe_trace` raises
:class:`~rkv.errors.InputError` naming the file and line for any problem (nothing else
escapes, I/O errors included); :class:`MoETraceWriter` validates what it writes.
"""

from __future__ import annotations

import json
import math
import os
import uuid
from collections.abc import Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from rkv.errors import InputError
from rkv.specs import strict_json

FORMAT = "rkv-moe-trace"
VERSION = 1
HEADER_KEYS = ("format", "version", "model", "fingerprint", "layers", "experts", "top_k",
               "expert_bytes")
#: Header maxima: far above any MoE model (DeepSeek-V3: 61 layers of 256 experts; a
#: million-expert PEER layer is 2^20), low enough that what a reader sizes by them stays small.
MAX_LAYERS = 1 << 12
MAX_EXPERTS = 1 << 20
MAX_EXPERT_BYTES = 1 << 40


@dataclass(frozen=True)
class TraceHeader:
    model: str
    fingerprint: str
    layers: int
    experts: int
    top_k: int
    expert_bytes: int

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "model": self.model,
                "fingerprint": self.fingerprint, "layers": self.layers,
                "experts": self.experts, "top_k": self.top_k,
                "expert_bytes": self.expert_bytes}


@dataclass(frozen=True)
class TokenRoute:
    """One token's routing: ``layers[l]`` its chosen experts in layer ``l``."""

    t: int
    layers: tuple[tuple[int, ...], ...]
    scores: tuple[tuple[float, ...], ...] | None = None
    hints: tuple[tuple[int, ...], ...] | None = None


# -- validation --------------------------------------------------------------------------
def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _parse(line: str) -> Any:
    return strict_json(line)


def header_from_json(obj: Any) -> TraceHeader:
    """A :class:`TraceHeader` from the header object, or ValueError saying what is wrong."""
    if not isinstance(obj, dict):
        raise ValueError("the header is not a JSON object")
    missing = [k for k in HEADER_KEYS if k not in obj]
    extra = sorted(set(obj) - set(HEADER_KEYS))
    if missing or extra:
        raise ValueError(f"header keys: missing {missing}, unknown {extra}")
    if obj["format"] != FORMAT:
        raise ValueError(f"format is {obj['format']!r}, not {FORMAT!r}")
    if not _int(obj["version"]) or obj["version"] != VERSION:
        raise ValueError(f"version {obj['version']!r} is not supported (only {VERSION})")
    if not isinstance(obj["model"], str) or not obj["model"]:
        raise ValueError("model must be a non-empty string")
    fp = obj["fingerprint"]
    if not isinstance(fp, str) or not fp or any(c not in "0123456789abcdef" for c in fp):
        raise ValueError("fingerprint must be lowercase hex")
    for k, hi in (("layers", MAX_LAYERS), ("experts", MAX_EXPERTS), ("top_k", MAX_EXPERTS),
                  ("expert_bytes", MAX_EXPERT_BYTES)):
        if not _int(obj[k]) or not 1 <= obj[k] <= hi:
            raise ValueError(f"{k} must be an integer in [1, {hi}], got {_short(obj[k])}")
    if obj["top_k"] > obj["experts"]:
        raise ValueError(f"top_k {obj['top_k']} exceeds experts {obj['experts']}")
    return TraceHeader(obj["model"], fp, obj["layers"], obj["experts"], obj["top_k"],
                       obj["expert_bytes"])


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def route_from_json(obj: Any, h: TraceHeader, t: int) -> TokenRoute:
    """A :class:`TokenRoute` (the ``t``-th token) from a token object, or ValueError."""
    if not isinstance(obj, dict):
        raise ValueError("a token line is not a JSON object")
    extra = sorted(set(obj) - {"t", "layers", "scores", "hints"})
    if extra or "t" not in obj or "layers" not in obj:
        raise ValueError(f"token keys must be t, layers[, scores][, hints], got {sorted(obj)}")
    if not _int(obj["t"]) or obj["t"] != t:
        raise ValueError(f"t is {obj['t']!r}, expected {t}")
    layers = _ids(_rows(obj["layers"], h, "layers"), h, "layers")
    hints = None
    if "hints" in obj:
        hints = _ids(_rows(obj["hints"], h, "hints", exact=False), h, "hints")
    scores = None
    if "scores" in obj:
        scores = _rows(obj["scores"], h, "scores")
        for i, row in enumerate(scores):
            if not all(isinstance(s, int | float) and not isinstance(s, bool)
                       and math.isfinite(s) for s in row):
                raise ValueError(f"scores of layer {i} must be finite numbers")
        scores = tuple(tuple(float(s) for s in row) for row in scores)
    return TokenRoute(t, layers, scores, hints)


def _ids(rows: tuple[tuple[Any, ...], ...], h: TraceHeader, name: str
         ) -> tuple[tuple[int, ...], ...]:
    for i, row in enumerate(rows):
        if not all(_int(e) for e in row):
            raise ValueError(f"{name} of layer {i}: expert ids must be integers")
        bad = [e for e in row if not 0 <= e < h.experts]
        if bad:
            raise ValueError(f"{name} of layer {i}: expert ids {bad} out of range "
                             f"0..{h.experts - 1}")
        if len(set(row)) != len(row):
            raise ValueError(f"{name} of layer {i}: repeated expert ids {list(row)}")
    return tuple(tuple(int(e) for e in row) for row in rows)


def _rows(v: Any, h: TraceHeader, name: str, exact: bool = True
          ) -> tuple[tuple[Any, ...], ...]:
    if not isinstance(v, list) or len(v) != h.layers:
        n = len(v) if isinstance(v, list) else type(v).__name__
        raise ValueError(f"{name} must be a list of {h.layers} lists (one per layer), got {n}")
    for i, row in enumerate(v):
        if not isinstance(row, list):
            raise ValueError(f"{name} of layer {i} must be a list, got {type(row).__name__}")
        if exact and len(row) != h.top_k:
            raise ValueError(f"{name} of layer {i} must list {h.top_k} entries, got "
                             f"{len(row)}")
    return tuple(tuple(row) for row in v)


# -- reading -----------------------------------------------------------------------------
def _lines(path: Path) -> Generator[tuple[int, str], None, None]:
    """(line number, text without the newline); InputError for I/O and UTF-8 errors, lines
    over MAX_LINE_BYTES, and a path that is not a regular file."""
    from rkv.inputs import MAX_LINE_BYTES, open_regular

    f = open_regular(path, "MoE trace", error=InputError)
    with f:
        n = 0
        while True:
            n += 1
            try:
                raw = f.readline(MAX_LINE_BYTES + 1)
            except OSError as exc:
                raise InputError(f"{path}:{n}: read error: {exc}") from exc
            if not raw:
                return
            if len(raw) > MAX_LINE_BYTES:
                raise InputError(f"{path}:{n}: line longer than {MAX_LINE_BYTES >> 20} MiB")
            try:
                text = raw.decode("utf-8", errors="strict")
            except UnicodeDecodeError as exc:
                raise InputError(f"{path}:{n}: not UTF-8 ({exc.reason})") from exc
            yield n, text[:-1] if text.endswith("\n") else text


def _obj(path: Path, n: int, line: str) -> Any:
    if not line.strip():
        raise InputError(f"{path}:{n}: blank line")
    try:
        return _parse(line)
    except (ValueError, RecursionError) as exc:
        raise InputError(f"{path}:{n}: not valid JSON: {exc}") from exc


def read_moe_trace(path: str | Path) -> tuple[TraceHeader, Iterator[TokenRoute]]:
    """The header (read and checked now) and an iterator over the token routes (each line
    checked as it is read). Any problem is an InputError naming the file and line."""
    p = Path(path)
    lines = _lines(p)
    try:
        n, first = next(lines)
    except StopIteration:
        raise InputError(f"{p}: empty MoE trace (no header line)") from None
    try:
        header = header_from_json(_obj(p, n, first))
    except ValueError as exc:
        lines.close()
        if isinstance(exc, InputError):
            raise
        raise InputError(f"{p}:{n}: bad MoE trace header: {exc}") from exc

    def routes() -> Iterator[TokenRoute]:
        try:
            for t, (num, text) in enumerate(lines):
                try:
                    yield route_from_json(_obj(p, num, text), header, t)
                except InputError:
                    raise
                except (ValueError, TypeError, RecursionError) as exc:
                    raise InputError(f"{p}:{num}: bad token line: {exc}") from exc
        finally:
            lines.close()

    return header, routes()


# -- writing -----------------------------------------------------------------------------
class MoETraceWriter:
    """Write a trace atomically (temporary file, renamed on a clean close); every token is
    checked against the header as it is written. Use as a context manager."""

    def __init__(self, path: str | Path, header: TraceHeader | dict[str, Any]) -> None:
        try:
            self.header = header if isinstance(header, TraceHeader) else header_from_json(
                header)
        except ValueError as exc:
            raise InputError(f"bad MoE trace header: {exc}") from exc
        self.path = Path(path)
        self.t = 0
        self._tmp = self.path.with_name(f".{self.path.name}.{uuid.uuid4().hex[:12]}.tmp")
        try:   # "x": a new file with the umask's permissions
            self._f: IO[str] | None = open(self._tmp, "x", encoding="utf-8",  # noqa: SIM115
                                           newline="\n")
        except OSError as exc:
            raise InputError(f"{self.path}: cannot write MoE trace: {exc}") from exc
        self._emit(self.header.to_json())

    def _emit(self, obj: dict[str, Any]) -> None:
        assert self._f is not None
        self._f.write(json.dumps(obj, separators=(",", ":"), allow_nan=False) + "\n")

    def write(self, layers: Sequence[Sequence[int]],
              scores: Sequence[Sequence[float]] | None = None,
              hints: Sequence[Sequence[int]] | None = None) -> TokenRoute:
        """Append the next token (``t`` is assigned in order); InputError if invalid."""
        if self._f is None:
            raise InputError("the MoE trace writer is closed")
        obj: dict[str, Any] = {"t": self.t, "layers": [[int(e) for e in row]
                                                       for row in layers]}
        if scores is not None:
            obj["scores"] = [[float(s) for s in row] for row in scores]
        if hints is not None:
            obj["hints"] = [[int(e) for e in row] for row in hints]
        try:
            route = route_from_json(obj, self.header, self.t)
        except ValueError as exc:
            raise InputError(f"token {self.t}: {exc}") from exc
        self._emit(obj)
        self.t += 1
        return route

    def close(self) -> None:
        if self._f is None:
            return
        f, self._f = self._f, None
        f.close()
        os.replace(self._tmp, self.path)

    def abort(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None
        self._tmp.unlink(missing_ok=True)

    def __enter__(self) -> MoETraceWriter:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        if et is None:
            self.close()
        else:
            self.abort()


def write_moe_trace(path: str | Path, header: TraceHeader | dict[str, Any],
                    routes: Iterable[TokenRoute | Sequence[Sequence[int]]]) -> int:
    """Write a whole trace; returns the number of tokens."""
    with MoETraceWriter(path, header) as w:
        for r in routes:
            if isinstance(r, TokenRoute):
                w.write(r.layers, r.scores, r.hints)
            else:
                w.write(r)
        return w.t
