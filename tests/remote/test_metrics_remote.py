"""Metrics of a store with a shared remote tier: adoptions and the server's counters in a
scrape, and a killed server seen as tier availability 0 (logged once at WARNING) until it
is back."""

from __future__ import annotations

import logging
import signal
import uuid
from pathlib import Path

import numpy as np
import pytest
from metricstest import scrape, value
from redis_server import RedisServer, remote_config
from rkvtest import SMALL, random_kv

from rkv import Engine
from rkv.store.tally import model_label

MODEL = model_label(SMALL.fingerprint())


def test_shared_tier_counters_and_a_killed_server(tmp_path: Path, own_redis: RedisServer,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    cfg = remote_config(own_redis.url, uuid.uuid4().hex[:12])
    t = list(range(48))
    kv = random_kv(SMALL, 48)
    with Engine.open(tmp_path / "a", cfg) as a:
        a.put(t, kv, model=SMALL)
    with Engine.open(tmp_path / "b", cfg) as b, b.serve_metrics() as m:
        got = b.get(t, model=SMALL)
        assert got.n_tokens == 48 and np.array_equal(got.kv, kv)
        up = scrape(m.url)
        assert value(up, "rkv_remote_adopted_chunks_total") == 3
        assert value(up, "rkv_tier_available", tier="remote") == 1
        assert value(up, "rkv_blocks_read_total", tier="remote", model=MODEL) == 9
        assert value(up, "rkv_remote_hits_total", tier="remote") >= 9
        assert value(up, "rkv_remote_unavailable_total", tier="remote") == 0

        own_redis.stop(signal.SIGKILL)      # a crash: the node is gone
        with caplog.at_level(logging.WARNING, logger="rkv.store"):
            misses = [b.get(list(range(100, 100 + 32 + i)), model=SMALL) for i in range(3)]
        assert [g.n_tokens for g in misses] == [0, 0, 0]
        warned = [r for r in caplog.records if r.name == "rkv.store"]
        assert len(warned) == 1 and warned[0].levelno == logging.WARNING
        assert warned[0].getMessage().startswith("tier remote is unavailable")
        down = scrape(m.url)
        assert value(down, "rkv_tier_available", tier="remote") == 0
        assert value(down, "rkv_remote_unavailable_total", tier="remote") >= 3
        assert value(down, "rkv_get_misses_total", model=MODEL) == 3
        assert b.stats()["availability"]["down"].keys() == {"remote"}

        own_redis.start()
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="rkv.store"):
            again = b.get(list(range(200, 232)), model=SMALL)
        assert again.n_tokens == 0           # never stored: a miss, but the server answered
        back = scrape(m.url)
        assert value(back, "rkv_tier_available", tier="remote") == 1
        assert [r.getMessage().split(" (")[0] for r in caplog.records
                if r.name == "rkv.store"] == ["tier remote is available again"]
        assert value(back, "rkv_tier_state_changes") == 2


def test_info_does_not_show_a_written_through_shared_tier_as_empty(
        tmp_path: Path, own_redis: RedisServer, capsys: pytest.CaptureFixture[str]) -> None:
    """Write-through copies are indexed in the tier they were put in (dram), so the index
    has no figure for the shared tier: ``rkv info`` says so instead of 0 blocks / 0 B, and
    shows the blocks an adopting store indexes there."""
    from rkv.cli import main

    cfg = remote_config(own_redis.url, uuid.uuid4().hex[:12], local=True)
    with Engine.open(tmp_path / "a", cfg) as a:
        a.put(list(range(48)), random_kv(SMALL, 48), model=SMALL)
        assert a.stats()["tiers"]["remote"]["remote"]["writes"] == 9
    with Engine.open(tmp_path / "b", remote_config(own_redis.url, cfg.tier("remote")
                                                   .remote["namespace"])) as b:
        assert b.get(list(range(48)), model=SMALL).n_tokens == 48
    capsys.readouterr()
    assert main(["info", str(tmp_path / "a")]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()
            if line.startswith(("dram ", "remote "))}
    assert "not counted" in rows["remote"] and "(shared)" in rows["remote"]
    assert rows["dram"].split()[3] == "9"
    assert main(["info", str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    remote = next(line for line in out.splitlines() if line.startswith("remote "))
    assert "9 indexed" in remote and "remote is shared" in out
