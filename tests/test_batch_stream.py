"""put_many / get_many against one call at a time, and layer streaming (Engine.get_layers)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rkvtest import SMALL, local_config, random_kv

from faultmodels import ErrorPattern
from rkv import Engine
from rkv.errors import ShapeError
from rkv.format.keys import as_token_array, block_key, chunk_keys
from rkv.store.results import MISSING, OK, UNCORRECTABLE
from rkv.store.streaming import Workers
from rkv.tiers.faulty import FaultyTier

CLOCK = 1_700_000_000_000_000_000


def _open(path: Path, **kw: Any) -> Engine:
    e = Engine.open(path, local_config(chunk_tokens=8, **kw))
    e.clock = lambda: CLOCK           # records carry the write time: make them comparable
    return e


def _contents(e: Engine) -> tuple[dict[bytes, Any], dict[str, dict[bytes, bytes]]]:
    """Index entries (access times aside) and every tier's records."""
    ix = e.core.index
    with ix.env.read() as txn:
        chunks = {k: None if m is None else m.with_(at=0) for k, m in ix.chunks(txn)}
    records = {}
    for name, tier in e.tiers.items():
        records[name] = {k: bytes(tier.get(k) or b"") for k in tier.iter_keys()}
    return chunks, records


def _seqs(draw: Any) -> list[tuple[list[int], np.ndarray]]:
    base = draw(st.lists(st.integers(0, 50), min_size=0, max_size=30))
    items = []
    for i in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["prefix", "fresh", "dup"]))
        if kind == "dup" and items:
            items.append(items[draw(st.integers(0, len(items) - 1))])
            continue
        cut = draw(st.integers(0, len(base)))
        tail = draw(st.lists(st.integers(0, 50), max_size=20))
        toks = (base[:cut] if kind == "prefix" else []) + tail
        items.append((toks, random_kv(SMALL, len(toks), seed=i)))
    return items


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_put_many_equals_puts_one_at_a_time(tmp_path_factory: Any, data: Any) -> None:
    items = _seqs(data.draw)
    a, b = tmp_path_factory.mktemp("a"), tmp_path_factory.mktemp("b")
    with _open(a / "s") as one, _open(b / "s") as many:
        singles = [one.put(t, kv, model=SMALL) for t, kv in items]
        batched = many.put_many(items, model=SMALL)
        assert batched == singles
        assert _contents(one) == _contents(many)
        for t, _ in items:     # (a later item's chunks already stored keep the first KV)
            got, want = many.get(t, model=SMALL), one.get(t, model=SMALL)
            assert got.ok and got.n_tokens == len(t) and np.array_equal(got.kv, want.kv)
        assert many.core.counters["puts"] == len(items)


def test_put_many_validates_everything_before_writing(tmp_path: Path) -> None:
    with _open(tmp_path / "s") as e:
        good = (list(range(16)), random_kv(SMALL, 16))
        with pytest.raises(ShapeError):
            e.put_many([good, (list(range(16)), random_kv(SMALL, 15))], model=SMALL)
        assert e.lookup(good[0], model=SMALL) == 0
        assert e.put_many([], model=SMALL) == []


def test_get_many_equals_gets_and_fills_buffers(tmp_path: Path) -> None:
    seqs = [list(range(40)), list(range(20)) + [99] * 9, list(range(100, 117)), [7, 7, 7]]
    with _open(tmp_path / "s") as e:
        for i, t in enumerate(seqs[:3]):
            e.put(t, random_kv(SMALL, len(t), seed=i), model=SMALL)
        asked = [*seqs, list(range(33))]
        singles = [e.get(t, model=SMALL) for t in asked]
        many = e.get_many(asked, model=SMALL)
        for s, m in zip(singles, many, strict=True):
            assert (m.n_tokens, m.stored_tokens, m.counts) == (s.n_tokens, s.stored_tokens,
                                                                s.counts)
            assert m.blocks == s.blocks and np.array_equal(m.kv, s.kv)
        bufs: list[np.ndarray | None] = [np.zeros((3, 2, len(t) + 5, 2, 4), np.float16)
                                          for t in asked]
        bufs[1] = None
        into = e.get_many(asked, model=SMALL, out=bufs)
        for s, m, buf in zip(singles, into, bufs, strict=True):
            assert np.array_equal(m.kv, s.kv)
            if buf is not None:
                assert np.shares_memory(m.kv, buf) or m.n_tokens == 0
        with pytest.raises(ShapeError):
            e.get_many(asked, model=SMALL, out=bufs[:2])


@pytest.mark.parametrize("bad", [
    np.zeros((3, 2, 40, 2, 4), np.float32),          # dtype
    np.zeros((3, 2, 10, 2, 4), np.float16),          # too short
    np.zeros((2, 2, 40, 2, 4), np.float16),          # layers
    np.zeros((3, 2, 40, 4, 2), np.float16),          # heads / dim
])
def test_wrong_out_is_a_shape_error(tmp_path: Path, bad: np.ndarray) -> None:
    t = list(range(40))
    with _open(tmp_path / "s") as e:
        e.put(t, random_kv(SMALL, 40), model=SMALL)
        for call in (lambda: e.get(t, model=SMALL, out=bad),
                     lambda: e.get_many([t], model=SMALL, out=[bad]),
                     lambda: e.get_layers(t, model=SMALL, out=bad)):
            with pytest.raises(ShapeError):
                call()
        assert not e.core.decisions.inflight


def _layers_equal_get(e: Engine, t: list[int]) -> None:
    full = e.get(t, model=SMALL)
    stream = e.get_layers(t, model=SMALL)
    got = list(stream)
    assert [x.layer for x in got] == list(range(SMALL.n_layers))
    n = stream.n_tokens
    assert n == full.n_tokens and stream.stored_tokens == full.stored_tokens
    for x in got:
        assert x.n_tokens >= n
        assert np.array_equal(x.kv[:, :n], full.kv[x.layer])
    if full.ok:
        assert sorted(stream.blocks, key=lambda b: (b.chunk, b.layer)) == sorted(
            full.blocks, key=lambda b: (b.chunk, b.layer))


def test_get_layers_yields_get_layer_by_layer(tmp_path: Path) -> None:
    t = list(range(50))
    kv = random_kv(SMALL, 50)
    with _open(tmp_path / "s") as e:
        e.put(t, kv, model=SMALL)
        _layers_equal_get(e, t)
        _layers_equal_get(e, [*t, 1, 2, 3])          # longer than stored
        _layers_equal_get(e, [9] * 20)               # nothing stored
        buf = np.zeros((3, 2, 64, 2, 4), np.float16)
        for x in e.get_layers(t, model=SMALL, out=buf):
            assert np.shares_memory(x.kv, buf) and np.array_equal(x.kv, kv[x.layer])
        assert not e.core.decisions.inflight
        assert e.core.counters["gets"] == 7


def test_get_layers_cuts_the_prefix_at_an_uncorrectable_block(tmp_path: Path) -> None:
    t = list(range(48))
    kv = random_kv(SMALL, 48)
    with _open(tmp_path / "s") as e:
        e.put(t, kv, model=SMALL)
        faulty = e.wrap_tier("dram", lambda tier: FaultyTier(tier))
        assert isinstance(faulty, FaultyTier)
        keys = chunk_keys(as_token_array(t), SMALL.fingerprint(), 8)
        bkey = block_key(keys[3], 1)                 # layer 1 of chunk 3
        n = len(faulty.get(bkey) or b"")
        faulty.inject(bkey, ErrorPattern(n, np.array([8 * (n - 200)], dtype=np.int64)))
        full = e.get(t, model=SMALL)
        assert full.n_tokens == 24 and full.counts[UNCORRECTABLE] == 1
        stream = e.get_layers(t, model=SMALL)
        got = list(stream)
        assert [x.n_tokens for x in got] == [48, 24, 24]
        assert stream.n_tokens == 24 and not stream.ok
        bad = [b for b in stream.blocks if b.status != OK]
        assert [(b.chunk, b.layer, b.status) for b in bad] == [(3, 1, UNCORRECTABLE)]
        assert len(got[2].blocks) == 3               # layer 2 reads only the verified chunks
        for x in got:
            assert np.array_equal(x.kv[:, :24], full.kv[x.layer])


def test_get_layers_reads_its_snapshot_through_a_concurrent_delete(tmp_path: Path) -> None:
    t = list(range(40))
    kv = random_kv(SMALL, 40)
    with _open(tmp_path / "s") as e:
        e.put(t, kv, model=SMALL)
        reached, proceed = threading.Event(), threading.Event()
        calls = []

        def hook() -> None:          # before each layer; hold the stream before layer 1
            calls.append(1)
            if len(calls) == 2:
                reached.set()
                assert proceed.wait(30)

        e.hooks["stream_layer"] = hook
        stream = e.get_layers(t, model=SMALL, ahead=1)
        first = next(stream)
        assert reached.wait(30)
        assert e.delete(t, model=SMALL) == 5          # the records are deleted now
        assert e.lookup(t, model=SMALL) == 0
        proceed.set()
        rest = list(stream)
        del e.hooks["stream_layer"]
        assert stream.n_tokens == 40 and stream.ok    # the stream's snapshot had them all
        for x in [first, *rest]:
            assert np.array_equal(x.kv, kv[x.layer])
        assert e.get(t, model=SMALL).n_tokens == 0


def test_get_layers_reports_a_missing_record(tmp_path: Path) -> None:
    """A record gone from its tier (still indexed) cuts the prefix like a DUE."""
    t = list(range(40))
    kv = random_kv(SMALL, 40)
    with _open(tmp_path / "s") as e:
        e.put(t, kv, model=SMALL)
        keys = chunk_keys(as_token_array(t), SMALL.fingerprint(), 8)
        faulty = e.wrap_tier("dram", lambda tier: FaultyTier(tier))
        assert isinstance(faulty, FaultyTier)
        faulty.lost.add(block_key(keys[2], 0))       # gone from the tier, still indexed
        stream = e.get_layers(t, model=SMALL)
        got = list(stream)
        assert stream.n_tokens == 16 and [x.n_tokens for x in got] == [16, 16, 16]
        assert [b.status for b in stream.blocks if b.status != OK] == [MISSING]


def test_closing_a_stream_early_stops_its_thread(tmp_path: Path) -> None:
    t = list(range(40))
    with _open(tmp_path / "s") as e:
        e.put(t, random_kv(SMALL, 40), model=SMALL)
        before = threading.active_count()
        stream = e.get_layers(t, model=SMALL, ahead=1)
        next(stream)
        stream.close()
        assert stream._p.done is not None and stream._p.done.is_set()
        assert threading.active_count() <= before + 1      # the engine keeps one thread
        assert not e.core.decisions.inflight
        with pytest.raises(StopIteration):
            next(stream)
        with e.get_layers(t, model=SMALL) as s2:
            for x in s2:
                assert x.layer == 0
                break
        assert s2._p.done is not None and s2._p.done.is_set() and not e.core.decisions.inflight
        assert threading.active_count() <= before + 1


def test_layer_zero_is_read_by_the_caller_and_the_rest_in_the_background(
        tmp_path: Path) -> None:
    """get_layers returns with layer 0 verified (no thread start or GIL hand-off on the way
    to the first layer); layers 1.. come from the stream's thread."""
    t = list(range(40))
    kv = random_kv(SMALL, 40)
    with _open(tmp_path / "s") as e:
        e.put(t, kv, model=SMALL)
        readers: list[str] = []
        e.hooks["stream_layer"] = lambda: readers.append(threading.current_thread().name)
        stream = e.get_layers(t, model=SMALL)
        assert readers[:1] == [threading.current_thread().name]
        got = list(stream)
        del e.hooks["stream_layer"]
        assert readers[1:] == ["rkv-layers"] * (SMALL.n_layers - 1)
        assert [x.layer for x in got] == list(range(SMALL.n_layers)) and stream.ok
        for x in got:
            assert np.array_equal(x.kv, kv[x.layer])


def test_a_failure_reading_layer_zero_releases_the_chunks(tmp_path: Path) -> None:
    t = list(range(40))
    with _open(tmp_path / "s") as e:
        e.put(t, random_kv(SMALL, 40), model=SMALL)

        def hook() -> None:
            raise OSError("medium gone")

        e.hooks["stream_layer"] = hook
        before = threading.active_count()
        with pytest.raises(OSError, match="medium gone"):
            e.get_layers(t, model=SMALL)
        del e.hooks["stream_layer"]
        assert not e.core.decisions.inflight and threading.active_count() == before
        assert e.get(t, model=SMALL).n_tokens == 40


def test_stream_threads_are_reused_and_end_when_idle_or_closed() -> None:
    ran: list[threading.Thread] = []

    def job() -> None:
        ran.append(threading.current_thread())

    workers = Workers(idle_s=0.05)
    assert workers.run(job).wait(10)
    assert workers.run(job).wait(10)          # the first thread was idle again when its job ended
    assert len(ran) == 2 and ran[0] is ran[1] and ran[0].name == "rkv-layers"
    ran[0].join(10)                    # idle past idle_s: it ends
    assert not ran[0].is_alive()
    assert workers.run(job).wait(10)          # a new thread after that
    assert ran[2] is not ran[0]
    kept = Workers(idle_s=60)
    assert kept.run(job).wait(10)
    kept.close()                       # ends the idle ones
    ran[3].join(10)
    assert not ran[3].is_alive()

    def boom() -> None:
        ran.append(threading.current_thread())
        raise RuntimeError("a job that raises")

    hooks, threading.excepthook = threading.excepthook, lambda args: None
    try:
        assert workers.run(boom).wait(10)     # its thread ends instead of idling on
        ran[4].join(10)
        assert not ran[4].is_alive()
        assert workers.run(job).wait(10)      # and the next job gets a live thread
        assert ran[5] is not ran[4]
    finally:
        threading.excepthook = hooks


def test_engine_close_ends_its_stream_threads(tmp_path: Path) -> None:
    t = list(range(40))
    with _open(tmp_path / "s") as e:
        e.put(t, random_kv(SMALL, 40), model=SMALL)
        readers: list[threading.Thread] = []
        e.hooks["stream_layer"] = lambda: readers.append(threading.current_thread())
        assert len(list(e.get_layers(t, model=SMALL))) == SMALL.n_layers
        assert len(list(e.get_layers(t, model=SMALL))) == SMALL.n_layers
        worker = readers[1]
        assert worker.name == "rkv-layers" and readers[1 + SMALL.n_layers] is worker
    worker.join(10)
    assert not worker.is_alive()
