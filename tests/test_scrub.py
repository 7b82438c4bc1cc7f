"""The patrol scrubber: refresh by age, rewrite corrected blocks, repair from a copy or drop,
risk order, pacing, races held open by hooks, and a scrub killed mid-transaction."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rkvtest import SMALL, random_kv

from rkv import Engine, EngineConfig, TierConfig
from rkv.errors import ConfigError
from rkv.format.keys import as_token_array, block_key, chunk_keys
from rkv.store.scrub import Scrubber, ScrubConfig

CHUNK = 16
HOUR = 3600 * 10**9


def config(ecc: str = "none", **kw: Any) -> EngineConfig:
    tiers = (TierConfig("dram", medium="memory", path="t/dram", capacity_bytes=1 << 30,
                        ecc=ecc),
             TierConfig("nvme", medium="disk", path="t/nvme", capacity_bytes=1 << 30,
                        ecc=ecc))
    return EngineConfig(chunk_tokens=CHUNK, tiers=tiers, repair=False, **kw)


class FakeClock:
    def __init__(self) -> None:
        self.t = 1_700_000_000 * 10**9

    def __call__(self) -> int:
        return self.t


def tokens(n: int, seed: int = 0) -> list[int]:
    return [int(x) for x in np.random.default_rng(seed).integers(0, 30000, n)]


def keys_of(toks: list[int]) -> list[bytes]:
    return chunk_keys(as_token_array(toks), SMALL.fingerprint(), CHUNK)


def damage(engine: Engine, tier: str, bkey: bytes, where: list[int], width: int = 1) -> None:
    """Flip ``width`` bytes at each fraction-of-the-record position in ``where`` (percent)."""
    t = engine.tiers[tier]
    rec = bytearray(t.get(bkey) or b"")
    assert rec
    for pct in where:
        i = len(rec) * pct // 100
        for j in range(i, i + width):
            rec[j] ^= 0xFF
    t.put(bkey, bytes(rec))


@pytest.fixture
def store(tmp_path: Path) -> Any:
    def make(ecc: str = "none", n: int = 4 * CHUNK) -> tuple[Engine, list[int], np.ndarray]:
        e = Engine.open(tmp_path / "s", config(ecc))
        e.clock = FakeClock()
        toks = tokens(n)
        kv = random_kv(SMALL, n)
        e.put(toks, kv, model=SMALL)
        return e, toks, kv
    return make


def exact(e: Engine, toks: list[int], kv: np.ndarray) -> bool:
    got = e.get(toks, model=SMALL)
    return got.n_tokens == len(toks) and np.array_equal(got.kv, kv) and all(
        b.status == "ok" for b in got.blocks)


def test_an_aged_block_is_refreshed_and_then_reads_clean(store: Any) -> None:
    e, toks, kv = store()
    clock = e.clock
    n = 4 * SMALL.n_layers
    cfg = ScrubConfig(refresh_hours={"dram": 1.0, "nvme": 1.0})
    assert e.scrub(cfg).total("refreshed") == 0          # young: read, left alone
    clock.t += 2 * HOUR
    rep = e.scrub(cfg)
    assert rep.total("refreshed") == n and rep.total("scanned") == n
    assert all(b.age_s == 0 for b in e.block_ages())      # a rewrite restarts the age
    assert e.scrub(cfg).total("refreshed") == 0
    assert exact(e, toks, kv)
    e.close()


def test_correctable_damage_is_rewritten_and_the_data_stays_exact(store: Any) -> None:
    e, toks, kv = store("rs(255,239)")
    keys = keys_of(toks)
    hit = [block_key(keys[c], layer) for c in (0, 2) for layer in range(SMALL.n_layers)]
    for bk in hit:
        damage(e, "dram", bk, [50, 70])
    rep = e.scrub(ScrubConfig(refresh_hours={"dram": 1e6, "nvme": 1e6}))
    assert rep.total("corrected") == len(hit) and rep.total("lost") == 0
    v = e.verify()
    assert v.clean and v.corrected == 0 and v.ok == 4 * SMALL.n_layers
    assert exact(e, toks, kv)
    e.close()


def test_a_correction_below_the_margin_is_left_in_place(store: Any) -> None:
    e, toks, _kv = store("rs(255,239)")
    damage(e, "dram", block_key(keys_of(toks)[1], 0), [50])
    rep = e.scrub(ScrubConfig(refresh_hours={"dram": 1e6, "nvme": 1e6}, margin=1000))
    assert rep.total("corrected") == 0
    assert e.verify().corrected == 1
    e.close()


def test_an_uncorrectable_block_with_a_copy_elsewhere_is_repaired(store: Any) -> None:
    e, toks, kv = store()
    bk = block_key(keys_of(toks)[1], 2)
    e.tiers["nvme"].put(bk, e.tiers["dram"].get(bk))      # a copy in another tier
    damage(e, "dram", bk, [50], width=8)
    rep = e.scrub(ScrubConfig(refresh_hours={"dram": 1e6, "nvme": 1e6}))
    assert rep.total("repaired") == 1 and rep.total("lost") == 0
    assert exact(e, toks, kv)
    e.close()


def test_an_uncorrectable_block_without_a_copy_drops_its_chunk(store: Any) -> None:
    e, toks, kv = store()
    bk = block_key(keys_of(toks)[2], 0)
    damage(e, "dram", bk, [50], width=8)
    rep = e.scrub(ScrubConfig(refresh_hours={"dram": 1e6, "nvme": 1e6}))
    assert rep.total("lost") == 1 and rep.chunks_dropped == 1
    assert "1 chunks dropped" in rep.render()
    got = e.get(toks, model=SMALL)          # the prefix before it, exact; nothing wrong
    assert got.n_tokens == 2 * CHUNK and np.array_equal(got.kv, kv[:, :, :2 * CHUNK])
    assert all(b.status == "ok" for b in got.blocks)
    assert e.verify().uncorrectable == 0
    assert e.stats()["session"]["scrub_chunks_dropped"] == 1
    e.close()


def test_riskiest_blocks_come_first(store: Any) -> None:
    e, _toks, _kv = store()
    clock = e.clock
    clock.t += 5 * HOUR
    late = tokens(CHUNK, seed=9)
    e.put(late, random_kv(SMALL, CHUNK, 9), model=SMALL)        # younger
    s = Scrubber(e.core, ScrubConfig(refresh_hours={"dram": 10.0, "nvme": 10.0}))
    order = s.order()
    young = set(keys_of(late))
    assert [b.key in young for b in order] == [False] * (4 * 3) + [True] * 3
    assert order[0].risk == pytest.approx(0.5)
    e.close()


def test_the_budget_paces_the_pass(store: Any) -> None:
    e, _toks, _kv = store()
    total = sum(b.nbytes for b in e.block_ages())
    rep = e.scrub(ScrubConfig(budget_mbps=total / 0.3 / 1e6, refresh_hours={"dram": 1e6,
                                                                              "nvme": 1e6}))
    assert rep.seconds >= 0.3 * (1 - 1 / (4 * SMALL.n_layers)) - 1e-3
    e.close()


def test_stop_ends_a_pass_between_blocks(store: Any) -> None:
    e, _toks, _kv = store()
    stop = threading.Event()

    def progress(done: int, total: int) -> None:
        if done == 3:
            stop.set()

    rep = Scrubber(e.core, ScrubConfig(refresh_hours={"dram": 1e6, "nvme": 1e6}),
                   progress=progress, stop=stop).run()
    assert rep.interrupted and rep.total("scanned") == 3
    assert "interrupted" in rep.render()
    e.close()


def test_a_chunk_stored_anew_before_the_drop_is_kept(store: Any) -> None:
    e, toks, kv = store()
    bk = block_key(keys_of(toks)[3], 1)
    damage(e, "dram", bk, [50], width=8)
    s = Scrubber(e.core, ScrubConfig(refresh_hours={"dram": 1e6, "nvme": 1e6}))

    def writer() -> None:       # the window between the pass's read and its drop
        e.delete(toks, model=SMALL)
        e.put(toks, kv, model=SMALL)

    s.hooks["drop"] = writer
    rep = s.run()
    assert rep.total("lost") == 0 and rep.chunks_dropped == 0
    assert exact(e, toks, kv)
    e.close()


def test_a_block_moved_before_its_rewrite_is_skipped(store: Any) -> None:
    e, toks, _kv = store()
    e.clock.t += 2 * HOUR
    s = Scrubber(e.core, ScrubConfig(refresh_hours={"dram": 1.0, "nvme": 1.0}))

    def deleter() -> None:      # the window between the pass's reads and its rewrites
        e.delete(toks[:2 * CHUNK + 1], model=SMALL)

    s.hooks["read"] = deleter
    rep = s.run()
    # the deleted chunks' blocks were read, then skipped; the others refreshed
    assert rep.total("skipped") + rep.total("refreshed") == 4 * SMALL.n_layers
    assert rep.total("refreshed") >= 2 * SMALL.n_layers
    assert e.verify().clean
    e.close()


def _killed_scrub(path: str, point: str) -> None:
    e = Engine.open(path)
    e.clock = lambda: 1_700_000_000 * 10**9 + 50 * HOUR

    def die() -> None:
        os._exit(9)

    e.hooks[point] = die
    e.scrub(ScrubConfig(refresh_hours={"dram": 1.0, "nvme": 1.0}))


@pytest.mark.parametrize("point", ["locked", "committed"])
def test_a_killed_scrub_leaves_a_consistent_store(tmp_path: Path, point: str) -> None:
    path = str(tmp_path / "s")
    with Engine.open(path, config()) as e:
        e.clock = FakeClock()
        toks = tokens(4 * CHUNK)
        kv = random_kv(SMALL, 4 * CHUNK)
        e.put(toks, kv, model=SMALL)
        damage(e, "dram", block_key(keys_of(toks)[3], 1), [50], width=8)
    p = mp.get_context("spawn").Process(target=_killed_scrub, args=(path, point))
    p.start()
    p.join(120)
    assert p.exitcode == 9
    with Engine.open(path) as e:
        v = e.verify()
        assert v.corrected == 0 and v.missing == 0 and v.uncorrectable <= 1
        got = e.get(toks, model=SMALL)
        assert got.n_tokens >= 3 * CHUNK
        assert np.array_equal(got.kv, kv[:, :, :got.n_tokens])
        assert e.verify(repair=True).uncorrectable <= 1


def test_unknown_tier_is_an_error(store: Any) -> None:
    e, *_ = store()
    with pytest.raises(ConfigError, match="no tier cxl"):
        Scrubber(e.core, ScrubConfig(tiers=("cxl",)))
    with pytest.raises(ConfigError, match="budget_mbps"):
        ScrubConfig(budget_mbps=0)
    with pytest.raises(ConfigError, match="unknown key"):
        ScrubConfig.from_dict({"budgt_mbps": 3})
    e.close()


def test_cli_once_json(tmp_path: Path, capsys: Any) -> None:
    from rkv.cli import main

    with Engine.open(tmp_path / "s", config()) as e:
        e.put(tokens(2 * CHUNK), random_kv(SMALL, 2 * CHUNK), model=SMALL)
    rc = main(["scrub", str(tmp_path / "s"), "--once", "--json", "-q", "--refresh-hours",
               "1000"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["tiers"]["dram"]["scanned"] == 2 * SMALL.n_layers
    assert out["tiers"]["dram"]["ok"] == 2 * SMALL.n_layers and not out["interrupted"]


def test_the_engine_runs_a_background_scrubber_and_stops_it_on_close(tmp_path: Path) -> None:
    cfg = config("rs(255,239)", scrub={"interval_hours": 1e-6, "refresh_hours": {
        "dram": 1e6, "nvme": 1e6}})
    with Engine.open(tmp_path / "s", config("rs(255,239)")) as e:
        toks = tokens(2 * CHUNK)
        kv = random_kv(SMALL, 2 * CHUNK)
        e.put(toks, kv, model=SMALL)
        damage(e, "dram", block_key(keys_of(toks)[0], 1), [50, 60])
    e = Engine.open(tmp_path / "s", cfg)
    bg = e._scrubber
    assert bg is not None
    while not any(r.total("corrected") for r in bg.reports):     # passes until it fixed it
        bg.passed.clear()
        assert bg.passed.wait(60) and bg.error is None
    e.close()
    assert not bg._thread.is_alive()
    with Engine.open(tmp_path / "s", config("rs(255,239)")) as e:
        assert e.verify().corrected == 0 and exact(e, toks, kv)


def test_a_disabled_scrub_table_starts_nothing(tmp_path: Path) -> None:
    with Engine.open(tmp_path / "s", config(scrub={"enabled": False})) as e:
        assert e._scrubber is None
    with pytest.raises(ConfigError, match="scrub enabled"):
        config(scrub={"enabled": "yes"})


def test_repeating_passes_refresh_what_would_age_past_the_limit_before_the_next(
        store: Any) -> None:
    e, *_ = store()
    e.clock.t += 5 * HOUR
    once = e.scrub(ScrubConfig(refresh_hours={"dram": 10.0, "nvme": 10.0}))
    assert once.total("refreshed") == 0                  # 5 h old, limit 10 h
    every6 = e.scrub(ScrubConfig(refresh_hours={"dram": 10.0, "nvme": 10.0},
                                  interval_hours=6.0))
    assert every6.total("refreshed") == 4 * SMALL.n_layers   # 5 h + 6 h > 10 h
    e.close()


def test_a_block_corrected_again_after_its_rewrite_moves_a_tier_down(store: Any) -> None:
    e, toks, kv = store("rs(255,239)")
    bk = block_key(keys_of(toks)[1], 2)
    cfg = ScrubConfig(refresh_hours={"dram": 1e6, "nvme": 1e6})
    s = Scrubber(e.core, cfg)
    damage(e, "dram", bk, [50, 70])
    assert s.run().total("corrected") == 1           # first time: rewritten in place
    damage(e, "dram", bk, [50, 70])                  # the same fault again
    rep = s.run()
    assert rep.total("moved") == 1 and rep.tiers["dram"].moved == 1
    assert e.tiers["nvme"].get(bk) is not None and e.tiers["dram"].get(bk) is None
    assert exact(e, toks, kv) and e.verify().clean
    e.close()
