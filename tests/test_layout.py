"""The house rules of rkv's source layout, measured from the source itself.

Every import counts: at module level, inside functions and under ``TYPE_CHECKING``. The rules
(docs/layout.md): no import cycles; ``policies/`` and ``faultmodels/`` import nothing of rkv;
each layer imports only its own layer and those below it; at most 12 modules directly in
``rkv/``; click only under ``rkv/cli``; no module outside ``rkv/store/engine.py`` touches a
private member of :class:`~rkv.store.engine.Engine`; no module over 500 lines; ``import rkv``
and ``import rkv.cli`` load neither numpy nor the engine.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("rkv", "policies", "faultmodels")

#: rkv's layers, top first: a module may import its own layer and the layers below it.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("rkv", "rkv.cli"),
    ("rkv.adapters",),
    ("rkv.moe",),
    ("rkv.eval",),
    ("rkv.store",),
    ("rkv.placement",),
    ("rkv.reliability", "rkv.profiles"),
    ("rkv.codec",),
    ("rkv.ecc", "rkv.quant"),
    ("rkv.tiers", "rkv.format", "rkv.specs", "rkv.checks", "rkv.ui", "rkv.buffers",
     "rkv.inputs", "rkv.extras"),
    ("rkv.errors", "rkv.parallel"),
)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def sources() -> dict[str, tuple[Path, ast.Module]]:
    """Every module of the three packages: name -> (file, parsed source)."""
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            out[_module_name(path)] = (path, ast.parse(path.read_text(encoding="utf-8")))
    return out


def _known(name: str) -> str | None:
    """The longest prefix of ``name`` that is one of our modules (None: not ours)."""
    mods = sources()
    parts = name.split(".")
    while parts:
        if ".".join(parts) in mods:
            return ".".join(parts)
        parts.pop()
    return None


def imported(module: str) -> Iterator[tuple[int, str]]:
    """(line, module) for every import of one of our modules that ``module`` makes.

    ``from pkg import name`` imports the package ``pkg`` (its ``__init__`` runs) and, when
    ``name`` is a submodule, that submodule too."""
    path, tree = sources()[module]
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_pkg else module.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            names = [prefix] + [f"{prefix}.{a.name}" for a in node.names]
        for name in names:
            target = _known(name)
            if target is not None and target != module:
                yield node.lineno, target


@cache
def graph() -> dict[str, frozenset[str]]:
    return {m: frozenset(t for _, t in imported(m)) for m in sources()}


def cycles(g: dict[str, frozenset[str]]) -> list[list[str]]:
    """The strongly connected components of ``g`` with more than one module (Tarjan,
    iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(g):
        if root in index:
            continue
        work = [(root, iter(sorted(g[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(g[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
    return found


def layer_of(module: str) -> int | None:
    """Index into :data:`LAYERS` (0 is the top); None for policies and faultmodels."""
    if not module.startswith("rkv"):
        return None
    best: tuple[int, int] | None = None
    for i, group in enumerate(LAYERS):
        for prefix in group:
            inside = module == prefix or (prefix != "rkv" and module.startswith(prefix + "."))
            if inside and (best is None or len(prefix) > best[1]):
                best = (i, len(prefix))
    if best is None:
        raise AssertionError(f"{module} is in no layer: add its package to LAYERS")
    return best[0]


def test_no_import_cycles() -> None:
    assert cycles(graph()) == []


def test_policies_and_faultmodels_import_nothing_of_rkv() -> None:
    bad = [f"{m}:{line} -> {t}" for m in sources() if not m.startswith("rkv")
           for line, t in imported(m) if t.startswith("rkv")]
    assert bad == []


def test_every_import_goes_down_the_layers() -> None:
    bad = set()
    for m in sources():
        mine = layer_of(m)
        if mine is None:
            continue
        for line, t in imported(m):
            # The root package is every module's parent (its __init__ has run before any of
            # them); reading rkv.__version__ from it is no upward dependency. Cycles through
            # it are still counted by test_no_import_cycles.
            theirs = None if t == "rkv" else layer_of(t)
            if theirs is not None and theirs < mine:
                bad.add(f"{m}:{line} imports {t}, a layer above it")
    assert sorted(bad) == []


def test_at_most_twelve_modules_directly_in_rkv() -> None:
    top = [m for m, (p, _) in sources().items()
           if m.count(".") == 1 and m.startswith("rkv.") and p.name != "__init__.py"]
    assert len(top) <= 12, top


def test_click_only_in_the_cli_package() -> None:
    bad = []
    for m, (_, tree) in sources().items():
        if m == "rkv.cli" or m.startswith("rkv.cli."):
            continue
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n == "click" or n.startswith("click.") for n in names):
                bad.append(f"{m}:{node.lineno}")
    assert bad == []


def _engine_privates() -> set[str]:
    _, tree = sources()["rkv.store.engine"]
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Engine"]
    names = set()
    for node in ast.walk(cls):
        if isinstance(node, ast.FunctionDef) and node.name.startswith("_") \
                and not node.name.startswith("__"):
            names.add(node.name)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id == "self" and node.attr.startswith("_") \
                and not node.attr.startswith("__"):
            names.add(node.attr)
    return names


def test_no_module_reaches_into_the_engine() -> None:
    """Engine's private members are touched only in its own module. Every other module's
    ``x._name`` with ``_name`` one of them counts unless ``x`` is ``self``/``cls`` (their own
    member of the same name) - stricter than a guess at which variables hold an engine."""
    private = _engine_privates() - {"_lock", "_closed"}   # names every class may have
    assert private, "the Engine class was not found"
    bad = []
    for m, (_, tree) in sources().items():
        if m == "rkv.store.engine":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in private:
                owner = node.value
                if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                    continue
                bad.append(f"{m}:{node.lineno} .{node.attr}")
    assert bad == []


def test_no_module_over_500_lines() -> None:
    big = {m: n for m, (p, _) in sources().items()
           if (n := p.read_text(encoding="utf-8").count("\n") + 1) > 500}
    assert big == {}


@pytest.mark.parametrize("module", ["rkv", "rkv.cli"])
def test_import_loads_neither_numpy_nor_the_engine(module: str) -> None:
    code = (f"import sys, {module}; heavy = [m for m in sys.modules if m == 'numpy' or "
            "m.startswith('rkv.store')]; print(heavy)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=ROOT, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]"


def test_the_rules_see_what_they_guard() -> None:
    """The checks above would fail on a broken tree: the graph holds the engine's imports,
    a planted back edge makes a cycle, and the layers are ordered as drawn."""
    g = graph()
    assert {"rkv.store.core", "rkv.store.batch"} <= g["rkv.store.engine"]
    assert "rkv.errors" in g["rkv.store.core"]
    planted = {**g, "rkv.errors": g["rkv.errors"] | {"rkv.store.engine"}}
    (cycle,) = [c for c in cycles(planted) if "rkv.errors" in c]
    assert {"rkv.store.engine", "rkv.store.core"} <= set(cycle)
    order = [layer_of(m) for m in ("rkv.cli.store", "rkv.adapters.vllm",
                                   "rkv.eval.faults.campaign", "rkv.store.engine",
                                   "rkv.codec.pipeline", "rkv.errors")]
    assert order == sorted(order) and len(set(order)) == len(order)
    assert _engine_privates() >= {"_share", "_promotions"}
