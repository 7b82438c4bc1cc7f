"""docs/hf.md shows examples/hf_chat.py as it is (the example runs as a test; the copy in
the docs is skipped there, so it must not drift)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_hf_docs_show_the_chat_example_verbatim() -> None:
    doc = (REPO / "docs" / "hf.md").read_text(encoding="utf-8")
    code = (REPO / "examples" / "hf_chat.py").read_text(encoding="utf-8")
    assert "```python\n" + code + "```\n" in doc
