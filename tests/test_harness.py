"""The one fault-injection harness (rkv.eval.faults.harness), accelerated fault models, DUE handling
as the engine would, and quality confidence intervals."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import faultmodels
from faultmodels import ErrorPattern, FaultModelError
from rkv import ConfigError
from rkv.eval.faults.campaign import CampaignConfig, run_campaign
from rkv.eval.faults.harness import Harness
from rkv.eval.faults.validate import z_score
from rkv.eval.quality import RkvRoundTrip, mean_ci, raw_model_faults, t_quantile, text_windows
from rkv.format.model import ModelSpec
from rkv.reliability.analytic import predict

GOLDEN_DIR = Path(__file__).parent / "golden"
sys.path.insert(0, str(GOLDEN_DIR))
from make_harness_golden import CASES, GOLDEN, record  # noqa: E402
from rkvtest import tiny_llama  # noqa: E402

SMALL = {"chunk_tokens": 64, "kv_heads": 1, "head_dim": 64}


# -- one harness, same campaigns ---------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(CASES))
def test_campaigns_are_identical_to_the_golden_runs(name: str) -> None:
    """Recorded at b0a7f25, before campaigns ran on the harness, and re-recorded for record
    format 2 (8 more header bytes per copy move every sampled fault): every trial's faults,
    every block's outcome and the summary are the same."""
    want = json.loads(GOLDEN.read_text())[name]
    assert want["case"] == json.loads(json.dumps(CASES[name]))
    got = json.loads(json.dumps(record(CASES[name]), sort_keys=True))
    assert got["rows"] == want["rows"]
    assert got["summary"] == want["summary"]


# -- the accelerated fault model -----------------------------------------------------------------
@given(ber=st.floats(1e-9, 1e-3), x=st.floats(0.01, 900.0), seed=st.integers(0, 2**32))
@settings(max_examples=30, deadline=None)
def test_accelerated_raw_ber_is_raw_ber_at_x_times_the_rate(ber: float, x: float,
                                                            seed: int) -> None:
    m = faultmodels.accelerate({"model": "raw-ber", "ber": ber}, x)
    plain = faultmodels.get_model({"model": "raw-ber", "ber": ber * x})
    assert m.p_any_error(4096, 1.0) == plain.p_any_error(4096, 1.0)
    a = m.sample(4096, 1.0, np.random.default_rng(seed))
    b = plain.sample(4096, 1.0, np.random.default_rng(seed))
    assert np.array_equal(a.flips, b.flips)
    assert faultmodels.get_model(m.params()) == m                  # round trip


@given(x=st.floats(1.5, 1e3), preset=st.sampled_from(["dram-ddr4", "dram-ddr5", "cxl",
                                                      "nvme-tlc"]))
@settings(max_examples=20, deadline=None)
def test_accelerated_presets_have_x_times_the_fault_events(x: float, preset: str) -> None:
    """Every class's expected count times x: -log P(no fault) scales by x exactly (to the
    binomial classes' (x - 1) p / 2), and so does every class's mean."""
    m = faultmodels.get_model(preset)
    fast = faultmodels.accelerate(m, x)
    p0, p1 = m.p_any_error(1 << 16, 24.0), fast.p_any_error(1 << 16, 24.0)
    assert -math.log1p(-p1) == pytest.approx(x * -math.log1p(-p0), rel=1e-6)
    for e0, e1 in zip(m.events(1 << 16, 24.0), fast.events(1 << 16, 24.0), strict=True):
        assert (e1.kind, e1.footprint_bytes, e1.detected, e1.transient) == (
            e0.kind, e0.footprint_bytes, e0.detected, e0.transient)
        assert e1.mean == pytest.approx(x * e0.mean, rel=1e-12)
    assert faultmodels.accelerate(fast, 2.0) == faultmodels.accelerate(m, 2 * x)


@pytest.mark.parametrize("bad", [0, -1.0, math.nan, math.inf, True, "2", None])
def test_a_bad_multiplier_is_a_typed_error(bad: Any) -> None:
    with pytest.raises(FaultModelError, match="ber_multiplier"):
        faultmodels.accelerate("raw-ber", bad)
    with pytest.raises(ConfigError, match="ber_multiplier"):
        CampaignConfig(ber_multiplier=bad, **SMALL)


def test_a_multiplier_past_a_probability_bound_names_the_class() -> None:
    fast = faultmodels.accelerate({"model": "raw-ber", "ber": 0.1}, 30)
    with pytest.raises(FaultModelError, match=r"independent bit flip.*exceeds 1"):
        fast.p_any_error(100, 1.0)
    with pytest.raises(ConfigError, match="exceeds 1"):
        CampaignConfig(fault_model={"model": "raw-ber", "ber": 0.1}, ber_multiplier=30,
                       **SMALL)
    lumpy = faultmodels.accelerate({"preset": "nvme-tlc", "device_ecc": "none",
                                    "overdispersion": 0.01}, 2)
    with pytest.raises(FaultModelError, match="no count law"):
        lumpy.sample(4096, 24.0, np.random.default_rng(0))
    m = faultmodels.get_model("cxl")
    assert faultmodels.accelerate(m, 1) is m and faultmodels.accelerate(m, 1.0) is m


@pytest.mark.parametrize(("spec", "protection", "x", "trials", "sampling"), [
    ({"model": "raw-ber", "ber": 2e-6}, "rs(255,251)", 60.0, 60, "direct"),
    ({"model": "raw-ber", "ber": 1e-7}, "none", 25.0, 40, "direct"),
    ({"preset": "nvme-tlc", "pe_cycles": 3000}, "rs(255,247,interleave=16)", 1e4, 40,
     "conditional"),
])
def test_campaign_at_multiplier_agrees_with_analytic_at_multiplier(
        spec: dict[str, Any], protection: str, x: float, trials: int, sampling: str) -> None:
    """Two-sided: the counts at x lie within |z| < 4 of predict(..., ber_multiplier=x), and
    the prediction differs from the one at x = 1 (so agreement is not by accident)."""
    cfg = CampaignConfig(tier="nvme", fault_model=spec, protection=protection, hours=720.0,
                         trials=trials, blocks=10, seed=21, sampling=sampling,
                         ber_multiplier=x, **SMALL)
    s = run_campaign(cfg)
    p = predict(cfg.protection_pipeline(), cfg.data_bytes, faultmodels.get_model(spec), 720.0,
                ber_multiplier=x)
    assert p == s.prediction
    base = predict(cfg.protection_pipeline(), cfg.data_bytes, faultmodels.get_model(spec),
                   720.0)
    assert p.p_error > 2 * base.p_error
    n = s.blocks
    hit = n - s.counts["clean"]
    if sampling == "conditional":
        for outcome, rate in (("due", p.p_due), ("corrected", p.p_corrected)):
            got = s.counts[outcome] + (s.counts["masked"] if outcome == "corrected" else 0)
            assert abs(z_score(got, n, rate / p.p_error)) < 4, (outcome, s.counts, p)
    else:
        assert abs(z_score(hit, n, p.p_error)) < 4, (s.counts, p)
        assert abs(z_score(s.counts["due"], n, p.p_due)) < 4, (s.counts, p)
    assert s.counts["sdc"] == 0


def test_campaign_config_carries_the_multiplier(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text('[campaign]\nprotection = "rs(255,239)"\nber_multiplier = 100\n'
                 '[campaign.fault_model]\nmodel = "raw-ber"\nber = 1e-9\n')
    cfg = CampaignConfig.load(f)
    assert cfg.ber_multiplier == 100
    assert cfg.model().params()["ber_multiplier"] == 100
    assert cfg.model().p_any_error(1000, 1.0) == pytest.approx(1 - (1 - 1e-7) ** 8000)
    assert CampaignConfig.from_dict(cfg.to_dict()) == cfg


# -- the harness: DUE as a shorter verified prefix ------------------------------------------------
SPEC = ModelSpec("harness/test", n_layers=2, n_kv_heads=1, head_dim=8, dtype="float32")


def _kv(tokens: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((2, 2, tokens, 1, 8)).astype(np.float32)


def _lose(h: Harness, key: bytes) -> None:
    """An uncorrectable fault: every byte of the record's data replaced (no code can fix
    it, the checksums say so)."""
    n = h.record_bytes(key)
    h.inject(key, ErrorPattern(n, np.arange(8 * (n // 2), 8 * n, 7, dtype=np.int64)))


@given(j=st.integers(0, 3), layer=st.integers(0, 1), ecc=st.sampled_from(["none", "rs(255,239)"]))
@settings(max_examples=12, deadline=None)
def test_a_lost_block_ends_the_verified_prefix_there(j: int, layer: int, ecc: str) -> None:
    tokens = list(range(100, 164))
    kv = _kv(64)
    with Harness.temporary(ecc=ecc, chunk_tokens=16) as h:
        h.put(tokens, kv, SPEC)
        _lose(h, h.keys(tokens, SPEC)[j][layer])
        got = h.read(tokens, SPEC)
    assert got.n_tokens == 16 * j and got.kv.shape[2] == 16 * j
    assert np.array_equal(got.kv, kv[:, :, :16 * j])          # reused exactly
    assert got.due_blocks == 1 and got.recompute_tokens == 64 - 16 * j
    rep = got.report()
    assert rep["due_blocks"] == 1 and rep["recomputed_tokens"] == 64 - 16 * j


def test_round_trip_returns_the_verified_prefix_and_counts_it(monkeypatch: Any) -> None:
    """RkvRoundTrip (through the harness) hands back the verified prefix, not None, and adds
    DUE blocks and tokens to recompute to its stats."""
    tokens = list(range(64))
    kv = _kv(64, 1)
    from rkv.eval.faults.harness import kv_spec

    real = Harness.inject_model

    def lose_chunk_2(self: Harness, model: Any, hours: float, rng: Any) -> list[Any]:
        _lose(self, self.keys(tokens, kv_spec(kv, "quality/kv"))[2][1])
        return real(self, model, hours, rng)

    monkeypatch.setattr(Harness, "inject_model", lose_chunk_2)
    rt = RkvRoundTrip(chunk_tokens=16, ecc="rs(255,239)",
                      fault_model={"model": "raw-ber", "ber": 1e-9})
    out, rep = rt(kv, tokens)
    assert out is not None and out.shape[2] == 32 and np.array_equal(out, kv[:, :, :32])
    assert rep["due_blocks"] == 1 and rep["recomputed_tokens"] == 32
    rt(kv, tokens)
    assert rt.stats["due_blocks"] == 2 and rt.stats["recomputed_tokens"] == 64


def test_raw_storage_returns_wrong_values_until_the_medium_reports_a_loss() -> None:
    tokens = list(range(64))
    kv = _kv(64, 2)
    with Harness.temporary(raw=True, chunk_tokens=16) as h:
        h.put(tokens, kv, SPEC)
        keys = h.keys(tokens, SPEC)
        n = h.record_bytes(keys[1][0])
        h.inject(keys[1][0], ErrorPattern(n, np.array([30, 31], dtype=np.int64)))
        h.inject(keys[3][1], ErrorPattern(n, erasures=((0, 64, "sector"),)))
        got = h.read(tokens, SPEC)
    assert got.n_tokens == 48                                  # up to the reported loss
    assert not np.array_equal(got.kv, kv[:, :, :48])           # the flips came back (SDC)
    assert np.array_equal(got.kv[1], kv[1, :, :48])


def test_raw_model_faults_reports_flips_and_erasures() -> None:
    tokens = list(range(64))
    kv = _kv(64, 3)
    out, rep = raw_model_faults({"model": "raw-ber", "ber": 1e-3}, 1.0, chunk_tokens=16)(
        kv, tokens)
    assert out is not None and out.shape == kv.shape and rep["flipped_bits"] > 0
    again, _ = raw_model_faults({"model": "raw-ber", "ber": 1e-3}, 1.0, chunk_tokens=16)(
        kv, tokens)
    assert np.array_equal(out, again, equal_nan=True)                  # seeded
    fast, rep10 = raw_model_faults({"model": "raw-ber", "ber": 1e-4}, 1.0, chunk_tokens=16,
                                   ber_multiplier=10)(kv, tokens)
    assert rep10["flipped_bits"] == rep["flipped_bits"]                # same draws at 10x
    assert np.array_equal(fast, out, equal_nan=True)


# -- the evaluation recomputes what the read did not return ---------------------------------------
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny() -> Any:
    return tiny_llama()


@pytest.mark.parametrize("keep", [0, 16, 32])
def test_recompute_reuses_the_verified_prefix_and_recomputes_the_rest(tiny: Any,
                                                                      keep: int) -> None:
    from rkv.adapters.hf import kv_from_cache
    from rkv.eval.quality import _recompute

    x = torch.tensor([list(np.random.default_rng(4).integers(0, 97, 60))])
    with torch.no_grad():
        pre = tiny(x[:, :48], use_cache=True)
        kv = kv_from_cache(pre.past_key_values)
        marked = kv[:, :, :keep] + 0.5          # reused KV is visibly not the reference's
        full, last = _recompute(tiny, x, kv, marked if keep else None, pre, 48)
    assert full.shape == kv.shape
    if keep:
        assert np.array_equal(full[:, :, :keep], marked)        # exactly what was read
        assert not np.allclose(full[:, :, keep:], kv[:, :, keep:], atol=1e-3)  # built on it
    else:
        assert np.array_equal(full, kv) and torch.equal(last, pre.logits[:, -1:])


def test_evaluate_counts_recomputed_tokens_and_stays_close(tiny: Any) -> None:
    from rkv.eval.quality import evaluate

    windows = [list(np.random.default_rng(i).integers(0, 97, 60)) for i in range(3)]

    def first_chunk_only(kv: np.ndarray, tokens: list[int]) -> tuple[np.ndarray, dict[str, int]]:
        return kv[:, :, :16].copy(), {"due_blocks": 1}

    q = evaluate(tiny, windows, first_chunk_only, prefix=48, label="due")
    assert q.recomputed == 3 and q.recomputed_tokens == 3 * 32
    assert q.report == {"due_blocks": 3}
    assert q.kl < 1e-6 and q.top1 == 1.0                       # recomputed, not lost
    assert [w["recomputed_tokens"] for w in q.per_window] == [32, 32, 32]
    ci = q.ci()
    assert set(ci) == {"perplexity", "delta_perplexity", "kl", "top1"}
    assert abs(ci["delta_perplexity"].mean) < 1e-3
    ref = evaluate(tiny, windows, None, prefix=48)
    assert ref.recomputed_tokens == 0 and ref.ci()["kl"].mean == 0


def test_evaluate_many_shares_the_reference_and_matches_evaluate(tiny: Any) -> None:
    from rkv.eval.quality import cast_to, evaluate, evaluate_many

    windows = [list(np.random.default_rng(10 + i).integers(0, 97, 60)) for i in range(2)]
    settings = [("ref", None), ("fp16", cast_to("float16")),
                ("kivi2", RkvRoundTrip(quant="kivi(bits=2)", chunk_tokens=16))]
    many = evaluate_many(tiny, windows, settings, prefix=48)
    for (label, t), q in zip(settings, many, strict=True):
        one = evaluate(tiny, windows, t, prefix=48, label=label)
        assert q.label == label and q.row() == one.row()
    assert many[0].kl == 0 and 0 < many[1].kl < many[2].kl


# -- confidence intervals -------------------------------------------------------------------------
@pytest.mark.parametrize(("df", "value"), [(1, 12.706), (2, 4.303), (3, 3.182), (4, 2.776),
                                           (7, 2.365), (11, 2.201), (30, 2.042), (120, 1.980)])
def test_t_quantile_matches_the_tables(df: int, value: float) -> None:
    assert t_quantile(0.975, df) == pytest.approx(value, abs=6e-4)


def test_t_intervals_cover_the_mean_95_percent_of_the_time() -> None:
    """Normal data: coverage within binomial noise of 95 % for 4 and 12 windows; skewed
    (exponential) data with 12 windows: a little below (t-intervals assume symmetry), above
    88 %."""
    rng = np.random.default_rng(0)
    reps = 3000
    for n, draw, mean, low in ((4, lambda: rng.normal(2.0, 3.0, 4), 2.0, 0.935),
                               (12, lambda: rng.normal(-1.0, 0.1, 12), -1.0, 0.935),
                               (12, lambda: rng.exponential(0.2, 12), 0.2, 0.88)):
        hits = 0
        for _ in range(reps):
            c = mean_ci(draw())
            hits += c.low <= mean <= c.high
        assert low <= hits / reps <= 0.965, (n, hits / reps)


@given(st.lists(st.floats(-1e3, 1e3), min_size=2, max_size=30))
@settings(max_examples=50, deadline=None)
def test_mean_ci_is_centred_and_holds_the_mean(xs: list[float]) -> None:
    c = mean_ci(xs)
    assert c.low <= c.mean <= c.high and c.n == len(xs)
    assert c.high - c.mean == pytest.approx(c.mean - c.low, abs=1e-6)


def test_mean_ci_edge_cases() -> None:
    assert math.isnan(mean_ci([3.0]).half) and mean_ci([3.0]).mean == 3.0
    assert mean_ci([0.0, 0.0, 0.0]).half == 0
    assert math.isnan(mean_ci([1.0, math.inf]).low)


# -- text windows ---------------------------------------------------------------------------------
class _CharTokenizer:
    def __call__(self, text: str) -> Any:
        from types import SimpleNamespace

        return SimpleNamespace(input_ids=[ord(c) % 251 for c in text])


def test_text_windows_topics_are_the_historical_windows_and_docs_are_added() -> None:
    from pydoc_data.topics import topics

    tok = _CharTokenizer()
    text = "\n\n".join(topics[k] for k in sorted(topics))
    ids = tok(text[: 40 * 100 * 5]).input_ids
    step = len(ids) // 4
    assert text_windows(tok, 4, 100) == [ids[i * step:i * step + 100] for i in range(4)]
    both = text_windows(tok, 6, 100, sources="topics,docs")
    assert len(both) == 6 and all(len(w) == 100 for w in both)
    assert both[0] == text_windows(tok, 3, 100)[0]
    assert both[1] == text_windows(tok, 3, 100, sources=["docs"])[0]
    assert both[1] not in text_windows(tok, 3, 100)
