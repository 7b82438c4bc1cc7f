"""Calibration (``rkv.eval.calibrate``): the quantization it measures is the engine's, the
command line, and one small real measurement against the shipped SmolLM2-135M profile (weights
4-bit Q4_1); the profile file itself is tests/test_profiles.py."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from rkv.eval.calibrate import smollm2_spec
from rkv.profiles import BITS, KINDS, QualityProfile, load_profile


@pytest.fixture(scope="module")
def shipped() -> QualityProfile:
    return load_profile("smollm2-135m")


# -- the quantization the measurement uses is what the engine stores -----------------------
def test_quantize_plan_matches_engine_round_trip() -> None:
    from rkv.eval.calibrate_measure import quantize_plan
    from rkv.eval.quality import RkvRoundTrip

    rng = np.random.default_rng(0)
    kv = rng.normal(size=(2, 2, 300, 3, 64)).astype(np.float32)
    kv[:, 0, :, :, 5] *= 20                                   # an outlier key channel
    tokens = list(range(300))
    for bits in (8, 4, 2):
        stored, _ = RkvRoundTrip(quant=f"kivi(bits={bits})")(kv, tokens)
        assert stored is not None
        full = quantize_plan(kv, {(i, k): bits for i in range(2) for k in KINDS})
        assert np.array_equal(full, stored)
        only_k1 = quantize_plan(kv, {(1, "k"): bits, (0, "v"): 16})
        assert np.array_equal(only_k1[1, 0], stored[1, 0])
        assert np.array_equal(only_k1[1, 1], kv[1, 1]) and np.array_equal(only_k1[0], kv[0])


def test_block_bits_count_the_metadata() -> None:
    from rkv.eval.calibrate_measure import block_bits

    assert block_bits(16) == 16.0
    assert 8 < block_bits(8) < 12 and 4 < block_bits(4) < 8 and 2 < block_bits(2) < 6


def test_cli_has_calibrate() -> None:
    from rkv.cli.calibrate import calibrate_cmd

    ctx = calibrate_cmd.make_context("calibrate", ["--windows", "2", "--out", "x.json"])
    assert ctx.params["windows"] == 2 and ctx.params["out"] == "x.json"


# -- a small real measurement on the model (1 window, 2 layers) ----------------------------
@pytest.fixture(scope="module")
def smollm2() -> tuple[Any, Any]:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from rkv.eval.quality import load_smollm2

    return load_smollm2(threads=2)  # type: ignore[no-any-return]


def test_small_measurement_agrees_with_shipped_profile(smollm2: tuple[Any, Any],
                                                       shipped: QualityProfile) -> None:
    from rkv.adapters.hf import model_spec
    from rkv.eval.calibrate_measure import (
        calibration_windows,
        hf_case,
        hf_reference_lp,
        quantize_plan,
        reference,
        run_cases,
        window_cases,
    )
    from rkv.eval.quality import SMOLLM2_ID

    model, tok = smollm2
    assert model_spec(model, SMOLLM2_ID) == smollm2_spec()
    ids = calibration_windows(tok, 1, ("docs",))[0][0]
    ref = reference(model, ids)
    # the fast path's reference is the model's own forward, to the bit
    assert float((hf_reference_lp(model, ids) - ref.ref_lp).abs().max()) == 0.0
    assert abs(run_cases(model, ref, 0, [{}])[0][0]) < 1e-12
    # one quantized block: the fast path (layers >= 7 only) equals the model's full forward
    kv2 = quantize_plan(ref.kv, {(7, "k"): 2})
    fast = run_cases(model, ref, 7, [{(7, "k"): kv2[7, 0]}])[0]
    slow = hf_case(model, ids, ref, kv2)
    assert fast[0] == pytest.approx(slow[0], rel=1e-6) and fast[1] == pytest.approx(slow[1])

    kl, _nll, nll_ref, floor = window_cases(model, ids, layers=[0, 15])
    assert set(kl) == {f"{i}:{k}:{b}" for i in (0, 15) for k in KINDS for b in BITS}
    assert abs(floor) < 1e-12 and math.isfinite(nll_ref)
    for key, value in kl.items():
        layer, kind, bits = key.split(":")
        if bits == "8":     # tiny and noisy per window: only bounded by the 4-bit value
            assert value < max(kl[f"{layer}:{kind}:4"], 10 * shipped.kl_mean[key])
            continue
        ratio = value / shipped.kl_mean[key]
        assert 0.1 < ratio < 10, (key, value, shipped.kl_mean[key])
    for layer in (0, 15):
        for kind in KINDS:
            assert kl[f"{layer}:{kind}:2"] > kl[f"{layer}:{kind}:4"]


@pytest.mark.slow
def test_additive_estimate_on_two_windows(smollm2: tuple[Any, Any],
                                          shipped: QualityProfile) -> None:
    """A mixed plan measured on two fresh windows lands within 3x of the additive sum."""
    from rkv.eval.calibrate_measure import heldout_windows, hf_case, quantize_plan, reference

    model, tok = smollm2
    plan = {(i, k): (4 if k == "k" else 2) if i >= 4 else 8 for i in range(30) for k in KINDS}
    kls = []
    for ids in heldout_windows(tok, shipped.windows, 2):
        ref = reference(model, ids)
        kls.append(hf_case(model, ids, ref, quantize_plan(ref.kv, plan))[0])
    ratio = float(np.mean(kls)) / shipped.additive(plan)
    assert 1 / 3 < ratio < 3
