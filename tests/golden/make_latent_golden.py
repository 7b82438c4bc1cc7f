"""Regenerate tests/golden/faultmodels_latent0.json: fault-model and `predict` numbers of the
shipped presets as they were before latent faults (``latent_hours``) existed. With the default
``latent_hours = 0`` every number must stay the same (tests/test_faultmodels_latent.py).
Regenerate only for a deliberate change of the models' numbers:

    .venv/bin/python tests/golden/make_latent_golden.py
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

import faultmodels as fm
from rkv.reliability.analytic import predict

HERE = Path(__file__).parent
OUT = HERE / "faultmodels_latent0.json"

MODELS: dict[str, Any] = {
    "dram-ddr4": "dram-ddr4",
    "dram-ddr4-chipkill": {"preset": "dram-ddr4", "system_ecc": "chipkill"},
    "dram-ddr4-none": {"preset": "dram-ddr4", "system_ecc": "none"},
    "dram-ddr5": "dram-ddr5",
    "cxl": "cxl",
    "nvme-tlc": "nvme-tlc",
    "dram-ddr5-x10": ("accelerated", "dram-ddr5", 10.0),
}
SIZES = (4096, 196608, 1 << 20)
HOURS = (1.0 / 60.0, 1.0, 24.0, 8766.0)
#: (model key, code, data bytes, hours) for predict (a few: each takes seconds).
PREDICT = (
    ("dram-ddr5", "none", 196608, 24.0),
    ("cxl", "rs(255,247)", 196608, 1.0 / 60.0),
)


def model(key: str) -> fm.FaultModel:
    spec = MODELS[key]
    if isinstance(spec, tuple):
        return fm.accelerate(spec[1], spec[2])
    return fm.get_model(spec)


def compute() -> dict[str, Any]:
    out: dict[str, Any] = {"models": {}, "predict": []}
    for key in MODELS:
        m = model(key)
        rows: dict[str, Any] = {"p_any_error": [], "bit_error_prob": [], "event_means": [],
                                "sample_given_error": []}
        for h in HOURS:
            rows["bit_error_prob"].append([h, m.bit_error_prob(h)])
            for n in SIZES:
                rows["p_any_error"].append([n, h, m.p_any_error(n, h)])
            rows["event_means"].append([h, [e.mean for e in m.events(196608, h)]])
        rng = np.random.default_rng(7)
        for _ in range(3):
            pat = m.sample_given_error(196608, 24.0, rng)
            rows["sample_given_error"].append([pat.n_flips, pat.n_erased_bytes, pat.lost])
        out["models"][key] = rows
    for key, code, nbytes, h in PREDICT:
        p = predict(code, nbytes, model(key), h)
        out["predict"].append([key, code, nbytes, h, p.p_error, p.p_due])
    return out


if __name__ == "__main__":
    OUT.write_text(json.dumps(compute(), indent=1) + "\n", encoding="utf-8")
    print(f"wrote {OUT}")
