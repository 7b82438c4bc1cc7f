"""ChatSession on a tiny random Llama with a real (small, freshly trained) byte-level BPE
tokenizer and a ChatML-style template: no download."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hf_helpers import tiny
from rkvtest import local_config

pytest.importorskip("torch")
pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from rkv import Engine  # noqa: E402
from rkv.adapters.hf import HFPrefixCache  # noqa: E402
from rkv.adapters.hf_chat import ChatSession  # noqa: E402

CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CORPUS = ["The cache keeps the keys and values of every token it has seen.",
          "A store that outlives the process lets the next turn start warm.",
          "What is a chunk? A run of tokens that is stored and verified together."]


@pytest.fixture(scope="module")
def tok() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(CORPUS * 4, trainers.BpeTrainer(
        vocab_size=320, special_tokens=["<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    t = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>",
                                pad_token="<|im_end|>")
    t.chat_template = CHATML
    return t


@pytest.fixture(scope="module")
def model(tok: Any) -> Any:
    return tiny(vocab_size=len(tok), eos_token_id=tok.eos_token_id,
                pad_token_id=tok.eos_token_id)


def say(chat: ChatSession, text: str, tok: Any) -> Any:
    # A random model may emit <|im_start|> inside an answer, which the template cannot
    # render back as content: keep it out, as generate's bad_words_ids allows.
    start = tok.convert_tokens_to_ids("<|im_start|>")
    return chat.say(text, max_new_tokens=6, do_sample=False, bad_words_ids=[[start]])


def test_turn_two_reuses_the_models_own_tokens(tok: Any, model: Any, tmp_path: Path) -> None:
    with Engine.open(tmp_path / "s", local_config(16)) as e:
        chat = ChatSession(HFPrefixCache(e, model, model_id="tiny"), tok,
                           system="You are brief. " + CORPUS[0])
        one = say(chat, "What does the cache keep?", tok)
        assert one.result.rows[0].restored == 0
        kept = list(chat.ids)
        assert kept[-len(one.result.new_tokens[0]):] == one.result.new_tokens[0]
        two = say(chat, CORPUS[2], tok)
        assert chat.ids[:len(kept)] == kept
        r = two.result.rows[0]
        print(f"turn 2: {two.prompt_tokens} tokens, restored {r.restored}")
        assert r.restored == one.result.rows[0].stored == len(kept) - 1
        assert chat.messages[-1] == {"role": "assistant", "content": two.answer}


def test_a_template_that_rewrites_earlier_turns_is_tokenized_again(tok: Any, model: Any,
                                                                   tmp_path: Path) -> None:
    """The rendered conversation no longer starts with the text so far (a header that counts
    messages): the whole of it is tokenized again and reuse stops where it differs."""
    import copy

    counting = copy.copy(tok)
    counting.chat_template = "turns: {{ messages|length }}\n" + CHATML
    with Engine.open(tmp_path / "s", local_config(16)) as e:
        chat = ChatSession(HFPrefixCache(e, model, model_id="tiny"), counting)
        say(chat, CORPUS[1], counting)
        before = list(chat.ids)
        ids = chat.prompt_ids("And then?")
        assert ids[:len(before)] != before
        assert ids == counting.encode(counting.apply_chat_template(
            [*chat.messages, {"role": "user", "content": "And then?"}], tokenize=False,
            add_generation_prompt=True), add_special_tokens=False)
        two = say(chat, "And then?", counting)
        assert two.result.rows[0].restored == 0        # the header differs in chunk 0
