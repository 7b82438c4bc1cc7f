"""generate() with rkv as the prefix cache, on tiny random Llamas (no download)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hf_helpers import corrupt, greedy, tiny
from hypothesis import given, settings
from hypothesis import strategies as st
from rkvtest import local_config

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from rkv import Engine  # noqa: E402
from rkv.adapters.hf import HFPrefixCache  # noqa: E402
from rkv.errors import InputError, ShapeError  # noqa: E402

C = 16      # chunk_tokens of these stores


@pytest.fixture(scope="module")
def model() -> Any:
    return tiny()


def prompt(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return list(torch.randint(3, 97, (n,), generator=g).tolist())


def test_cold_and_warm_generate_give_plain_greedy_tokens(model: Any, tmp_path: Path) -> None:
    ids = prompt(40, 1)
    want = greedy(model, ids, 10)
    with Engine.open(tmp_path / "s", local_config(C)) as e:
        pc = HFPrefixCache(e, model, model_id="tiny")
        cold = pc.generate(torch.tensor([ids]), max_new_tokens=10, do_sample=False)
        assert cold.new_tokens == [want]
        assert torch.equal(cold.sequences[0], torch.tensor(ids + want))
        assert cold.rows[0].restored == 0 and cold.rows[0].prefilled == 40
        assert cold.rows[0].stored == 49              # the last new token never ran
        assert 0 < cold.ttft <= cold.seconds and cold.reads == [None]
        warm = pc.generate(torch.tensor([ids]), max_new_tokens=10, do_sample=False)
        assert warm.new_tokens == [want]
        assert warm.rows[0].restored == 39 and warm.rows[0].prefilled == 1
        assert warm.reads[0] is not None and warm.reads[0].ok


def test_turn_two_restores_turn_ones_prompt_and_answer(model: Any, tmp_path: Path) -> None:
    turn1 = prompt(40, 2)
    with Engine.open(tmp_path / "s", local_config(C)) as e:
        pc = HFPrefixCache(e, model, model_id="tiny")
        a = pc.generate([turn1], max_new_tokens=10, do_sample=False)
        turn2 = turn1 + a.new_tokens[0] + prompt(7, 3)
        b = pc.generate([turn2], max_new_tokens=6, do_sample=False)
        print(f"turn 2 ({len(turn2)} tokens) restored {b.rows[0].restored}")
        # 40 + 10 - 1: all of turn 1 whose KV exists (3 full chunks and a 1-token tail).
        assert b.rows[0].restored == 49 and b.rows[0].prefilled == len(turn2) - 49
        assert b.new_tokens[0] == greedy(model, turn2, 6)


@settings(max_examples=25)
@given(n1=st.integers(1, 50), new1=st.integers(1, 12), more=st.integers(1, 20))
def test_a_growing_conversation_reuses_every_stored_token(model: Any, tmp_path: Path,
                                                          n1: int, new1: int, more: int
                                                          ) -> None:
    """Whatever chunk the turn ends in, the next turn restores all the KV turn 1 stored."""
    import tempfile

    with tempfile.TemporaryDirectory(dir=tmp_path) as d, \
            Engine.open(Path(d) / "s", local_config(C)) as e:
        pc = HFPrefixCache(e, model, model_id="tiny")
        turn1 = prompt(n1, n1)
        a = pc.generate([turn1], max_new_tokens=new1, do_sample=False,
                        eos_token_id=None)
        assert len(a.new_tokens[0]) == new1
        stored = n1 + new1 - 1
        assert a.rows[0].stored == stored
        turn2 = turn1 + a.new_tokens[0] + prompt(more, 1000 + more)
        assert pc.stored_prefix(turn2) == stored
        b = pc.generate([turn2], max_new_tokens=1, do_sample=False)
        assert b.rows[0].restored == stored


def test_batch_rows_restore_their_own_prefixes(model: Any, tmp_path: Path) -> None:
    long, short, other = prompt(45, 4), prompt(9, 5), prompt(30, 6)
    with Engine.open(tmp_path / "s", local_config(C)) as e:
        pc = HFPrefixCache(e, model, model_id="tiny")
        pc.generate([long[:37]], max_new_tokens=2, do_sample=False)   # stores 38 tokens
        pc.generate([other], max_new_tokens=1, do_sample=False)       # stores 30 tokens
        out = pc.generate([long, short, other], max_new_tokens=5, do_sample=False)
        assert [r.restored for r in out.rows] == [37, 0, 29]
        assert [r.prefilled for r in out.rows] == [8, 9, 1]
        for row, got in zip((long, short, other), out.new_tokens, strict=True):
            assert got == greedy(model, row, 5)
        # Left-padded output, as model.generate gives a batch.
        assert out.sequences.shape == (3, 45 + 5)
        assert out.sequences[1, 45 - 9:45].tolist() == short
        # A right-padded [batch, tokens] tensor with its mask gives the same rows.
        ids = torch.zeros((2, 45), dtype=torch.long)
        mask = torch.zeros_like(ids)
        ids[0], mask[0] = torch.tensor(long), 1
        ids[1, :9], mask[1, :9] = torch.tensor(short), 1
        again = pc.generate(ids, mask, max_new_tokens=5, do_sample=False)
        assert again.new_tokens == out.new_tokens[:2]
        assert again.rows[0].restored == 44         # turn 1 stored all it could of `long`


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_kv_is_stored_in_its_dtype_and_restored_bitwise(
        dtype: str, tmp_path: Path) -> None:
    """The restored KV is bitwise the cache's own; the only difference from plain generate is
    the suffix prefill computed against a cache instead of in one pass (a rounding
    difference in half precision): identical greedy tokens on this short run."""
    m = tiny(dtype=getattr(torch, dtype))
    ids = prompt(40, 7)
    with Engine.open(tmp_path / "s", local_config(C)) as e:
        pc = HFPrefixCache(e, m, model_id="tiny")
        assert pc.spec.dtype == dtype
        cold = pc.generate([ids], max_new_tokens=6, do_sample=False)
        with torch.no_grad():
            ref = m(torch.tensor([ids + cold.new_tokens[0][:-1]]), use_cache=True).cache
        n, cache, _ = pc.restore(ids + cold.new_tokens[0])
        assert n == 45
        for la, lb in zip(cache.layers, ref.layers, strict=True):
            assert la.keys.dtype == getattr(torch, dtype)
            # The cold run's KV of tokens computed in one pass vs. one by one differ in
            # rounding; the prompt's KV (one pass in both) is bitwise equal.
            assert torch.equal(la.keys[..., :40, :], lb.keys[..., :40, :])
            assert torch.equal(la.values[..., :40, :], lb.values[..., :40, :])
        warm = pc.generate([ids], max_new_tokens=6, do_sample=False)
        assert warm.rows[0].restored == 39
        assert warm.new_tokens == cold.new_tokens == [greedy(m, ids, 6)]


def test_kv_dtype_converts_and_a_dtype_mismatch_is_an_error(model: Any, tmp_path: Path
                                                            ) -> None:
    ids = prompt(40, 8)
    with Engine.open(tmp_path / "s", local_config(C)) as e:
        pc = HFPrefixCache(e, model, model_id="tiny", kv_dtype="float16")
        pc.generate([ids], max_new_tokens=4, do_sample=False)
        n, cache, read = pc.restore(ids)
        assert n == 39 and read is not None and read.kv.dtype == torch.float16
        assert cache.layers[0].keys.dtype == torch.float32       # converted for the model
        # Stored as float16; this fp32 model without kv_dtype would be a silent miss.
        with pytest.raises(ShapeError, match=r"float16.*kv_dtype='float16'"):
            HFPrefixCache(e, model, model_id="tiny")
        warm = pc.generate([ids], max_new_tokens=4, do_sample=False)
        assert warm.rows[0].restored == 39
        assert warm.new_tokens == [greedy(model, ids, 4)]


def test_a_model_that_does_not_match_the_stores_spec_is_an_error(model: Any, tmp_path: Path
                                                                 ) -> None:
    with Engine.open(tmp_path / "s", local_config(C)) as e:
        pc = HFPrefixCache(e, model, model_id="tiny", revision="r1")
        pc.generate([prompt(20, 9)], max_new_tokens=1)
        with pytest.raises(ShapeError, match=r"n_layers=2 \(model: 3\)"):
            HFPrefixCache(e, tiny(layers=3), model_id="tiny", revision="r1")
        HFPrefixCache(e, tiny(layers=3), model_id="tiny", revision="r2")   # its own space
        with pytest.raises(ShapeError, match=r"n_layers=2 \(model: 3\)"):
            HFPrefixCache(e, tiny(layers=3), spec=pc.spec)
        with pytest.raises(ShapeError, match="layout"):
            HFPrefixCache(e, model, spec=pc.spec.__class__("tiny", 2, 2, 16))
        with pytest.raises(ShapeError, match="exactly one"):
            HFPrefixCache(e, model)
        with pytest.raises(ShapeError, match="exactly one"):
            HFPrefixCache(e, model, model_id="tiny", spec=pc.spec)
        from_spec = HFPrefixCache(e, model, spec=pc.spec)
        assert from_spec.stored_prefix(prompt(20, 9)) == 20


def test_sliding_window_models_are_refused(tmp_path: Path) -> None:
    import transformers

    cfg = transformers.MistralConfig(vocab_size=97, hidden_size=64, intermediate_size=128,
                                     num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, sliding_window=8)
    m = transformers.MistralForCausalLM(cfg)
    with Engine.open(tmp_path / "s", local_config(C)) as e, \
            pytest.raises(ShapeError, match="full-attention"):
        HFPrefixCache(e, m, model_id="mistral")


def test_a_corrupted_block_is_recomputed_not_served(model: Any, tmp_path: Path) -> None:
    ids = prompt(40, 10)
    with Engine.open(tmp_path / "s", local_config(C, repair=False)) as e:
        pc = HFPrefixCache(e, model, model_id="tiny")
        first = pc.generate([ids], max_new_tokens=4, do_sample=False)
        corrupt(e, pc.spec, ids, chunk=1, layer=1)
        warm = pc.generate([ids], max_new_tokens=4, do_sample=False)
        assert warm.rows[0].restored == 16               # the verified chunk before it
        read = warm.reads[0]
        assert read is not None and not read.ok
        assert warm.new_tokens == first.new_tokens == [greedy(model, ids, 4)]


def test_generation_arguments_are_honoured_or_refused(model: Any, tmp_path: Path) -> None:
    ids = prompt(30, 11)
    want = greedy(model, ids, 8)
    with Engine.open(tmp_path / "s", local_config(C)) as e:
        pc = HFPrefixCache(e, model, model_id="tiny")
        stop = pc.generate([ids], max_new_tokens=8, do_sample=False, eos_token_id=want[2])
        assert stop.new_tokens == [want[:3]]              # up to and including the EOS
        assert stop.rows[0].stored == 30 + 3 - 1
        torch.manual_seed(3)
        sampled = pc.generate([ids], max_new_tokens=5, do_sample=True, temperature=0.7)
        assert len(sampled.new_tokens[0]) == 5
        for bad in ({"num_beams": 2}, {"num_return_sequences": 2}, {"cache": None},
                    {"use_cache": False}):
            with pytest.raises(InputError):
                pc.generate([ids], max_new_tokens=2, **bad)
        with pytest.raises(ShapeError, match="gap"):
            pc.generate(torch.tensor([[1, 2, 3]]), torch.tensor([[1, 0, 1]]))
        with pytest.raises(ShapeError, match="empty"):
            pc.generate([[]])
        with pytest.raises(ShapeError, match="integers"):
            pc.generate([[1.0, 2.5]])
        with pytest.raises(ShapeError, match="integers"):
            pc.generate(torch.tensor([[1.0, 2.0]]))
