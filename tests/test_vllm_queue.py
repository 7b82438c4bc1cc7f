"""vLLM's waiting queue announced to the store (rkv.adapters.vllm_queue), without a running
vLLM: the scheduler side's announcements and served ids, the worker side's prefetch holds on
a real engine (a held prefix survives the saves of the requests ahead of it; without the
announcement LRU evicts it), hold sizing from measured waits, settings and failures."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from rkvtest import SMALL, chunk_bytes, random_kv

from rkv import Engine, EngineConfig, TierConfig
from rkv.adapters.vllm_queue import FIRST_HOLD_S, MAX_HOLD_S, MIN_HOLD_S, QueueHolds, QueueWaits
from rkv.adapters.vllm_scheduler import SchedulerSide
from rkv.adapters.vllm_settings import ConnectorSettings
from rkv.adapters.vllm_stats import Counters
from rkv.errors import ConfigError

CHUNK = 16


def engine(path: Path, chunks: int) -> Engine:
    tier = TierConfig("dram", medium="memory", path="t/dram",
                      capacity_bytes=chunks * chunk_bytes(), policy="lru")
    return Engine.open(path, EngineConfig(chunk_tokens=CHUNK, promote="never", tiers=(tier,)))


def toks(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 50000, n).tolist()


def request(rid: str, prompt: list[int]) -> Any:
    return SimpleNamespace(request_id=rid, prompt_token_ids=prompt, all_token_ids=prompt)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def sides(e: Engine, **settings: Any) -> tuple[SchedulerSide, QueueHolds, Counters]:
    stats = Counters()
    cfg = ConnectorSettings(store=str(e.root), **settings)
    return SchedulerSide(e, SMALL, cfg, CHUNK, stats), QueueHolds(e, SMALL, stats), stats


def step(sched: SchedulerSide, holds: QueueHolds) -> None:
    """What one step's metadata carries to the worker, applied there."""
    announce, served = sched.take_queue()
    holds.announce(announce)
    holds.served(served)


def test_a_queued_prefix_survives_the_saves_ahead_of_it(tmp_path: Path) -> None:
    """Differential: the same puts evict the queued prefix without the announcement and
    keep it with one."""
    for announce in (False, True):
        with engine(tmp_path / f"s{announce}", 4) as e:
            sched, holds, stats = sides(e, announce_queue=announce)
            a = toks(2 * CHUNK, seed=0)
            e.put(a, random_kv(SMALL, len(a), seed=0), model=SMALL)
            sched.queued(request("a", [*a, 7, 8, 9]))     # a partial chunk is not announced
            step(sched, holds)
            for i in range(1, 4):                           # the requests ahead of it save
                t = toks(2 * CHUNK, seed=i)
                e.put(t, random_kv(SMALL, len(t), seed=i), model=SMALL)
            e.settle(30)
            assert e.lookup(a, model=SMALL) == (len(a) if announce else 0)
            sched.after_alloc(request("a", a), 0)           # scheduled: the hold is dropped
            step(sched, holds)
            assert not e.core.decisions.queued and holds.holding() == 0
            assert stats.get("queue_announced") == stats.get("queue_released") == int(announce)


def test_announced_and_scheduled_in_one_step_is_neither(tmp_path: Path) -> None:
    with engine(tmp_path / "s", 8) as e:
        sched, holds, stats = sides(e)
        a = toks(CHUNK, seed=1)
        sched.queued(request("a", a))
        sched.after_alloc(request("a", a), 0)
        assert sched.take_queue() == ([], [])
        assert stats.get("queued") == 1 and holds.holding() == 0


def test_a_request_that_leaves_unscheduled_is_released_and_not_measured(tmp_path: Path) -> None:
    with engine(tmp_path / "s", 8) as e:
        sched, holds, _ = sides(e)
        a = toks(CHUNK, seed=2)
        sched.queued(request("a", a))
        step(sched, holds)
        assert e.core.decisions.queued
        sched.finished(request("a", a))                     # aborted while waiting
        step(sched, holds)
        assert not e.core.decisions.queued
        assert sched.waits.waiting() == 0 and len(sched.waits._waits) == 0
        sched.finished(request("b", a))                     # never announced: nothing sent
        assert sched.take_queue() == ([], [])


def preempt_step(*preempted: str, resumed: tuple[str, ...] = ()) -> Any:
    """The fields of a ``SchedulerOutput`` that the preemption path reads."""
    return SimpleNamespace(preempted_req_ids=set(preempted), scheduled_new_reqs=[],
                           scheduled_cached_reqs=SimpleNamespace(resumed_req_ids=set(resumed)))


def test_a_preempted_request_is_announced_again_and_its_prefix_survives(tmp_path: Path
                                                                        ) -> None:
    """Differential: a running request that vLLM preempts waits again while the others
    save; without the re-announcement LRU evicts the prefix it will be recomputed from,
    with it the prefix (prompt and stored output) is held until vLLM resumes it."""
    for announce in (False, True):
        with engine(tmp_path / f"p{announce}", 4) as e:
            sched, holds, stats = sides(e, announce_queue=announce)
            a = toks(2 * CHUNK + 3, seed=10)
            sched.after_alloc(request("a", a), 0)            # scheduled at once: no hold
            e.put(a, random_kv(SMALL, len(a), seed=10), model=SMALL)
            step(sched, holds)
            sched.preempted(preempt_step("a", "gone"))      # "gone" is unknown: skipped
            step(sched, holds)
            assert holds.holding() == int(announce)
            for i in range(1, 4):                           # the running requests save
                t = toks(2 * CHUNK, seed=10 + i)
                e.put(t, random_kv(SMALL, len(t), seed=10 + i), model=SMALL)
            e.settle(30)
            assert e.lookup(a, model=SMALL) == (2 * CHUNK if announce else 0)
            sched.after_alloc(request("a", a), 0)           # resumed: the hold is dropped
            step(sched, holds)
            assert holds.holding() == 0 and not e.core.decisions.queued
            assert stats.get("preempted") == int(announce)
            assert stats.get("queue_released") == int(announce)


def test_a_preempted_request_resumed_in_the_same_step_is_not_announced(tmp_path: Path
                                                                       ) -> None:
    with engine(tmp_path / "s", 8) as e:
        sched, _, stats = sides(e)
        a = toks(CHUNK, seed=20)
        sched.after_alloc(request("a", a), 0)
        sched.preempted(preempt_step("a", resumed=("a",)))
        sched.preempted(SimpleNamespace())                  # an older vLLM: no such field
        assert sched.take_queue() == ([], []) and stats.get("preempted") == 0


def test_short_prompts_and_disabled_announcements_send_nothing(tmp_path: Path) -> None:
    with engine(tmp_path / "s", 8) as e:
        sched, _, _ = sides(e)
        sched.queued(request("a", toks(CHUNK - 1, seed=3)))
        sched.queued(request("b", []))
        assert sched.take_queue() == ([], [])
        off, _, _ = sides(e, announce_queue=False)
        off.queued(request("c", toks(CHUNK, seed=3)))
        assert off.take_queue() == ([], [])


def test_hold_length_follows_the_measured_waits() -> None:
    clock = Clock()
    w = QueueWaits(clock=clock)
    assert w.hold_s() == FIRST_HOLD_S
    for i in range(20):                      # waits of 1..20 s
        w.joined(str(i))
        clock.t += i + 1
        assert w.left(str(i), scheduled=True)
    assert w.hold_s() == pytest.approx(2 * 19)    # 2 x the 95th percentile (19 of 1..20)
    assert not w.left("never", scheduled=True)
    quick = QueueWaits(clock=clock)
    for i in range(10):
        quick.joined(str(i))
        assert quick.left(str(i), scheduled=True)    # no wait at all
    assert quick.hold_s() == MIN_HOLD_S
    slow = QueueWaits(clock=clock)
    for i in range(10):
        slow.joined(str(i))
        clock.t += 10_000
        slow.left(str(i), scheduled=True)
    assert slow.hold_s() == MAX_HOLD_S
    assert QueueWaits(12.5).hold_s() == 12.5


def test_the_announced_hold_length_is_the_current_estimate(tmp_path: Path) -> None:
    with engine(tmp_path / "s", 8) as e:
        sched, _, _ = sides(e, queue_hold_s=7.0)
        sched.queued(request("a", toks(CHUNK, seed=4)))
        (ann,), _ = sched.take_queue()
        assert ann.hold_s == 7.0 and len(ann.tokens) == CHUNK


@pytest.mark.parametrize("bad", [{"announce_queue": "yes"}, {"queue_hold_s": 0},
                                 {"queue_hold_s": -1}, {"queue_hold_s": float("nan")},
                                 {"queue_hold_s": float("inf")}, {"queue_hold_s": True},
                                 {"queue_hold_s": "60"}])
def test_bad_queue_settings_are_config_errors(bad: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        ConnectorSettings.from_extra({"store": "/tmp/x", **bad})


def test_a_failed_prefetch_is_counted_not_raised(tmp_path: Path) -> None:
    with engine(tmp_path / "s", 8) as e:
        a = toks(CHUNK, seed=5)
        e.put(a, random_kv(SMALL, CHUNK, seed=5), model=SMALL)
    with Engine.open(tmp_path / "s", readonly=True) as ro:
        sched, holds, stats = sides(ro)
        sched.queued(request("a", a))
        step(sched, holds)                      # a read-only store refuses the prefetch
        assert stats.get("queue_errors") == 1 and holds.holding() == 0
