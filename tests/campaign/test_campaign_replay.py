"""``--replay`` of one trial sizes the record from its framing instead of predicting its
outcomes (issue 32: a replay took 50 s, most of it a ``predict`` whose only use was the
record's size): the size is the one ``predict`` reports, the row the campaign's, and no
prediction runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rkv.eval.faults import campaign
from rkv.eval.faults.campaign import CampaignConfig, replay_trial, run_campaign
from rkv.reliability.analytic import predict

SMALL = {"chunk_tokens": 16, "kv_heads": 2, "head_dim": 16}
RAW_BER = {"model": "raw-ber", "ber": 3e-5}


@pytest.mark.parametrize(("protection", "bits"), [
    ("raw", 16), ("none", 16), ("rs(255,251)", 16), ("bch(m=13,t=8)", 16),
    ("shardrs(k=4,m=2)", 16), ("rs(255,239)", 4), ("none", 8),
])
def test_record_bytes_is_what_predict_reports(protection: str, bits: int) -> None:
    cfg = CampaignConfig(fault_model=RAW_BER, protection=protection, bits=bits, **SMALL)  # type: ignore[arg-type]
    p = predict(cfg.protection_pipeline(), cfg.data_bytes, cfg.model(), cfg.hours)
    assert cfg.record_bytes() == p.record_bytes
    if protection == "raw":
        assert cfg.record_bytes() == cfg.data_bytes
    else:
        assert cfg.record_bytes() > cfg.data_bytes      # header copies, checksum, parity


def test_replay_runs_no_prediction_and_gives_the_campaigns_row(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rows = tmp_path / "rows.jsonl"
    cfg = CampaignConfig(fault_model=RAW_BER, protection="rs(255,251)", trials=4, blocks=3,
                         seed=5, rows=str(rows), **SMALL)  # type: ignore[arg-type]
    run_campaign(cfg)
    ran = [json.loads(x) for x in rows.read_text().splitlines()]

    def no_predict(*a: object, **k: object) -> None:
        raise AssertionError("replay_trial ran a prediction")

    monkeypatch.setattr(campaign, "predict", no_predict)
    for row in ran:
        assert replay_trial(cfg, row["trial"]) == row


def test_replay_keeps_conditional_sampling_and_tilt(tmp_path: Path) -> None:
    # Rare errors (conditional sampling) and an importance plan both depend on the size.
    rows = tmp_path / "rows.jsonl"
    cfg = CampaignConfig(fault_model={"model": "raw-ber", "ber": 1e-9}, protection="none",
                         trials=3, blocks=2, seed=2, tilt=4.0, rows=str(rows),
                         **SMALL)  # type: ignore[arg-type]
    run_campaign(cfg)
    ran = [json.loads(x) for x in rows.read_text().splitlines()]
    assert [replay_trial(cfg, r["trial"]) for r in ran] == ran
