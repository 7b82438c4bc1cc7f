"""The connector's parts without a running vLLM: settings, the identity its keys bind, the
paged layouts and the canary (against a reference writer, and against vLLM's own CPU
cache kernel where vLLM is installed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from vllm_jobs import HAVE_VLLM, needs_vllm

from rkv import Engine, EngineConfig, ModelSpec, TierConfig
from rkv.adapters.vllm_layout import LAYOUTS, resolve_layout, run_canary
from rkv.adapters.vllm_settings import ConnectorSettings, KVShape, model_spec, weights_digest
from rkv.errors import ConfigError

torch = pytest.importorskip("torch")
H, D, BS = 3, 64, 32


def cpu_vec_writer(key: Any, value: Any, kv: Any, slots: Any) -> None:
    """What vLLM's CPU kernel does (cpu_attn_reshape_and_cache, vec ISA), written out: per
    block and head the keys transposed ([head_dim, block_size]), then the values."""
    nb, h, bs, _ = kv.shape
    tiles = kv.view(nb, h, 2, bs * D)
    for i, s in enumerate(slots.tolist()):
        b, o = divmod(s, bs)
        tiles[b, :, 0].view(h, D, bs)[:, :, o] = key[i]
        tiles[b, :, 1].view(h, bs, D)[:, o, :] = value[i]


def _engine(tmp_path: Path) -> Engine:
    tier = TierConfig("dram", medium="memory", path="t/dram", capacity_bytes=1 << 28)
    return Engine.open(tmp_path / "s", EngineConfig(chunk_tokens=64, tiers=(tier,)))


def _canary(tmp_path: Path, name: str, writer: Any, bs: int = BS, chunk: int = 64
            ) -> str | None:
    like = torch.zeros((8, H, bs, 2 * D))
    spec = ModelSpec("rkv-canary", n_layers=1, n_kv_heads=H, head_dim=D, dtype="float32")
    with _engine(tmp_path) as e:
        got = run_canary(e, spec, LAYOUTS[name], writer, like, block_size=bs,
                         chunk_tokens=chunk)
        assert e.lookup(list(range(chunk)), model=spec) == 0   # the canary leaves nothing
    return got


def test_the_canary_accepts_the_right_layout_and_refuses_the_others(tmp_path: Path) -> None:
    assert _canary(tmp_path / "a", "cpu-vec", cpu_vec_writer) is None
    for wrong in ("blocks-heads-kv-tokens", "blocks-heads-tokens-kv"):
        bad = _canary(tmp_path / wrong, wrong, cpu_vec_writer)
        assert bad is not None and "gathering vLLM-written KV" in bad


def test_gather_and_scatter_are_inverse_on_any_blocks() -> None:
    lay = LAYOUTS["cpu-vec"]
    layer = torch.randn((6, H, BS, 2 * D))
    views = lay.kv_views(layer, H, D, BS)
    ids = torch.tensor([4, 1, 3])
    kv = lay.gather(views, ids)
    assert kv.shape == (2, 3 * BS, H, D)
    out = torch.empty_like(kv)
    lay.gather_into(views, ids, out)
    assert torch.equal(out, kv)
    other = torch.zeros_like(layer)
    lay.scatter(lay.kv_views(other, H, D, BS), torch.tensor([0, 5, 2]), kv)
    assert torch.equal(other[0], layer[4]) and torch.equal(other[5], layer[1])
    assert torch.equal(other[2], layer[3]) and not other[1].any()


def test_a_layer_of_another_shape_is_refused() -> None:
    from rkv.errors import ShapeError

    with pytest.raises(ShapeError, match="expects"):
        LAYOUTS["cpu-vec"].kv_views(torch.zeros((4, H, BS, D)), H, D, BS)


def test_layout_resolution() -> None:
    assert resolve_layout("auto", "CPU_ATTN/vec").name == "cpu-vec"
    with pytest.raises(ConfigError, match="does not know the KV layout"):
        resolve_layout("auto", "CPU_ATTN/amx")
    with pytest.raises(ConfigError, match="unknown layout"):
        resolve_layout("nope", "CPU_ATTN/vec")


@pytest.mark.parametrize("bad", [
    {"store": "s", "stroe": 1}, {"store": "s", "load": "yes"}, {"store": "s", "chunk_tokens": 0},
    {"store": "s", "save_queue_mb": -1}, {"store": "s", "faults": [{"tier": "dram"}]},
    {"store": "s", "config": 3}])
def test_bad_settings_are_config_errors(bad: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        ConnectorSettings.from_extra(bad)


def test_settings_need_a_store(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RKV_VLLM_STORE", raising=False)
    with pytest.raises(ConfigError, match="needs a store"):
        ConnectorSettings.from_extra({})
    monkeypatch.setenv("RKV_VLLM_STORE", "/x")
    assert ConnectorSettings.from_extra({}).store == "/x"
    s = ConnectorSettings.from_extra({"store": "/y", "chunk_tokens": 512})
    cfg = s.engine_config()
    assert cfg is not None and cfg.chunk_tokens == 512


def _model_dir(tmp_path: Path, weights: bytes) -> Path:
    d = tmp_path / "m"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text("{}")
    (d / "model.safetensors").write_bytes(weights)
    return d


def test_keys_bind_weights_config_dtype_layout_and_salt(tmp_path: Path) -> None:
    d = _model_dir(tmp_path, b"\0" * 1000)
    shape = KVShape(30, 3, 64, 128, "float32")
    salt = {"vllm": "0.32.0", "backend": "CPU_ATTN/vec", "paged_layout": "cpu-vec", "salt": ""}

    def fp(**over: Any) -> bytes:
        kw: dict[str, Any] = {"shape": shape, "hf_config": "{}", "salt": salt, **over}
        return model_spec(str(d), kw.pop("shape"), model_id="vllm:Llama", **kw).fingerprint()

    base = fp()
    assert fp() == base
    assert fp(hf_config='{"rope_theta": 1}') != base
    assert fp(shape=KVShape(30, 3, 64, 128, "bfloat16")) != base
    assert fp(shape=KVShape(30, 4, 48, 128, "float32")) != base
    assert fp(salt={**salt, "paged_layout": "blocks-heads-kv-tokens"}) != base
    assert fp(salt={**salt, "vllm": "0.33.0"}) != base
    assert fp(salt={**salt, "salt": "b"}) != base
    assert fp(shape=KVShape(30, 3, 64, 256, "float32")) == base   # block size: same KV
    before = weights_digest(str(d))
    _model_dir(tmp_path, b"\0" * 999 + b"\1")                       # one weight byte
    assert weights_digest(str(d)) != before and fp() != base


@needs_vllm
def test_the_canary_against_vllms_own_cpu_kernel(tmp_path: Path) -> None:
    """vLLM's real cache writer (the kernel a prefill writes KV with) agrees with the
    reference writer above, and the canary accepts only cpu-vec for it."""
    from vllm import _custom_ops as ops

    def vllm_writer(key: Any, value: Any, kv: Any, slots: Any) -> None:
        nb, h, bs, _ = kv.shape
        kc, vc = kv.view(nb, h, 2 * bs, -1).chunk(2, dim=2)
        ops.cpu_attn_reshape_and_cache(key, value, kc, vc, slots, "vec", k_scale=1.0,
                                       v_scale=1.0, kv_cache_dtype="auto")

    key, value = torch.randn((BS, H, D)), torch.randn((BS, H, D))
    a, b = torch.zeros((2, H, BS, 2 * D)), torch.zeros((2, H, BS, 2 * D))
    slots = torch.arange(BS, 2 * BS)
    vllm_writer(key, value, a, slots)
    cpu_vec_writer(key, value, b, slots)
    assert torch.equal(a, b)
    assert _canary(tmp_path / "ok", "cpu-vec", vllm_writer) is None
    assert _canary(tmp_path / "bad", "blocks-heads-kv-tokens", vllm_writer) is not None


def test_vllm_is_where_the_test_command_says() -> None:
    """In .venv-vllm (scripts/test.sh's second run) vLLM must import: the serving tests
    must not skip there."""
    import sys

    if Path(sys.prefix).name == ".venv-vllm":
        assert HAVE_VLLM
