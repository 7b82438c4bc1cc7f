"""Quality profiles (``rkv.eval.calibrate``): schema, loader, the additive estimate, the shipped
SmolLM2-135M profile (weights 4-bit Q4_1), and one small real measurement."""

from __future__ import annotations

import json
import math
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rkv.errors import ConfigError
from rkv.eval.calibrate import (
    BITS,
    KINDS,
    MAX_PROFILE_BYTES,
    Profile,
    load_profile,
    parse_profile,
    read_profile,
    smollm2_spec,
    validate_profile,
    write_profile,
)

SHIPPED = Path(__file__).resolve().parent.parent / "rkv" / "profiles" / "smollm2-135m.json"


def small_profile(n_layers: int = 2) -> dict[str, Any]:
    keys = [f"{i}:{k}:{b}" for i in range(n_layers) for k in KINDS for b in BITS]
    return {"model": "toy", "fingerprint": "0" * 32, "weights": "Q4_1", "windows": 3,
            "text": ["toy text"],
            "kl": {k: float(i + 1) / 100 for i, k in enumerate(keys)},
            "kl_se": {k: 0.001 for k in keys}, "ppl": {k: 20.0 for k in keys}}


@pytest.fixture(scope="module")
def shipped() -> Profile:
    return load_profile("smollm2-135m")


# -- the shipped profile ---------------------------------------------------------------------
def test_shipped_profile_covers_every_block(shipped: Profile) -> None:
    raw = json.loads(SHIPPED.read_text())
    want = {f"{i}:{k}:{b}" for i in range(30) for k in ("k", "v") for b in (8, 4, 2)}
    assert set(raw["kl"]) == set(raw["kl_se"]) == set(raw["ppl"]) == want
    assert shipped.n_layers == 30 and shipped.weights == "Q4_1" and shipped.windows >= 8
    assert raw["fingerprint"] == smollm2_spec().fingerprint().hex() == shipped.fingerprint
    assert shipped.text and all(isinstance(t, str) for t in shipped.text)


def test_load_profile_by_name_fingerprint_spec_and_path(shipped: Profile) -> None:
    spec = smollm2_spec()
    assert load_profile(spec.fingerprint().hex()) == shipped
    assert load_profile(spec.fingerprint()) == shipped
    assert load_profile(spec) == shipped
    assert load_profile(shipped.model) == shipped
    assert load_profile(SHIPPED) == shipped and load_profile(str(SHIPPED)) == shipped
    with pytest.raises(ConfigError, match="no quality profile"):
        load_profile("llama-70b")
    with pytest.raises(ConfigError, match="no quality profile"):
        load_profile(spec.__class__("other/model", n_layers=2, n_kv_heads=1, head_dim=8))
    with pytest.raises(ConfigError):
        load_profile(3)  # type: ignore[arg-type]


def test_shipped_profile_monotone_in_bits(shipped: Profile) -> None:
    for kind in KINDS:
        m8, m4, m2 = (shipped.mean_kl(kind, b) for b in (8, 4, 2))
        assert 0 < m8 < m4 < m2, (kind, m8, m4, m2)
        # and by a margin, not by noise: each halving of the bits costs at least 4x
        assert m4 > 4 * m8 and m2 > 4 * m4
    assert shipped.meta["kl_floor"] < 1e-3 * shipped.mean_kl("v", 8)
    assert all(p > 1 for p in shipped.ppl.values())


# -- Profile.kl and additive -----------------------------------------------------------------
def test_kl_lookup_and_additive() -> None:
    p = validate_profile(small_profile())
    assert p.kl(0, "k", 8) == pytest.approx(0.01) and p.kl(1, "v", 2) == pytest.approx(0.12)
    assert p.kl(1, "k", 16) == 0.0 and p.se(1, "k", 16) == 0.0
    plan = {(0, "k"): 8, (0, "v"): 4, (1, "k"): 16, (1, "v"): 2}
    assert p.additive(plan) == pytest.approx(0.01 + 0.05 + 0.12)
    assert p.additive({}) == 0.0
    assert p.mean_kl("k", 8) == pytest.approx((0.01 + 0.07) / 2)
    assert p.ranked("k", 8)[0] == (1, pytest.approx(0.07))
    for bad in ({(2, "k"): 8}, {(0, "q"): 8}, {(0, "k"): 3}, {(0, "k"): True},
                {(-1, "k"): 8}, {0: 8}, {("0", "k"): 8}):
        with pytest.raises(ConfigError):
            p.additive(bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        p.additive([((0, "k"), 8)])  # type: ignore[arg-type]


def test_write_read_round_trip(tmp_path: Path) -> None:
    p = validate_profile({**small_profile(3), "ppl_ref": 20.0, "kl_floor": 0.0,
                          "prefix": 512, "quant": "kivi"})
    write_profile(p, tmp_path / "p.json")
    q = read_profile(tmp_path / "p.json")
    assert q == p and q.n_layers == 3 and q.meta["prefix"] == 512


# -- malformed and hostile profiles ----------------------------------------------------------
def _mut(f: Any) -> bytes:
    d = small_profile()
    f(d)
    return json.dumps(d).encode()


BAD: list[tuple[str, bytes, str]] = [
    ("not json", b"{'model': 1}", "not valid JSON"),
    ("pickle", pickle.dumps(small_profile()), "not valid JSON"),
    ("binary", b"\xff\xfe\x00garbage", "not valid JSON"),
    ("empty", b"", "not valid JSON"),
    ("list", b"[1, 2]", "JSON object"),
    ("nan", _mut(lambda d: d["kl"].__setitem__("0:k:8", "NAN")).replace(b'"NAN"', b"NaN"),
     "finite"),
    ("infinity", _mut(lambda d: d["ppl"].__setitem__("0:k:8", "INF")).replace(b'"INF"',
                                                                              b"Infinity"),
     "finite"),
    ("duplicate key", b'{"model": "a", "model": "b"}', "repeats"),
    ("missing field", _mut(lambda d: d.pop("kl_se")), "missing"),
    ("unknown field", _mut(lambda d: d.__setitem__("__reduce__", 1)), "unknown"),
    ("bool windows", _mut(lambda d: d.__setitem__("windows", True)), "windows"),
    ("zero windows", _mut(lambda d: d.__setitem__("windows", 0)), "windows"),
    ("string kl", _mut(lambda d: d["kl"].__setitem__("0:k:8", "0.1")), "number"),
    ("negative kl", _mut(lambda d: d["kl"].__setitem__("0:k:8", -0.5)), ">= 0"),
    ("zero ppl", _mut(lambda d: d["ppl"].__setitem__("0:k:8", 0)), "> 0"),
    ("bad key", _mut(lambda d: d["kl"].__setitem__("0:q:8", 0.1)), "is not"),
    ("bits 16 key", _mut(lambda d: d["kl"].__setitem__("0:k:16", 0.1)), "is not"),
    ("leading zero", _mut(lambda d: d["kl"].__setitem__("01:k:8", 0.1)), "is not"),
    ("missing block", _mut(lambda d: d["kl"].pop("1:v:2")), "every layer"),
    ("se keys differ", _mut(lambda d: d["kl_se"].pop("0:k:8")), "every layer"),
    ("layer gap", _mut(lambda d: [d[f].__setitem__("5:k:8", 1.0) for f in
                                  ("kl", "kl_se", "ppl")]), "every layer"),
    ("empty kl", _mut(lambda d: [d.__setitem__(f, {}) for f in ("kl", "kl_se", "ppl")]),
     "empty"),
    ("fingerprint", _mut(lambda d: d.__setitem__("fingerprint", "XYZ")), "hex"),
    ("fingerprint type", _mut(lambda d: d.__setitem__("fingerprint", 12)), "type"),
    ("text type", _mut(lambda d: d.__setitem__("text", [1])), "text"),
    ("empty model", _mut(lambda d: d.__setitem__("model", "")), "model"),
    ("nested", b"[" * 100_000 + b"]" * 100_000, "not valid JSON|JSON object"),
    ("huge", b" " * (MAX_PROFILE_BYTES + 1), "larger"),
    ("meta type", _mut(lambda d: d.__setitem__("prefix", "512")), "prefix"),
]


@pytest.mark.parametrize(("data", "msg"), [(d, m) for _, d, m in BAD],
                         ids=[n for n, _, _ in BAD])
def test_malformed_profile_is_a_config_error(data: bytes, msg: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=msg):
        parse_profile(data)
    path = tmp_path / "bad.json"
    path.write_bytes(data)
    with pytest.raises(ConfigError, match=r"bad\.json"):
        load_profile(path)


def test_unreadable_profile_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_profile(tmp_path / "absent.json")
    with pytest.raises(ConfigError, match="cannot read"):
        read_profile(tmp_path)


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
                                                       shipped: Profile) -> None:
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
def test_additive_estimate_on_two_windows(smollm2: tuple[Any, Any], shipped: Profile) -> None:
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
