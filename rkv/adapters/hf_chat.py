"""A multi-turn chat over :meth:`HFPrefixCache.generate` that keeps the model's own tokens.

Each turn's prompt is the conversation so far *as token ids*: the previous prompt, the
tokens the model generated, then the chat template's text for the new message, tokenized
on its own. Re-tokenizing the whole rendered conversation instead could split the earlier
answer into other tokens than the model produced, and the stored KV (keyed by token ids)
would stop matching there. The rule: if the newly rendered conversation starts with the
text of the tokens so far, only the rest is tokenized; otherwise (a template that rewrites
earlier turns) the whole conversation is tokenized again and reuse stops where it differs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rkv.adapters.hf import HFPrefixCache
    from rkv.adapters.hf_generate import GenerateResult


@dataclass(frozen=True)
class ChatTurn:
    answer: str                 # the generated text, special tokens left out
    prompt_tokens: int
    result: GenerateResult      # restored / prefilled / stored tokens, time to first token


@dataclass
class ChatSession:
    """``say(text)`` appends a user message, generates the answer with rkv as the prefix
    cache and appends it. ``system``: an optional system message."""

    cache: HFPrefixCache
    tokenizer: Any
    system: str | None = None
    messages: list[dict[str, str]] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)    # the conversation's tokens so far
    _text: str = ""                                   # their text

    def __post_init__(self) -> None:
        if self.system is not None and not self.messages:
            self.messages.append({"role": "system", "content": self.system})

    def prompt_ids(self, text: str) -> list[int]:
        """The token ids of the conversation with the user message ``text`` appended."""
        msgs = [*self.messages, {"role": "user", "content": text}]
        rendered = self.tokenizer.apply_chat_template(msgs, tokenize=False,
                                                      add_generation_prompt=True)
        if self.ids and rendered.startswith(self._text):
            return self.ids + self._encode(rendered[len(self._text):])
        return self._encode(rendered)

    def say(self, text: str, **generate_kwargs: Any) -> ChatTurn:
        ids = self.prompt_ids(text)
        out = self.cache.generate([ids], **generate_kwargs)
        new = out.new_tokens[0]
        answer = self.tokenizer.decode(new, skip_special_tokens=True)
        self._text = self.tokenizer.decode(ids + new, skip_special_tokens=False,
                                           clean_up_tokenization_spaces=False)
        self.ids = ids + new
        self.messages += [{"role": "user", "content": text},
                          {"role": "assistant", "content": answer}]
        return ChatTurn(answer, len(ids), out)

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))
