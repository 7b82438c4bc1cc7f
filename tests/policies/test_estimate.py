"""ReuseEstimator on synthetic event streams with known answers."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from policies import PolicyError, Reason, ReuseEstimator
from policies.base import Item

Event = tuple[float, int, str, int, int, str]   # (time, order, kind, key, depth, tier)


def lives(start: int, n: int, *, every: float = 1.0, reads: int = 3, life: float = 10.0,
          depth: int = 0, tier: str = "dram", t0: float = 0.0) -> list[Event]:
    """``n`` objects, one inserted every ``every`` seconds, each read ``reads`` times at
    evenly spaced times during its life and removed (evicted) ``life`` seconds after."""
    out: list[Event] = []
    for i in range(n):
        t = t0 + i * every
        key = start + i
        out.append((t, 0, "insert", key, depth, tier))
        for r in range(reads):
            out.append((t + life * (r + 1) / (reads + 1), 1, "hit", key, depth, tier))
        if life != float("inf"):
            out.append((t + life, 2, "remove", key, depth, tier))
    return out


def feed(est: ReuseEstimator, events: Iterable[Event], until: float = float("inf")) -> None:
    for t, _, kind, key, depth, tier in sorted(events):
        if t > until:
            break
        if kind == "insert":
            est.on_insert(Item(key, tier=tier, depth=depth), t)
        elif kind == "hit":
            est.on_access(key, True, t)
        else:
            est.on_remove(key, Reason.EVICTED, t)


def test_known_answer_steady_state() -> None:
    """Every object read exactly 3 times and evicted after 10 s: reuse 3, residency 10 s
    (asked at the last insert: after it the population drains, and draining biases low)."""
    est = ReuseEstimator()
    feed(est, lives(0, 3000), until=2999.0)
    e = est.estimate("dram", 0)
    assert e is not None
    assert e.reuse == pytest.approx(3.0, rel=0.01)
    assert e.residency == pytest.approx(10.0, rel=0.01)
    assert e.weight == pytest.approx(256, rel=0.01)      # 1 / decay departures behind it
    assert est.estimate("nvme", 0) is None and est.estimate("dram", 5) is None


def test_asked_mid_stream() -> None:
    """Asked while objects are alive (steady state), the answer is still right: alive
    objects count with their exposure and reads so far."""
    est = ReuseEstimator()
    feed(est, lives(0, 3000), until=1500.5)
    e = est.estimate("dram", 0)
    assert e is not None
    assert e.reuse == pytest.approx(3.0, rel=0.02) and e.residency == pytest.approx(10.0, rel=0.02)


def test_depth_buckets_are_separate() -> None:
    est = ReuseEstimator()
    feed(est, lives(0, 2000, reads=5, life=20.0, depth=0)
         + lives(10_000, 2000, reads=0, life=5.0, depth=5)
         + lives(20_000, 2000, reads=1, life=8.0, depth=12)
         + lives(30_000, 2000, reads=2, life=30.0, depth=2, tier="nvme"), until=1999.0)
    got = {(t, d): est.estimate(t, d) for t, d in [("dram", 0), ("dram", 4), ("dram", 7),
                                                   ("dram", 8), ("dram", 100), ("nvme", 3)]}
    want = {("dram", 0): (5, 20), ("dram", 4): (0, 5), ("dram", 7): (0, 5),
            ("dram", 8): (1, 8), ("dram", 100): (1, 8), ("nvme", 3): (2, 30)}
    for k, (reuse, residency) in want.items():
        e = got[k]
        assert e is not None, k
        assert e.reuse == pytest.approx(reuse, rel=0.02, abs=1e-9), k
        assert e.residency == pytest.approx(residency, rel=0.02), k
    assert est.estimate("dram", 1) is None and est.estimate("nvme", 0) is None
    assert [est.label(i) for i in range(5)] == ["0", "1", "2-3", "4-7", "8+"]
    snap = est.snapshot()
    assert set(snap) == {"dram", "nvme"} and set(snap["dram"]) == {"0", "4-7", "8+"}
    assert snap["nvme"]["2-3"]["reuse"] == pytest.approx(2.0, rel=0.02)


def test_follows_a_workload_shift() -> None:
    """Reads drop from 3 to 1 and stays from 10 s to 40 s: within a few 1/decay departures
    the estimate is the new workload's."""
    est = ReuseEstimator(decay=1 / 64)
    feed(est, lives(0, 2000) + lives(10_000, 2000, reads=1, life=40.0, t0=2000.0),
         until=3999.0)
    e = est.estimate("dram", 0)
    assert e is not None
    assert e.reuse == pytest.approx(1.0, rel=0.02) and e.residency == pytest.approx(40.0,
                                                                                   rel=0.03)


def test_too_few_observations_is_none() -> None:
    est = ReuseEstimator(min_obs=32)
    events = lives(0, 200)
    removals = sorted(e for e in events if e[2] == "remove")
    # The decayed departure count after k departures is (1 - (1 - 1/256)^k) * 256.
    k = next(k for k in range(1, 200) if (1 - (1 - 1 / 256) ** k) * 256 >= 32)
    feed(est, events, until=removals[k - 2][0])
    assert est.estimate("dram", 0) is None
    assert est.snapshot()["dram"]["0"]["reuse"] is None
    feed(ReuseEstimator(), [])       # nothing: nothing to say
    est2 = ReuseEstimator(min_obs=32)
    feed(est2, events, until=removals[k - 1][0])
    assert est2.estimate("dram", 0) is not None


def test_censoring_counts_stays_in_progress() -> None:
    """Half the objects leave after 2 s, half after 1000 s (true mean stay 501 s). At 500 s
    none of the long ones has left: the mean of completed stays would say 2 s; counting
    the exposure of the objects still alive says far more (biased low only by the filling
    phase), and once the population is steady the answer is right."""
    events = (lives(0, 3000, every=2.0, reads=1, life=2.0)
              + lives(10_000, 3000, every=2.0, reads=1, life=1000.0, t0=1.0))
    early = ReuseEstimator()
    feed(early, events, until=500.0)
    e = early.estimate("dram", 0)
    assert e is not None and 100.0 < e.residency < 501.0
    assert e.reuse == pytest.approx(1.0, rel=0.05)
    steady = ReuseEstimator(decay=1 / 128)
    feed(steady, events, until=5000.0)
    e = steady.estimate("dram", 0)
    assert e is not None
    assert e.residency == pytest.approx(501.0, rel=0.1) and e.reuse == pytest.approx(1.0,
                                                                                    rel=0.1)


def test_a_stay_in_progress_grows_the_estimate() -> None:
    est = ReuseEstimator(min_obs=8)
    feed(est, lives(0, 100))
    before = est.estimate("dram", 0)
    assert before is not None
    est.on_insert(Item("long", tier="dram"), 2000.0)
    est.on_access("long", True, 2000.0)
    later = est.estimate("dram", 0, now=2000.0 + 10 * before.weight)
    assert later is not None
    assert later.residency == pytest.approx(before.residency + 10.0, rel=1e-6)
    assert later.reuse == pytest.approx(before.reuse + 1 / before.weight, rel=1e-6)


def test_tiers_removals_and_forgetting() -> None:
    est = ReuseEstimator(min_obs=1)
    est.on_insert(Item("a", tier="dram"), 0.0)
    est.on_insert(Item("a", tier="nvme"), 0.0)
    est.on_insert(Item("a", tier="nvme"), 1.0)          # already there: its stay goes on
    est.on_access("a", True, 1.0)                        # credited to both tiers
    est.on_access("a", False, 1.0)                       # misses say nothing
    est.on_access("unknown", True, 1.0)                  # never inserted: ignored
    est.on_remove("a", Reason.DEMOTED, 4.0, tier="dram")
    d = est.estimate("dram", 0)
    assert d is not None and (d.reuse, d.residency) == (1.0, 4.0)
    assert est.estimate("nvme", 0) is None and len(est) == 1
    est.on_remove("a", Reason.PROMOTED, 2.0)             # out of order: time is clamped
    n = est.estimate("nvme", 0)
    assert n is not None and (n.reuse, n.residency) == (1.0, 4.0)
    assert len(est) == 0
    est.on_remove("a", Reason.DELETED, 5.0)              # gone already: ignored
    for k in ("x", "y", "z"):
        est.on_insert(Item(k, tier="dram"), 5.0)
    assert est.retain(lambda key, tier: key != "y") == 1 and len(est) == 2
    est.forget("x")
    est.forget("nothing")
    assert len(est) == 1 and est.snapshot(now=5.0)["dram"]["0"]["alive"] == 1.0


@pytest.mark.parametrize("kw", [{"buckets": ()}, {"buckets": (1, 2)}, {"buckets": (0, 2, 2)},
                                {"buckets": (0, 1.5)}, {"decay": 0.0}, {"decay": 1.0},
                                {"min_obs": 0.5}, {"min_obs": 1000.0}])
def test_bad_arguments(kw: dict[str, object]) -> None:
    with pytest.raises(PolicyError):
        ReuseEstimator(**kw)  # type: ignore[arg-type]
