"""The campaign's output: verdict first, the fault model by name, why rkv and raw agree when
they do, no meaningless "clean" row under conditional sampling, the stored block's real size,
and the same report as JSON and CSV."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

import numpy as np
import pytest

from rkv.eval.faults.campaign import (
    CampaignConfig,
    Summary,
    format_summary,
    run_campaign,
    run_with_raw,
)
from rkv.eval.faults.campaign_report import explain_agreement, format_report, verdict
from rkv.ui import human_bytes

SMALL: dict[str, Any] = {"trials": 2, "blocks": 3}


@pytest.fixture(scope="module")
def nvme() -> tuple[Summary, Summary | None]:
    return run_with_raw(CampaignConfig(tier="nvme", **SMALL))


@pytest.fixture(scope="module")
def dram() -> tuple[Summary, Summary | None]:
    return run_with_raw(CampaignConfig(tier="dram", **SMALL))


def test_verdict_leads(nvme: tuple[Summary, Summary | None]) -> None:
    s, raw = nvme
    assert raw is not None and s.sampling == "conditional"
    lines = format_report(s, raw).splitlines()
    assert lines[0].startswith("rkv: 0 silent corruptions, 0 recomputes, 6 corrected in 6 "
                               "fault-injected reads; per 10^12 block-days: silent 0 (≤ ")
    assert lines[1].startswith("raw storage (no checksum, no code), same faults: 0 silent "
                               "corruptions, 6 recomputes; per 10^12 block-days:")
    assert lines[1].endswith(f"recomputes {raw.rates['due'][0] * 1e12:,.0f}")
    assert verdict(s, raw) == "\n".join(lines[:2])


def test_fault_model_named(nvme: tuple[Summary, Summary | None]) -> None:
    text = format_report(*nvme)
    assert ("fault model: nvme-tlc (3D TLC NAND SSD at 3,000 P/E cycles, BCH 40 bits / 1 KiB),"
            " the nvme tier's default") in text
    cfg = CampaignConfig(tier="cxl", fault_model={"preset": "cxl", "link_ber": 1e-6},
                         ber_multiplier=10, trials=1, blocks=1)
    from rkv.eval.faults.campaign_report import fault_model_text
    assert fault_model_text(cfg) == ("cxl (CXL type-3 memory expander, PCIe 5 / CXL 2.0 link); "
                                     "with link_ber=1e-06; every fault rate x 10 (accelerated)")


def test_no_clean_row_under_conditional_sampling(nvme: tuple[Summary, Summary | None]) -> None:
    s, _ = nvme
    rows = [line.split()[0] for line in format_summary(s).splitlines()
            if line.startswith("  ") and line.split()]
    assert rows[0] == "outcome" and "clean" not in rows
    assert rows[2:] == ["masked", "corrected", "due", "sdc"]
    assert "no fault at all: 1 - " in format_summary(s)


def test_direct_sampling_keeps_the_clean_row() -> None:
    s = run_campaign(CampaignConfig(tier="dram", sampling="direct", trials=1, blocks=2))
    assert any(line.split()[:2] == ["clean", "2"] for line in format_summary(s).splitlines())
    raw = run_campaign(CampaignConfig(tier="dram", sampling="direct", protection="raw",
                                      trials=1, blocks=2))
    assert "No fault hit any of the 2 blocks" in explain_agreement(s, raw)
    assert "--ber-multiplier" in explain_agreement(s, raw)


@pytest.mark.parametrize(("kw", "size"), [({"dtype": "float32"}, "384.0 KiB"),
                                          ({"bits": 4}, "84.1 KiB"), ({}, "192.0 KiB")])
def test_block_size_is_the_stored_blocks(kw: dict[str, object], size: str) -> None:
    """The summary's block size is what the store writes: the block's bytes after the
    quantizer (the old summary said 192 KiB for every dtype and bit-width)."""
    from rkv.codec.stages import quantizer_for
    from rkv.format.dtypes import numpy_dtype

    cfg = CampaignConfig(tier="nvme", trials=1, blocks=1, **kw)  # type: ignore[arg-type]
    block = np.ones((2, cfg.chunk_tokens, cfg.kv_heads, cfg.head_dim), numpy_dtype(cfg.dtype))
    q = quantizer_for(cfg.quant_spec())
    stored = len(q.encode(block)) if q is not None else block.nbytes
    assert human_bytes(stored) == size
    s, raw = run_with_raw(cfg)
    assert raw is not None and raw.prediction.record_bytes == stored
    assert f"blocks of {size} (" in format_report(s, raw)


def test_agreement_explained_on_dram(dram: tuple[Summary, Summary | None],
                                     nvme: tuple[Summary, Summary | None]) -> None:
    s, raw = dram
    note = explain_agreement(s, raw)
    assert note.startswith("rkv and raw storage agree here: every fault this model draws is "
                           "reported by the medium itself")
    assert "--fault-model raw-ber" in note and note in format_report(s, raw)
    assert explain_agreement(*nvme) == ""      # corrected vs recomputed: they differ


def test_agreement_on_cxl_names_the_unreported_faults() -> None:
    s, raw = run_with_raw(CampaignConfig(tier="cxl", **SMALL))
    note = explain_agreement(s, raw)
    assert "flit escaping CRC" in note and "--param link_ber=1e-6" in note


def test_raw_storage_silent_corruptions_in_the_verdict() -> None:
    cfg = CampaignConfig(tier="nvme", fault_model="raw-ber", protection="none", trials=2,
                         blocks=4, bits=4, ber_multiplier=10)
    s, raw = run_with_raw(cfg)
    assert raw is not None and raw.counts["sdc"] > 0 and s.counts["sdc"] == 0
    line = verdict(s, raw).splitlines()[1]
    assert f"same faults: {raw.counts['sdc']} silent corruption" in line


def test_json_and_csv(nvme: tuple[Summary, Summary | None]) -> None:
    s, raw = nvme
    doc = json.loads(format_report(s, raw, "json"))
    assert doc["verdict"] == verdict(s, raw) and doc["raw"]["protection"] == "raw"
    assert doc["fault_model"].startswith("nvme-tlc (")
    assert doc["corrected"] == 6 and doc["rates"]["sdc"]["rate"] == 0
    rows = list(csv.DictReader(io.StringIO(format_report(s, raw, "csv"))))
    assert [(r["storage"], r["outcome"]) for r in rows] == [
        (p, o) for p in ("shardrs(k=16,m=2)", "raw") for o in ("masked", "corrected", "due",
                                                                 "sdc")]
    assert float(rows[1]["rate"]) == s.rates["corrected"][0]
    assert "\x1b" not in format_report(s, raw)


def test_progress_lines_off_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    run_campaign(CampaignConfig(tier="dram", trials=2, blocks=1), progress=True)
    err = capsys.readouterr().err
    assert err.splitlines()[-1].startswith("campaign: 2/2 trials (100%), done in")
