"""Prometheus metrics of a store (rkv.store.metrics): scraped over HTTP, parsed with the
client library's parser, counters moving as faults are injected; tier state changes logged
once (rkv.store.tally)."""

from __future__ import annotations

import logging
import os
import re
import select
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from metricstest import scrape, value
from rkvtest import SMALL, local_config, random_kv

from rkv import Engine, EngineConfig
from rkv.format.keys import as_token_array, block_key, chunk_keys
from rkv.format.record import decode_record
from rkv.store.tally import TierWatch, model_label
from rkv.tiers import LmdbTier

MODEL = model_label(SMALL.fingerprint())


def ecc_config() -> EngineConfig:
    cfg = local_config()
    return replace(cfg, tiers=tuple(replace(t, ecc="rs(255,223)") for t in cfg.tiers))


def toks(n: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(0, 50000, n).tolist()


def damage(e: Engine, t: list[int], layer: int, nbytes: int) -> None:
    """Flip ``nbytes`` data bytes (one every 7) of the first chunk's block ``layer`` in dram."""
    bkey = block_key(chunk_keys(as_token_array(t), SMALL.fingerprint(), 16)[0], layer)
    tier = e.tiers["dram"]
    rec = bytearray(tier.get(bkey) or b"")
    start = decode_record(rec).header_bytes
    for i in range(nbytes):
        rec[start + 7 * i] ^= 0x5A
    tier.put(bkey, rec)


def test_scrape_counts_reads_corrections_and_due(store_path: Path) -> None:
    with Engine.open(store_path, ecc_config()) as e, e.serve_metrics() as m:
        t = toks(40)
        e.put(t, random_kv(SMALL, 40), model=SMALL)
        before = scrape(m.url)
        assert value(before, "rkv_tier_available", tier="dram") == 1.0
        assert value(before, "rkv_chunks_written_total", tier="dram", model=MODEL) == 3
        assert value(before, "rkv_tier_blocks", tier="dram") == 9
        assert value(before, "rkv_model_info", model=MODEL, name=SMALL.model_id) == 1
        e.get(t, model=SMALL)
        clean = scrape(m.url)
        assert value(clean, "rkv_blocks_read_total", tier="dram", model=MODEL) == 9
        assert value(clean, "rkv_read_bytes_total", tier="dram", model=MODEL) == \
            e.stats()["tiers"]["dram"]["bytes"]
        assert value(clean, "rkv_get_hits_total", model=MODEL) == 1
        assert value(clean, "rkv_blocks_corrected_total", tier="dram", model=MODEL) == 0

        damage(e, t, layer=1, nbytes=3)          # 3 symbols: within rs(255,223)'s 16
        got = e.get(t, model=SMALL)
        assert got.counts["corrected"] == 1
        fixed = scrape(m.url)
        assert value(fixed, "rkv_blocks_corrected_total", tier="dram", model=MODEL) == 1
        assert value(fixed, "rkv_corrected_symbols_total", tier="dram",
                     model=MODEL) == got.corrected >= 3
        assert value(fixed, "rkv_blocks_repaired_total") == 1

        damage(e, t, layer=2, nbytes=40)         # far past what the code corrects: a DUE
        bad = e.get(t, model=SMALL)
        assert bad.counts["uncorrectable"] == 1 and bad.n_tokens == 0
        due = scrape(m.url)
        assert value(due, "rkv_blocks_uncorrectable_total", tier="dram", model=MODEL) == 1
        assert value(due, "rkv_blocks_corrected_total", tier="dram", model=MODEL) == 1
        assert value(due, "rkv_gets_total", model=MODEL) == 3
        assert value(due, "rkv_session_events_total", event="gets") == 3


def test_miss_is_counted_for_its_model(store_path: Path) -> None:
    with Engine.open(store_path, local_config()) as e, e.serve_metrics() as m:
        e.get(toks(20, seed=3), model=SMALL)
        s = scrape(m.url)
        assert value(s, "rkv_get_misses_total", model=MODEL) == 1
        assert value(s, "rkv_get_hits_total", model=MODEL) == 0


def test_scrub_outcomes_and_coverage(store_path: Path) -> None:
    with Engine.open(store_path, ecc_config()) as e, e.serve_metrics() as m:
        t = toks(40)
        e.put(t, random_kv(SMALL, 40), model=SMALL)
        assert ("rkv_scrub_last_coverage_ratio", frozenset()) not in scrape(m.url)
        damage(e, t, layer=0, nbytes=2)
        report = e.scrub()
        s = scrape(m.url)
        assert report.total("corrected") == 1
        assert value(s, "rkv_scrub_blocks_total", tier="dram", outcome="corrected") == 1
        assert value(s, "rkv_scrub_blocks_total", tier="dram", outcome="scanned") == \
            report.total("scanned") == 9
        assert value(s, "rkv_scrub_last_coverage_ratio") == 1.0
        assert 0.0 <= value(s, "rkv_scrub_last_age_seconds") < 3600


def test_plan_mix_and_capacity(store_path: Path) -> None:
    with Engine.open(store_path, ecc_config()) as e, e.serve_metrics() as m:
        e.put(toks(32), random_kv(SMALL, 32), model=SMALL)
        s = scrape(m.url)
        st = e.stats()["tiers"]["dram"]
        assert value(s, "rkv_tier_plan_blocks", tier="dram", bits="16",
                     code="rs(n=255,k=223,interleave=1)") == st["blocks"] == 6
        assert value(s, "rkv_tier_used_bytes", tier="dram") == st["bytes"] > 0
        assert value(s, "rkv_tier_capacity_bytes", tier="dram") == 1 << 30


def test_closing_the_engine_stops_its_exporter(store_path: Path) -> None:
    e = Engine.open(store_path, local_config())
    m = e.serve_metrics()
    scrape(m.url)
    e.close()
    with pytest.raises(OSError):
        scrape(m.url)


def test_watch_logs_each_change_once(caplog: pytest.LogCaptureFixture) -> None:
    w = TierWatch()
    with caplog.at_level(logging.WARNING, logger="rkv.store"):
        for _ in range(3):
            w.failed("remote", "connection refused")
        w.observe("remote", "ok")          # a poll does not bring back a failed tier
        assert w.down() == {"remote": "connection refused"}
        w.succeeded("remote")
        w.succeeded("remote")
        w.observe("dram", "damaged")
        w.observe("dram", "damaged")
        w.observe("dram", "ok")
    msgs = [r.getMessage() for r in caplog.records]
    assert msgs == ["tier remote is unavailable: connection refused",
                    "tier remote is available again (it was down: connection refused)",
                    "tier dram is unavailable: state damaged",
                    "tier dram is available again (it was: state damaged)"]
    assert all(r.levelno == logging.WARNING for r in caplog.records)
    assert w.changes == 4 and w.down() == {}


def test_serve_metrics_command(store_path: Path) -> None:
    """``rkv serve-metrics`` as a process: says where it serves, serves the store's durable
    state, exits 0 on SIGTERM."""
    with Engine.open(store_path, local_config()) as e:
        e.put(toks(40), random_kv(SMALL, 40), model=SMALL)
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "rkv.cli", "serve-metrics", str(store_path), "--port", "0",
         "--interval", "0.2"], stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(root)})
    try:
        assert proc.stderr is not None
        ready, _, _ = select.select([proc.stderr], [], [], 60)
        assert ready, "serve-metrics did not start"
        line = proc.stderr.readline()
        match = re.search(r"at (http://127\.0\.0\.1:\d+/metrics)", line)
        assert match, line
        s = scrape(match.group(1))
        assert value(s, "rkv_chunks") == 3 and value(s, "rkv_tokens") == 40
        assert value(s, "rkv_tier_blocks", tier="dram") == 9
        assert value(s, "rkv_tier_available", tier="dram") == 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert "metrics server stopped" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_tier_found_damaged_is_logged_once_and_unavailable(
        store_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with Engine.open(store_path, local_config()) as e, e.serve_metrics() as m:
        t = toks(40)
        e.put(t, random_kv(SMALL, 40), model=SMALL)
        assert value(scrape(m.url), "rkv_tier_available", tier="dram") == 1
        tier = e.tiers["dram"]
        assert isinstance(tier, LmdbTier)
        with caplog.at_level(logging.WARNING, logger="rkv.store"):
            tier.mark_damaged("a page failed its checksum")
            for _ in range(3):
                e.get(t, model=SMALL)
            s = scrape(m.url)
        assert [r.getMessage() for r in caplog.records if r.name == "rkv.store"] == \
            ["tier dram is unavailable: state damaged"]
        assert value(s, "rkv_tier_available", tier="dram") == 0
        assert value(s, "rkv_tier_available", tier="nvme") == 1
        assert value(s, "rkv_tier_state_changes") == 1
