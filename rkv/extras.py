"""Optional dependencies: import one, or raise a
:class:`~rkv.errors.MissingDependencyError` that says which extra brings it.

The bare install (``pip install rkv``) is the store; torch, transformers and the rest come
with extras (``rkv[torch]``, ``rkv[hf]``, ...; pyproject.toml). Code that needs one imports
it through :func:`require` (torch: :func:`require_torch`), so every such error reads alike.
"""

from __future__ import annotations

import importlib
from typing import Any

from rkv.errors import MissingDependencyError

__all__ = ["require", "require_torch"]


def require(module: str, extra: str, purpose: str) -> Any:
    """``module`` imported, or a MissingDependencyError: ``"<purpose> needs <top package>,
    which is not installed: pip install 'rkv[<extra>]'"``."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        top = module.split(".")[0]
        raise MissingDependencyError(
            f"{purpose} needs {top}, which is not installed: pip install 'rkv[{extra}]'"
        ) from exc


def require_torch(purpose: str = "this command") -> Any:
    """The ``torch`` module (``rkv[torch]``)."""
    return require("torch", "torch", purpose)
