"""Bounded reads of the files and documents rkv is given: :mod:`faultmodels.files` bound to
rkv's errors, with rkv's size limits.

Every file a user names goes through here (engine and placement configs, ``RKV_CONFIG``,
sweep files, campaign configs, quality and expert profiles, model specs, texts, sweep
results), and so do the traces' line readers (:func:`open_regular`): a character device
(``/dev/zero``), a FIFO, a directory or an oversized file is a typed error at once, never an
endless read or a blocked ``open``. Documents are refused when nested deeper than
:data:`MAX_NESTING` before a recursive parser sees them. Configs raise
:class:`~rkv.errors.ConfigError` by default; inputs (traces, texts) pass ``error=InputError``.

Limits (each far above what rkv writes or ships, far below what would hurt):

* :data:`MAX_CONFIG_BYTES` 1 MiB: a TOML config (engine, placement, sweep, campaign, fault
  model); the shipped ones are under 2 KiB.
* :data:`MAX_DOC_BYTES` 4 MiB: a JSON document (quality or expert profile, model spec); the
  shipped profiles are under 20 KiB (a 1000-layer model's profile is about 200 KiB).
* :data:`MAX_TEXT_BYTES` 64 MiB: a text to tokenize (``rkv moe trace --text``).
* :data:`MAX_LINE_BYTES` 16 MiB: one line of a JSON Lines trace (a Mooncake request with
  a million hash ids is 8 MiB).
* :data:`MAX_RESULTS_BYTES` 1 GiB: a sweep's results file (read whole to resume or report).
* :data:`MAX_NESTING` 64 levels.
"""

from __future__ import annotations

import os
from typing import Any, BinaryIO

from faultmodels import files as _f
from rkv.errors import ConfigError

MAX_CONFIG_BYTES = 1 << 20
MAX_DOC_BYTES = 4 << 20
MAX_TEXT_BYTES = 64 << 20
MAX_LINE_BYTES = 16 << 20
MAX_RESULTS_BYTES = 1 << 30
MAX_NESTING = _f.MAX_NESTING

PathLike = str | os.PathLike[str]


def open_regular(path: PathLike, what: str, *, error: type[Exception] = ConfigError) -> BinaryIO:
    """``path`` opened for binary reading: a regular file, else ``error`` (never blocks)."""
    return _f.open_regular(path, what, error=error)


def read_bytes(path: PathLike, what: str, *, limit: int = MAX_CONFIG_BYTES,
               error: type[Exception] = ConfigError) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes, else ``error``."""
    return _f.read_bytes(path, what, limit=limit, error=error)


def read_text(path: PathLike, what: str, *, limit: int = MAX_CONFIG_BYTES,
              error: type[Exception] = ConfigError) -> str:
    """The UTF-8 text of a regular file of at most ``limit`` bytes, else ``error``."""
    return _f.read_text(path, what, limit=limit, error=error)


def check_nesting(text: str, what: str, *, syntax: str,
                  error: type[Exception] = ConfigError) -> None:
    """``error`` when ``text`` (``"json"`` or ``"toml"``) nests deeper than MAX_NESTING."""
    _f.check_nesting(text, what, syntax=syntax, error=error)


def load_toml(text: str, what: str, *, error: type[Exception] = ConfigError
              ) -> dict[str, Any]:
    """A TOML document as a dict (nesting checked first); bad TOML is ``error``."""
    return _f.load_toml(text, what, error=error)


def load_json(text: str | bytes, what: str, *, error: type[Exception] = ConfigError) -> Any:
    """A JSON document through :func:`rkv.specs.strict_json` (no NaN, no repeated keys,
    nesting checked); anything malformed is ``error`` naming ``what``."""
    from rkv.specs import strict_json

    try:
        return strict_json(text)
    except ValueError as exc:      # JSONDecodeError, UnicodeDecodeError, too deep
        raise error(f"{what}: not valid JSON: {exc}") from None


def read_toml(path: PathLike, what: str, *, error: type[Exception] = ConfigError
              ) -> dict[str, Any]:
    """A TOML file (at most MAX_CONFIG_BYTES) as a dict."""
    return load_toml(read_text(path, what, error=error), f"{what} {path}", error=error)


def read_json(path: PathLike, what: str, *, limit: int = MAX_DOC_BYTES,
              error: type[Exception] = ConfigError) -> Any:
    """A JSON file (at most ``limit`` bytes) through :func:`load_json`."""
    return load_json(read_bytes(path, what, limit=limit, error=error), f"{what} {path}",
                     error=error)


__all__ = ["MAX_CONFIG_BYTES", "MAX_DOC_BYTES", "MAX_LINE_BYTES", "MAX_NESTING",
           "MAX_RESULTS_BYTES", "MAX_TEXT_BYTES", "check_nesting", "load_json", "load_toml",
           "open_regular", "read_bytes", "read_json", "read_text", "read_toml"]
