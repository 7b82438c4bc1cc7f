"""Erasures end to end: the medium reports what it cannot return (EIO, poison), the engine
hands the positions to its decoders, and a raw reader sees the same report as a failure."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from rkvtest import SMALL, local_config, random_kv

from faultmodels import ErrorPattern
from rkv import Engine, MediumError
from rkv.format.keys import as_token_array, block_key, chunk_keys
from rkv.format.record import decode_record
from rkv.tiers.faulty import FaultyTier

TOKENS = list(range(16))


def open_rs(path: Path, ecc: str = "rs(255,239)", *, repair: bool = False,
            caps: tuple[int, int, int] | None = None, report: bool = True
            ) -> tuple[Engine, FaultyTier, np.ndarray, bytes]:
    cfg = local_config(16, caps, repair=repair)
    cfg = replace(cfg, tiers=tuple(replace(t, ecc=ecc) for t in cfg.tiers))
    e = Engine.open(path, cfg)
    kv = random_kv(SMALL, 16)
    e.put(TOKENS, kv, model=SMALL)
    tier = e.wrap_tier("dram", lambda t: FaultyTier(t, seed=1, report_erasures=report))
    assert isinstance(tier, FaultyTier)
    key = block_key(chunk_keys(as_token_array(TOKENS), SMALL.fingerprint(), 16)[0], 1)
    return e, tier, kv, key


def poison(tier: FaultyTier, key: bytes, start: int, length: int) -> None:
    n = len(tier.inner.get(key) or b"")
    tier.inject(key, ErrorPattern(nbytes=n, erasures=[(start, length, "poison")]))


def payload_start(tier: FaultyTier, key: bytes) -> int:
    return decode_record(tier.inner.get(key) or b"").header_bytes


def test_reported_erasures_are_rebuilt_beyond_the_errors_only_radius(tmp_path: Path) -> None:
    """16 erased bytes in one rs(255,239) codeword: twice what errors-only decoding fixes."""
    e, tier, kv, key = open_rs(tmp_path / "a")
    poison(tier, key, payload_start(tier, key), 16)
    got = e.get(TOKENS, model=SMALL)
    assert got.ok and np.array_equal(got.kv, kv)
    st = got.blocks[1]
    assert st.status == "corrected" and st.corrected >= 16
    e.close()
    # The same damage from a medium that does not say where: garbage the code cannot fix.
    e, tier, kv, key = open_rs(tmp_path / "b", report=False)
    poison(tier, key, payload_start(tier, key), 16)
    got = e.get(TOKENS, model=SMALL)
    assert got.n_tokens == 0 and got.counts["uncorrectable"] == 1
    e.close()


def test_a_raw_reader_sees_the_same_fault_as_a_failed_read(tmp_path: Path) -> None:
    e, tier, _, key = open_rs(tmp_path / "s")
    start = payload_start(tier, key)
    poison(tier, key, start, 64)
    with pytest.raises(MediumError) as info:
        tier.get(key)
    assert info.value.ranges == ((start, 64),)
    data, ranges = tier.fetch(key)
    assert ranges == ((start, 64),) and data is not None
    assert not any(data[start:start + 64])              # zero-filled where it was lost
    e.close()


def test_erasures_beyond_the_code_are_a_typed_loss(tmp_path: Path) -> None:
    e, tier, _, key = open_rs(tmp_path / "s")
    poison(tier, key, payload_start(tier, key), 17 * 1)  # 17 > n - k in codeword 0
    got = e.get(TOKENS, model=SMALL)
    assert got.n_tokens == 0 and got.counts["uncorrectable"] == 1
    e.close()


def test_no_ecc_tier_reports_the_loss(tmp_path: Path) -> None:
    e, tier, _, key = open_rs(tmp_path / "s", ecc="none")
    poison(tier, key, payload_start(tier, key), 8)
    got = e.get(TOKENS, model=SMALL)
    assert got.counts["uncorrectable"] == 1
    assert "medium lost" in str(got.blocks[1].error)
    e.close()


def test_lost_header_copies_and_parity_only(tmp_path: Path) -> None:
    """Erasures over the two leading header copies, and over parity only: the data comes back
    exact, counted as corrected so that the record is rewritten."""
    e, tier, kv, key = open_rs(tmp_path / "s")
    rec = tier.inner.get(key) or b""
    start = payload_start(tier, key)
    poison(tier, key, 0, start)
    got = e.get(TOKENS, model=SMALL)
    assert got.ok and np.array_equal(got.kv, kv) and got.blocks[1].status == "corrected"
    tier.put(key, rec)                                   # a rewrite clears the damage
    assert key not in tier.erased
    dec = decode_record(rec)
    poison(tier, key, start + dec.header.data_len, 8)     # parity bytes only
    got = e.get(TOKENS, model=SMALL)
    assert got.ok and np.array_equal(got.kv, kv) and got.blocks[1].status == "corrected"
    e.close()


def test_a_read_repairs_the_erased_record(tmp_path: Path) -> None:
    e, tier, kv, key = open_rs(tmp_path / "s", repair=True)
    poison(tier, key, payload_start(tier, key) + 3, 10)
    assert e.get(TOKENS, model=SMALL).blocks[1].status == "corrected"
    assert key not in tier.erased                        # rewritten: the medium remapped it
    again = e.get(TOKENS, model=SMALL)
    assert again.ok and again.blocks[1].status == "ok" and np.array_equal(again.kv, kv)
    e.close()


def test_a_demotion_rebuilds_the_erasures_in_transit(tmp_path: Path) -> None:
    """A block moved to a slower tier is decoded with its medium's report and re-encoded
    there, so the copy in the new tier is whole."""
    e, tier, kv, key = open_rs(tmp_path / "s", caps=(5000, 1 << 30, 1 << 30))
    poison(tier, key, payload_start(tier, key), 12)
    for i in range(1, 4):                                # other prefixes push it out of dram
        e.put(list(range(100 * i, 100 * i + 16)), random_kv(SMALL, 16, seed=i), model=SMALL)
    got = e.get(TOKENS, model=SMALL)
    assert got.ok and np.array_equal(got.kv, kv)
    assert got.blocks[1].tier != "dram" and got.blocks[1].status == "ok"
    e.close()


def test_campaign_compares_like_for_like() -> None:
    """The same faults: raw storage gets a failed read (DUE) for a poisoned line and wrong KV
    for a link error that escaped the CRC; rkv decodes the lines as erasures, corrects the
    link errors and recovers most blocks, never returning wrong data."""
    from rkv.eval.faults.campaign import CampaignConfig, run_campaign
    from rkv.eval.faults.validate import VARIANTS

    common = {"fault_model": VARIANTS["cxl words+rows"], "hours": 24.0, "trials": 6,
              "blocks": 10, "chunk_tokens": 64, "kv_heads": 1, "head_dim": 64,
              "sampling": "conditional", "tier": "cxl"}
    rkv = run_campaign(CampaignConfig(protection="rs(255,239,interleave=8)", **common))
    raw = run_campaign(CampaignConfig(protection="raw", **common))
    assert raw.counts["due"] + raw.counts["sdc"] == raw.blocks
    assert raw.counts["due"] > 0 and raw.counts["sdc"] > 0
    assert rkv.counts["corrected"] >= rkv.blocks // 3 and rkv.counts["sdc"] == 0
