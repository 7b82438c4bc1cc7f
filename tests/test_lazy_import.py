"""`import rkv` and `import rkv.cli` load neither numpy nor the engine (the public names
load on first use), and the lazy names are the real objects."""

from __future__ import annotations

import subprocess
import sys

import pytest

import rkv

HEAVY = ("numpy", "numba", "llvmlite", "lmdb", "rkv.store.engine")


@pytest.mark.parametrize("stmt", ["import rkv", "import rkv.cli", "from rkv import RkvError"])
def test_import_loads_nothing_heavy(stmt: str) -> None:
    code = f"{stmt}\nimport sys\nprint(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60).stdout.strip()
    assert out == "", f"{stmt} loaded {out}"


def test_lazy_names_are_the_real_objects() -> None:
    from rkv.store.config import EngineConfig
    from rkv.store.engine import Engine

    assert rkv.Engine is Engine and rkv.EngineConfig is EngineConfig
    assert set(rkv.__all__) <= set(dir(rkv))
    for name in rkv.__all__:
        assert getattr(rkv, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'Engin'"):
        _ = rkv.Engin  # type: ignore[attr-defined]
