"""The tensor-level quality metrics and the KV transforms (no model needed)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rkv.cli.quality import quality_settings
from rkv.eval.quality import (
    RkvRoundTrip,
    attention_error,
    cast_to,
    raw_flips,
    raw_model_faults,
    snr_db,
)


def test_snr() -> None:
    x = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    assert snr_db(x, x) == math.inf
    assert snr_db(x, x + 0.1 * x) == pytest.approx(20.0, abs=1e-3)
    y = x.copy()
    y[3] = np.nan
    assert math.isnan(snr_db(x, y))


def test_attention_error() -> None:
    rng = np.random.default_rng(1)
    q = rng.standard_normal((6, 4, 16))
    k = rng.standard_normal((3, 10, 16))
    v = rng.standard_normal((3, 10, 16))
    assert attention_error(q, k, v, k, v) == 0
    small = attention_error(q, k, v, k + 1e-3, v)
    big = attention_error(q, k, v, k + 1e-1, v + 1e-1)
    assert 0 < small < big < 1
    bad = k.copy()
    bad[0, 0, 0] = np.inf
    assert attention_error(q, k, v, bad, v) == math.inf


def test_transforms() -> None:
    kv = np.random.default_rng(2).standard_normal((2, 2, 32, 1, 8)).astype(np.float32)
    tokens = list(range(32))
    out, rep = cast_to("float16")(kv, tokens)
    assert out.dtype == kv.dtype and 0 < np.abs(out - kv).max() < 1e-2
    out, rep = raw_flips(1e-3)(kv, tokens)
    assert rep["flipped_bits"] > 0 and not np.array_equal(out, kv)
    out2, _ = raw_flips(1e-3)(kv, tokens)
    assert np.array_equal(out, out2, equal_nan=True)             # seeded
    same, rep = RkvRoundTrip(chunk_tokens=16)(kv, tokens)
    assert same is not None and np.array_equal(same, kv) and rep["ok"] == 4
    lost, rep = RkvRoundTrip(chunk_tokens=16, fault_model={"model": "raw-ber", "ber": 1e-3})(
        kv, tokens)
    assert lost is None and rep["uncorrectable"] >= 1           # detected: recompute
    fixed, rep = RkvRoundTrip(chunk_tokens=16, ecc="rs(255,223)",
                              fault_model={"model": "raw-ber", "ber": 1e-4})(kv, tokens)
    assert fixed is not None and np.array_equal(fixed, kv)
    quant, _ = RkvRoundTrip(chunk_tokens=16, quant="kivi(bits=8)")(kv, tokens)
    assert quant is not None and 0 < np.abs(quant - kv).max() < 0.05
    peer, rep = raw_model_faults({"model": "raw-ber", "ber": 1e-3}, 1.0)(kv, tokens)
    assert peer is not None and rep["flipped_bits"] > 0


def test_quality_settings_rows() -> None:
    rows = quality_settings([16, 4], 1e-5, "rs(255,239)", 32)
    labels = [label for label, _ in rows]
    assert labels[0].startswith("fp32 cache") and any("kivi 4 bits" in x for x in labels)
    assert any(x.startswith("raw storage") for x in labels)
    assert len(quality_settings([16], 0.0, "rs(255,239)", 32)) == 3
