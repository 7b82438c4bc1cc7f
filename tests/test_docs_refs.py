"""Every docs path the code and the docs name exists: help texts, docstrings and error
messages in ``rkv/``, ``faultmodels/`` and ``policies/`` (``docs/replay.md`` once named a file
that was never written), README.md and docs/*.md (their ``docs/...`` paths and relative
Markdown links). And docs/tiers.md's table of default tiers is the code's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rkv.store.config import default_tiers
from rkv.ui.sizes import human_bytes

REPO = Path(__file__).resolve().parent.parent
#: ``docs/x.md``, ``docs/faultmodels/nvme.md``, ``docs/img/a.png``, ``docs/faultmodels/``.
DOCS_PATH = re.compile(r"(?<![\w/.-])docs/(?:[\w.-]+/)*(?:[\w-]+\.\w+|[\w-]+/)")
LINK = re.compile(r"\]\(([^)#:\s]+)(?:#[^)]*)?\)")
SOURCES = sorted(p for d in ("rkv", "faultmodels", "policies") for p in (REPO / d).rglob("*.py"))
MARKDOWN = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def references(text: str) -> set[str]:
    """The ``docs/...`` paths ``text`` names (a trailing sentence dot is not part of one)."""
    return {m.rstrip(".") for m in DOCS_PATH.findall(text)}


def test_the_pattern_finds_paths_and_folders() -> None:
    text = ("see docs/tiers.md, docs/faultmodels/nvme.md and the docs/faultmodels/ folder; "
            "(docs/img/moe.png). Not mydocs/x.md.")
    assert references(text) == {"docs/tiers.md", "docs/faultmodels/nvme.md",
                                "docs/faultmodels/", "docs/img/moe.png"}


def test_a_missing_file_is_caught() -> None:
    missing = [r for r in references("help (docs/replay-missing.md)")
               if not (REPO / r).exists()]
    assert missing == ["docs/replay-missing.md"]


@pytest.mark.parametrize("path", [*SOURCES, *MARKDOWN], ids=lambda p: str(p.relative_to(REPO)))
def test_named_docs_exist(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    missing = sorted(r for r in references(text) if not (REPO / r).exists())
    assert not missing, f"{path.relative_to(REPO)} names {missing}, which do not exist"


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    missing = sorted(link for link in LINK.findall(text)
                     if not link.startswith(("http", "mailto"))
                     and not (path.parent / link).exists())
    assert not missing, f"{path.relative_to(REPO)} links to {missing}, which do not exist"


def test_tiers_doc_table_is_the_default_tiers() -> None:
    text = (REPO / "docs" / "tiers.md").read_text(encoding="utf-8")
    for t in default_tiers():
        row = (f"| `{t.name}` | {t.medium} | {human_bytes(t.capacity_bytes)} | "
               f"{t.read_gbps:g} | {t.write_gbps:g} | {t.latency_us:g} | `{t.fault_model}` | "
               f"`{t.ecc}` | `{t.quant}` | `{t.policy}` |")
        assert row in text, row
