"""The registry's shape: the built-in policies are registered, in one order, whichever module
of the package is imported first, and the package's modules import one another without a
cycle (counting imports inside functions; ``from policies import x`` counts the package)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import policies
from policies.registry import BUILTIN, register
from policies.table import REGISTERED

ORDER = ["arc", "fifo", "lfu", "gdsf", "lru", "prefix", "reuse", "adaptive", "s3fifo", "sieve",
         "slru", "activation"]
PACKAGE = Path(policies.__file__).parent


@pytest.mark.parametrize("stmt", ["import policies.lru", "import policies.table",
                                  "from policies.registry import register",
                                  "from policies import make_policy"])
def test_builtins_are_registered_in_order_whatever_is_imported_first(stmt: str) -> None:
    code = f"{stmt}\nfrom policies.table import REGISTERED\nprint(','.join(REGISTERED))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60).stdout.strip()
    assert out.split(",") == ORDER


def test_builtin_lists_the_registered_classes() -> None:
    assert [cls.name for cls in BUILTIN] == ORDER == list(REGISTERED)[:len(ORDER)]
    assert all(REGISTERED[cls.name] is cls for cls in BUILTIN)
    assert policies.register is register


def _imports(path: Path, mods: set[str]) -> set[str]:
    """The package modules ``path`` imports anywhere in it (a ``from a import b`` imports
    ``a`` and, when it is a module, ``a.b``)."""
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return {n for n in names if n in mods}


def test_the_package_has_no_import_cycle() -> None:
    files = {("policies" if p.stem == "__init__" else f"policies.{p.stem}"): p
             for p in PACKAGE.glob("*.py")}
    graph = {m: _imports(p, set(files)) - {m} for m, p in files.items()}
    done: set[str] = set()

    def visit(m: str, path: tuple[str, ...]) -> None:
        assert m not in path, f"import cycle: {' -> '.join((*path, m))}"
        if m in done:
            return
        for dep in sorted(graph[m]):
            visit(dep, (*path, m))
        done.add(m)

    for m in sorted(graph):
        visit(m, ())
