"""A bare install (no torch) answers a command that needs torch with a typed error that says
``pip install 'rkv[torch]'``: torch is made unimportable in a subprocess
(``sys.modules['torch'] = None``), so the test runs where torch is installed too."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rkv.errors import MissingDependencyError, RkvError
from rkv.extras import require

REPO = Path(__file__).resolve().parent.parent


def test_require_names_the_extra() -> None:
    with pytest.raises(MissingDependencyError,
                       match=r"the thing needs rkv_no_such_pkg, which is not installed: "
                             r"pip install 'rkv\[extra\]'"):
        require("rkv_no_such_pkg.sub", "extra", "the thing")
    assert issubclass(MissingDependencyError, RkvError)
    assert issubclass(MissingDependencyError, ImportError)   # old `except ImportError` holds


def test_require_returns_the_module() -> None:
    import json

    assert require("json", "none", "x") is json


def _without_torch(code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", "import sys; sys.modules['torch'] = None\n"
                           + code], capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.parametrize("code", [
    "from rkv.eval.quality import load_smollm2; load_smollm2()",
    "import numpy as np; from rkv.moe.model import _tensor; _tensor(np.zeros(2), None)",
])
def test_torch_entry_points_without_torch(code: str) -> None:
    wrapped = ("from rkv.errors import MissingDependencyError\n"
               f"try:\n    {code}\nexcept MissingDependencyError as e:\n    print('TYPED', e)\n")
    r = _without_torch(wrapped)
    assert r.returncode == 0, r.stderr
    assert "TYPED" in r.stdout and "pip install 'rkv[torch]'" in r.stdout, r.stdout


def test_the_cli_says_it_in_one_line() -> None:
    r = _without_torch("from rkv.cli import main; sys.exit(main(['moe', 'run', '--tokens', "
                       "'4']))")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, r.stderr
    # (a progress line may come first); the error is one line, no traceback
    assert lines[-1].startswith("rkv: error: ") and "pip install 'rkv[torch]'" in lines[-1]
    assert "Traceback" not in r.stderr, r.stderr
