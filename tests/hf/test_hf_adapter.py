"""rkv as the prefix cache of a Hugging Face causal LM (a tiny random Llama: no download)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hf_helpers import corrupt
from rkvtest import local_config, tiny_llama

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from rkv import Engine  # noqa: E402
from rkv.adapters.hf import HFPrefixCache, cache_from_kv, kv_from_cache, model_spec  # noqa: E402


@pytest.fixture(scope="module")
def tiny() -> object:
    return tiny_llama()


def test_cache_round_trip_gives_identical_logits(tiny: object) -> None:
    model = tiny
    ids = torch.randint(0, 97, (1, 40))
    with torch.no_grad():
        pre = model(ids[:, :32], use_cache=True)
        kv = kv_from_cache(pre.cache)
        assert kv.shape == (2, 2, 32, 2, 16) and kv.dtype == np.float32
        a = model(ids[:, 32:], cache=cache_from_kv(kv, model.config), use_cache=True).logits
        b = model(ids[:, 32:], cache=pre.cache, use_cache=True).logits
    assert torch.equal(a, b)


def test_prefix_cache_restores_and_matches_a_fresh_prefill(tiny: object, tmp_path: Path
                                                           ) -> None:
    model = tiny
    ids = torch.randint(0, 97, (1, 50))
    with Engine.open(tmp_path / "s", local_config(16)) as e:
        pc = HFPrefixCache(e, model, model_id="tiny-llama")
        cold = pc.prefill(ids[:, :40])
        assert cold.restored_tokens == 0 and cold.computed_tokens == 40
        warm = pc.prefill(ids)      # 2 full chunks and the first prompt's 8-token tail
        assert warm.restored_tokens == 40 and warm.computed_tokens == 10
        assert warm.read is not None and warm.read.ok
        with torch.no_grad():
            full = model(ids, use_cache=True).logits
        torch.testing.assert_close(warm.logits[0], full[0, 40:], rtol=1e-4, atol=1e-5)
        again = pc.prefill(ids)                      # everything but the last token is stored
        assert again.restored_tokens == 48
        torch.testing.assert_close(again.logits[0, -1], full[0, -1], rtol=1e-4, atol=1e-5)
        assert pc.spec == model_spec(model, "tiny-llama")
        # 16, 32 and the 8-token tail of the first prompt; 48 and the 2-token tail of the
        # second: shared chunks stored once.
        assert e.stats()["chunks"] == 5


def test_corrupt_stored_kv_is_recomputed_not_used(tiny: object, tmp_path: Path) -> None:
    model = tiny
    ids = torch.randint(0, 97, (1, 40))
    with Engine.open(tmp_path / "s", local_config(16, repair=False)) as e:
        pc = HFPrefixCache(e, model, model_id="tiny-llama")
        pc.prefill(ids)
        corrupt(e, pc.spec, ids[0].tolist(), chunk=0, layer=1)
        warm = pc.prefill(ids)
        assert warm.restored_tokens == 0            # the broken chunk ends the reuse
        with torch.no_grad():
            full = model(ids, use_cache=True).logits
        torch.testing.assert_close(warm.logits, full)


def test_a_streamed_restore_gives_the_full_restores_logits(tiny: object, tmp_path: Path
                                                           ) -> None:
    model = tiny
    ids = torch.randint(0, 97, (1, 60))
    with Engine.open(tmp_path / "s", local_config(16)) as e:
        pc = HFPrefixCache(e, model, model_id="tiny-llama", store=False)
        HFPrefixCache(e, model, model_id="tiny-llama").prefill(ids[:, :50])
        full = pc.prefill(ids)
        streamed = pc.prefill(ids, stream=True)
        assert streamed.restored_tokens == full.restored_tokens == 50   # 48 + a 2-token tail
        assert torch.equal(streamed.logits, full.logits)
        assert streamed.read is not None and streamed.read.ok
        assert len(streamed.read.blocks) == 4 * 2        # 4 chunks x 2 layers
        for la, lb in zip(streamed.cache.layers, full.cache.layers, strict=True):
            assert torch.equal(la.keys, lb.keys) and torch.equal(la.values, lb.values)


def test_a_streamed_restore_that_meets_a_lost_block_falls_back(tiny: object, tmp_path: Path
                                                               ) -> None:
    model = tiny
    ids = torch.randint(0, 97, (1, 40))
    with Engine.open(tmp_path / "s", local_config(16, repair=False)) as e:
        pc = HFPrefixCache(e, model, model_id="tiny-llama")
        pc.prefill(ids)
        corrupt(e, pc.spec, ids[0].tolist(), chunk=1, layer=1)        # after layer 0 ran
        warm = pc.prefill(ids, stream=True)
        assert warm.restored_tokens == 16           # the verified chunk before it
        with torch.no_grad():
            full = model(ids, use_cache=True).logits
        torch.testing.assert_close(warm.logits[0], full[0, 16:], rtol=1e-4, atol=1e-5)
