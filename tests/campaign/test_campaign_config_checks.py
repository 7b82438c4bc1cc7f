"""CampaignConfig validates through rkv.checks: each bad value is a ConfigError naming it."""

from __future__ import annotations

import math
from typing import Any

import pytest

from rkv.errors import ConfigError
from rkv.eval.faults.campaign import CampaignConfig


@pytest.mark.parametrize(("field", "value", "needle"), [
    ("trials", True, "campaign trials"),
    ("trials", 0, "campaign trials"),
    ("blocks", 2.0, "campaign blocks"),
    ("hours", math.nan, "campaign hours"),
    ("hours", math.inf, "campaign hours"),
    ("hours", -1, "campaign hours"),
    ("tilt", math.inf, "campaign tilt"),
    ("tilt", -0.5, "campaign tilt"),
    ("tilt", "twice", "campaign tilt"),
    ("tier", "ssd", "campaign tier"),
    ("bits", 3, "campaign bits"),
    ("bits", True, "campaign bits"),
    ("dtype", "int8", "campaign dtype"),
    ("seed", -1, "campaign seed"),
    ("fault_model", 7, "campaign fault_model"),
    ("protection", None, "campaign protection"),
    ("sampling", "all", "campaign sampling"),
])
def test_bad_values(field: str, value: Any, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        CampaignConfig.from_dict({field: value})


def test_unknown_key_and_good_values() -> None:
    with pytest.raises(ConfigError, match="campaign: unknown key"):
        CampaignConfig.from_dict({"trails": 10})
    cfg = CampaignConfig.from_dict({"campaign": {"trials": 3, "tilt": "auto", "hours": 0.5}})
    assert (cfg.trials, cfg.tilt, cfg.hours) == (3, "auto", 0.5)
