"""The text quality windows are cut from: Python's ``pydoc_data.topics`` (the text rkv's
quality docs use) and rkv's own documentation, written after SmolLM2 was trained, so text the
model cannot have seen. Windows are spread evenly over each source."""

from __future__ import annotations

from functools import cache
from typing import Any

from rkv.errors import ConfigError, InputError

#: rkv docs used as unseen text: the fault models, the record format and the codes (long,
#: technical, and rarely edited, so the text digest of a sweep changes rarely).
DOCS = ("faultmodels/*.md", "format.md", "ecc.md")


@cache
def source_text(name: str) -> str:
    """The whole text of source ``topics`` or ``docs``."""
    if name == "topics":
        from pydoc_data.topics import topics

        return "\n\n".join(topics[k] for k in sorted(topics))
    if name == "docs":
        from rkv.eval.calibrate_measure import docs_dir

        d = docs_dir()
        files = sorted({p for pat in DOCS for p in d.glob(pat)})
        if not files:
            raise ConfigError(f"quality.text 'docs' needs rkv's docs/ next to the package "
                              f"(looked in {d}); use text = [\"topics\"]")
        return "\n\n".join(p.read_text(encoding="utf-8") for p in files)
    raise ConfigError(f"quality.text: unknown source {name!r} (topics, docs)")


def windows(tokenizer: Any, sources: list[str], n: int, length: int) -> list[list[int]]:
    """``n`` disjoint windows of ``length`` tokens from each source, evenly spaced."""
    out: list[list[int]] = []
    for name in sources:
        ids = tokenizer(source_text(name)[: 40 * length * (n + 1)]).input_ids
        if len(ids) < n * length:
            raise InputError(f"text {name!r} has {len(ids)} tokens, fewer than {n} windows of "
                             f"{length}")
        step = len(ids) // n
        out.extend(list(ids[i * step:i * step + length]) for i in range(n))
    return out
