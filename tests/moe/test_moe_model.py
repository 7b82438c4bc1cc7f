"""MoEfication (rkv.moe.model, rkv.moe.fit) on a tiny random Llama-style model; one slow test
on the real SmolLM2-135M."""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from rkv.errors import InputError, RkvError  # noqa: E402
from rkv.moe import fit as fitmod  # noqa: E402
from rkv.moe.experts import ExpertProvider, ExpertWeights, ResidentExperts  # noqa: E402
from rkv.moe.fit import FitCacheError, load_fit  # noqa: E402
from rkv.moe.model import MoEModel  # noqa: E402

LAYERS, D, FF, VOCAB = 3, 32, 64, 97


def tiny_model(seed: int = 0) -> Any:
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=D, intermediate_size=FF,
                                   num_hidden_layers=LAYERS, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=128)
    model = transformers.LlamaForCausalLM(cfg)
    model.eval()
    return model


def calib(n: int = 3, length: int = 40, seed: int = 1) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, VOCAB, length).tolist() for _ in range(n)]


def build(tmp_path: Path, e: int = 4, k: int = 2, **kw: Any) -> MoEModel:
    return MoEModel.build(tiny_model(), e, k, cache_dir=tmp_path, calibration=calib(), **kw)


class Recording:
    """Provider that records every request and hint."""

    def __init__(self, inner: ExpertProvider) -> None:
        self.inner = inner
        self.requests: list[tuple[int, list[int]]] = []
        self.hints: list[tuple[int, list[int]]] = []

    def experts(self, layer: int, ids: Sequence[int]) -> Mapping[int, ExpertWeights]:
        self.requests.append((layer, list(ids)))
        return self.inner.experts(layer, ids)

    def hint(self, layer: int, ids: Iterable[int]) -> None:
        self.hints.append((layer, list(ids)))


IDS = [5, 17, 3, 88, 42, 42, 7, 0, 63, 11, 29, 30]


def logits(model: Any, ids: Sequence[int]) -> Any:
    with torch.no_grad():
        return model(torch.tensor([list(ids)]), use_cache=False).logits[0]


def test_k_equals_e_reproduces_the_dense_model(tmp_path: Path) -> None:
    dense = logits(tiny_model(), IDS)
    for e in (4, 8):
        moe = MoEModel.build(tiny_model(), e, e, cache_dir=tmp_path, calibration=calib())
        torch.testing.assert_close(logits(moe, IDS), dense, rtol=1e-5, atol=1e-5)
        moe.set_top_k(1)
        assert not torch.allclose(logits(moe, IDS), dense, atol=1e-3)
        moe.set_top_k(e)
        torch.testing.assert_close(logits(moe, IDS), dense, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(logits(moe.restore(), IDS), dense, rtol=0, atol=0)


def test_experts_partition_the_neurons(tmp_path: Path) -> None:
    model = tiny_model()
    dense = [fitmod.dense_weights(la.mlp) for la in model.model.layers]
    moe = MoEModel.build(model, 8, 2, cache_dir=tmp_path, calibration=calib())
    assert moe.fit.perm.shape == (LAYERS, FF)
    for i, (gate, up, down) in enumerate(dense):
        perm = moe.fit.perm[i]
        assert sorted(perm.tolist()) == list(range(FF))
        experts = moe.experts[i]
        assert len(experts) == 8 and {x.gate.shape for x in experts} == {(FF // 8, D)}
        assert {x.down.shape for x in experts} == {(D, FF // 8)}
        np.testing.assert_array_equal(np.concatenate([x.gate for x in experts]), gate[perm])
        np.testing.assert_array_equal(np.concatenate([x.up for x in experts]), up[perm])
        np.testing.assert_array_equal(np.concatenate([x.down for x in experts], axis=1),
                                      down[:, perm])
    spec = moe.spec
    assert (spec.layers, spec.experts, spec.top_k, spec.d_model, spec.d_ff) == (
        LAYERS, 8, 2, D, FF)
    assert spec.expert_bytes == 3 * (FF // 8) * D * 2
    assert len(spec.fingerprint) == 64


def test_provider_sees_the_union_of_routed_experts(tmp_path: Path) -> None:
    moe = build(tmp_path, e=8, k=2, hint=False)
    rec = Recording(ResidentExperts(moe.experts))
    moe.set_provider(rec)
    routes = moe.route(IDS)
    assert routes.experts.shape == (len(IDS), LAYERS, 2)
    assert routes.scores.shape == (len(IDS), LAYERS, 2)
    assert np.all(np.diff(routes.scores, axis=2) <= 0)          # descending scores
    assert [layer for layer, _ in rec.requests] == list(range(LAYERS))  # once per layer
    for layer, ids in rec.requests:
        assert ids == sorted(set(routes.experts[:, layer].ravel().tolist()))
    assert rec.hints == []
    assert routes.hints.shape == routes.experts.shape and np.all(routes.hints[:, 0] == -1)
    # a single token's hint for layer l+1 is routes.hints[t, l+1]
    moe.set_hint(True)
    rec.requests.clear()
    logits(moe, IDS[:1])
    assert rec.hints == [(la, sorted(routes.hints[0, la].tolist())) for la in range(1, LAYERS)]
    # each token's routes are its own: a single token routes as in the batch (prefill)
    for t in (0, 5):
        one = moe.route(IDS[:t + 1]).experts[-1]
        np.testing.assert_array_equal(one, routes.experts[t])


def test_hint_is_speculative_routing_of_the_next_layer(tmp_path: Path) -> None:
    moe = build(tmp_path, e=8, k=2)
    assert moe.hint
    rec = Recording(ResidentExperts(moe.experts))
    moe.set_provider(rec)
    inputs: dict[int, Any] = {}
    for i, la in enumerate(moe.model.model.layers):
        la.mlp.register_forward_pre_hook(
            lambda _m, a, i=i: inputs.__setitem__(i, a[0].reshape(-1, D)))
    logits(moe, IDS)
    assert [layer for layer, _ in rec.hints] == list(range(1, LAYERS))
    for layer, ids in rec.hints:
        w = torch.from_numpy(moe.fit.router_w[layer])
        b = torch.from_numpy(moe.fit.router_b[layer])
        want = (inputs[layer - 1] @ w.T + b).topk(2, dim=-1).indices
        assert ids == sorted(set(want.ravel().tolist()))
    moe.set_hint(False)
    rec.hints.clear()
    logits(moe, IDS)
    assert rec.hints == []


def test_generation_asks_per_step(tmp_path: Path) -> None:
    moe = build(tmp_path, e=4, k=1)
    rec = Recording(ResidentExperts(moe.experts))
    moe.set_provider(rec)
    with torch.no_grad():
        out = moe.generate(torch.tensor([IDS[:4]]), max_new_tokens=3, do_sample=False)
    assert out.shape == (1, 7)
    # prefill + 2 decode steps, each asks every layer once, one expert per decode step
    assert len(rec.requests) == 3 * LAYERS
    assert all(len(ids) == 1 for _, ids in rec.requests[LAYERS:])


def test_bad_provider_and_settings(tmp_path: Path) -> None:
    moe = build(tmp_path)

    class Missing:
        def experts(self, layer: int, ids: Sequence[int]) -> Mapping[int, ExpertWeights]:
            return {}

        def hint(self, layer: int, ids: Iterable[int]) -> None:
            return None

    moe.set_provider(Missing())
    with pytest.raises(RkvError, match="no weights"):
        logits(moe, IDS)
    moe.set_provider(None)
    logits(moe, IDS)
    for k in (0, 5):
        with pytest.raises(InputError):
            moe.set_top_k(k)
    with pytest.raises(InputError):
        moe.route([])
    with pytest.raises(InputError):
        MoEModel.build(tiny_model(), 5, 1, cache_dir=tmp_path, calibration=calib())
    with pytest.raises(InputError):
        MoEModel.build(tiny_model(), 4, 1, cache_dir=tmp_path)


def test_fp16_read_only_experts(tmp_path: Path) -> None:
    moe = build(tmp_path, e=4, k=4)
    want = logits(moe, IDS)

    def half(x: ExpertWeights) -> ExpertWeights:
        arrs = [a.astype(np.float16) for a in (x.gate, x.up, x.down)]
        for a in arrs:
            a.flags.writeable = False
        return ExpertWeights(*arrs)

    moe.set_provider(ResidentExperts([[half(x) for x in layer] for layer in moe.experts]))
    torch.testing.assert_close(logits(moe, IDS), want, rtol=0.05, atol=0.05)


# -- the fit cache -----------------------------------------------------------------------
def test_cache_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = build(tmp_path)
    files = list(tmp_path.glob("*.npz"))
    assert len(files) == 1

    def no_fit(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("refitted although cached")

    monkeypatch.setattr("rkv.moe.model.fit_moe", no_fit)
    second = build(tmp_path)
    np.testing.assert_array_equal(second.fit.perm, first.fit.perm)
    np.testing.assert_array_equal(second.fit.router_w, first.fit.router_w)
    assert second.fingerprint == first.fingerprint
    # another E, another calibration, another model: other cache keys
    with pytest.raises(AssertionError, match="refitted"):
        build(tmp_path, e=8)
    with pytest.raises(AssertionError, match="refitted"):
        MoEModel.build(tiny_model(), 4, 2, cache_dir=tmp_path, calibration=calib(seed=9))
    with pytest.raises(AssertionError, match="refitted"):
        MoEModel.build(tiny_model(seed=3), 4, 2, cache_dir=tmp_path, calibration=calib())


def _corruptions(path: Path) -> Iterable[tuple[str, bytes]]:
    good = path.read_bytes()
    yield "garbage", b"not a zip file at all"
    yield "truncated", good[: len(good) // 2]
    yield "empty", b""
    flipped = bytearray(good)
    flipped[len(flipped) // 3] ^= 0xFF
    yield "flipped", bytes(flipped)
    with np.load(path) as z:
        arrs = {k: z[k] for k in z.files}
    import io

    def npz(**changes: Any) -> bytes:
        buf = io.BytesIO()
        np.savez(buf, **{**arrs, **changes})
        return buf.getvalue()

    perm = arrs["perm"].copy()
    perm[0, 0] = perm[0, 1]
    yield "not a permutation", npz(perm=perm)
    yield "perm shape", npz(perm=arrs["perm"][:, :-1])
    w = arrs["router_w"].copy()
    w[0, 0, 0] = np.nan
    yield "nan router", npz(router_w=w)
    yield "router shape", npz(router_w=arrs["router_w"][:, :2])
    yield "other model", npz(fingerprint=np.array("0" * 64))
    yield "pickled", npz(perm=np.array([{"a": 1}], dtype=object))
    yield "missing key", _drop(arrs, "router_b")
    yield "version", npz(version=np.array(99))
    yield "seconds", npz(seconds=np.array([1.0, 2.0]))
    yield "seconds text", npz(seconds=np.array("x"))
    yield "int router", npz(router_w=arrs["router_w"].astype(np.int64))


def _drop(arrs: dict[str, Any], key: str) -> bytes:
    import io

    buf = io.BytesIO()
    np.savez(buf, **{k: v for k, v in arrs.items() if k != key})
    return buf.getvalue()


def test_corrupt_cache_is_a_typed_error_and_is_refitted(tmp_path: Path) -> None:
    first = build(tmp_path)
    (path,) = tmp_path.glob("*.npz")
    good = path.read_bytes()
    fit = first.fit
    args = (fit.model_fingerprint, fit.config_digest, LAYERS, FF, D, 4)
    assert load_fit(path, *args).perm.shape == (LAYERS, FF)
    for what, data in _corruptions(path):
        path.write_bytes(data)
        with pytest.raises(FitCacheError):
            load_fit(path, *args)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            again = build(tmp_path)
        assert any("refitting" in str(w.message) for w in caught), what
        np.testing.assert_array_equal(again.fit.perm, fit.perm)
        assert load_fit(path, *args).perm.shape == (LAYERS, FF)   # rewritten
    path.write_bytes(good)
    with pytest.raises(FileNotFoundError):
        load_fit(tmp_path / "absent.npz", *args)


def test_balanced_kmeans_groups_coactivated_neurons() -> None:
    rng = np.random.default_rng(0)
    # 4 planted groups of 8 neurons, each group active on its own tokens
    base = rng.random((4, 200)) < 0.3
    feats = np.repeat(base, 8, axis=0) * (1 + 0.1 * rng.random((32, 200)))
    order = rng.permutation(32)
    labels = fitmod.balanced_kmeans(feats[order], 4, 20, 0)
    truth = (np.arange(32) // 8)[order]
    assert sorted(np.bincount(labels).tolist()) == [8, 8, 8, 8]
    for c in range(4):
        assert len(set(truth[labels == c].tolist())) == 1


# -- the real model ----------------------------------------------------------------------
@pytest.mark.slow
def test_smollm2_moe(tmp_path: Path) -> None:
    """SmolLM2-135M, E = 8: k = E is the dense model; fit then cached (about 2 minutes)."""
    from rkv.eval.quality import load_smollm2
    from rkv.moe.model import heldout_text, load_moe_smollm2

    dense, tok = load_smollm2(threads=2)
    ids = heldout_text(tok, 1, 64)[0]
    want = logits(dense, ids)
    del dense
    moe, _ = load_moe_smollm2(8, 8, cache_dir=tmp_path, threads=2)
    torch.testing.assert_close(logits(moe, ids), want, rtol=1e-4, atol=1e-4)
    assert moe.spec.layers == 30 and moe.spec.expert_bytes == 3 * 192 * 576 * 2
    moe.set_top_k(4)
    lp, lq = (torch.log_softmax(x, -1) for x in (want, logits(moe, ids)))
    kl = float((lp.exp() * (lp - lq)).sum(-1).mean())
    assert 0 < kl < 10
