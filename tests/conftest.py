from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "default", deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                     HealthCheck.function_scoped_fixture],
)
settings.register_profile("ci", parent=settings.get_profile("default"), max_examples=60)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def codec_pool4(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The codec pool at 4 threads with no size threshold (every batch goes to the pool),
    restored afterwards."""
    from rkv import parallel

    before = parallel._setting
    monkeypatch.setattr(parallel, "MIN_PARALLEL_BYTES", 0)
    parallel.configure(4)
    yield
    parallel.configure(before)
