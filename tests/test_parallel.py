"""The codec thread pool (rkv.parallel): sizing, ordering, errors, no deadlock."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rkv import parallel
from rkv.errors import ConfigError
from rkv.store.config import EngineConfig


@pytest.fixture(autouse=True)
def _restore_pool() -> Iterator[None]:
    before = parallel._setting
    yield
    parallel.configure(before)


def test_default_size_is_the_cpus_available() -> None:
    assert parallel.configure(0) == parallel.available_cpus() == parallel.threads()
    assert parallel.configure(3) == 3 == parallel.threads()
    assert parallel.configure(1) == 1


@pytest.mark.parametrize("bad", [-1, True, 1.5, "2", None])
def test_bad_thread_counts(bad: object) -> None:
    with pytest.raises(ValueError):
        parallel.check_threads(bad)
    with pytest.raises(ValueError):
        parallel.configure(bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        EngineConfig(codec_threads=bad)  # type: ignore[arg-type]


def test_engine_config_setting() -> None:
    assert EngineConfig().codec_threads == 0
    cfg = EngineConfig(codec_threads=4)
    assert EngineConfig.from_dict(cfg.to_dict()).codec_threads == 4
    with pytest.raises(ConfigError):
        EngineConfig(codec_threads=5000)


def test_environment_sets_the_starting_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RKV_CODEC_THREADS", "3")
    assert parallel._from_env() == 3
    monkeypatch.setenv("RKV_CODEC_THREADS", "lots")
    assert parallel._from_env() == 0
    monkeypatch.setenv("RKV_CODEC_THREADS", "-2")
    assert parallel._from_env() == 0


def _slow_square(x: int) -> tuple[int, int]:
    time.sleep(0.005)             # releases the GIL, like the kernels
    return x * x, threading.get_ident()


def test_pmap_is_ordered_and_uses_the_pool() -> None:
    parallel.configure(2)
    out = parallel.pmap_strict(_slow_square, list(range(40)), nbytes=1 << 30)
    assert [r for r, _ in out] == [x * x for x in range(40)]
    assert len({t for _, t in out}) == 2       # the caller and one pool thread


def test_small_work_stays_inline() -> None:
    parallel.configure(4)
    me = threading.get_ident()
    out = parallel.pmap_strict(_slow_square, list(range(8)), nbytes=1000)
    assert {t for _, t in out} == {me}
    assert {t for _, t in parallel.pmap_strict(_slow_square, [3], nbytes=1 << 30)} == {me}


def _fail_on_odd(x: int) -> int:
    time.sleep(0.001)
    if x % 2:
        raise KeyError(x)
    return x


def test_first_failure_by_position_is_raised() -> None:
    parallel.configure(4)
    with pytest.raises(KeyError) as info:
        parallel.pmap(_fail_on_odd, list(range(2, 40)), nbytes=1 << 30)
    assert info.value.args == (3,)


def test_capture_keeps_every_outcome() -> None:
    parallel.configure(3)
    out = parallel.pmap(_fail_on_odd, list(range(20)), nbytes=1 << 30, capture=True)
    for x, r in enumerate(out):
        if x % 2:
            assert isinstance(r, KeyError) and r.args == (x,)
        else:
            assert r == x


def _nested(x: int) -> list[int]:
    assert parallel.in_pool_work()
    inner = parallel.pmap_strict(lambda y: y + x, list(range(5)), nbytes=1 << 30)
    return inner


def test_nested_calls_run_inline() -> None:
    parallel.configure(2)
    out = parallel.pmap_strict(_nested, list(range(10)), nbytes=1 << 30)
    assert out == [[y + x for y in range(5)] for x in range(10)]
    assert not parallel.in_pool_work()


def test_many_callers_at_once_do_not_deadlock() -> None:
    """More callers than pool threads, each mapping over the pool, with nested calls: the
    callers drain their own work, so all finish."""
    parallel.configure(2)
    results: dict[int, list[list[int]]] = {}

    def caller(c: int) -> None:
        results[c] = parallel.pmap_strict(_nested, list(range(c, c + 12)), nbytes=1 << 30)

    threads = [threading.Thread(target=caller, args=(c,)) for c in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    for c in range(8):
        assert results[c] == [[y + x for y in range(5)] for x in range(c, c + 12)]


def test_resizing_while_in_use() -> None:
    parallel.configure(2)
    stop = threading.Event()
    seen: list[list[tuple[int, int]]] = []

    def worker() -> None:
        while not stop.is_set():
            seen.append(parallel.pmap_strict(_slow_square, list(range(6)), nbytes=1 << 30))

    t = threading.Thread(target=worker)
    t.start()
    for n in (3, 1, 4, 2):
        parallel.configure(n)
        time.sleep(0.02)
    stop.set()
    t.join(timeout=60)
    assert not t.is_alive()
    assert all([r for r, _ in s] == [x * x for x in range(6)] for s in seen)


@given(st.integers(0, 5000), st.integers(1, 64))
def test_pieces_cover_the_range(n: int, parts: int) -> None:
    ps = parallel.pieces(n, parts)
    assert [i for a, b in ps for i in range(a, b)] == list(range(n))
    assert len(ps) == min(n, parts)
    if ps:
        sizes = [b - a for a, b in ps]
        assert max(sizes) - min(sizes) <= 1


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 3000), st.integers(1, 8), st.integers(1, 500))
def test_prange_visits_every_index_once(n: int, threads: int, piece: int) -> None:
    parallel.configure(threads)
    hits = [0] * n

    def run(a: int, z: int) -> None:
        for i in range(a, z):
            hits[i] += 1

    parallel.prange(run, n, n, piece)
    assert hits == [1] * n
