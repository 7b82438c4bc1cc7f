"""Time to first token per turn of a multi-turn chat on SmolLM2-135M-Instruct, cold vs warm.

    .venv/bin/python benchmarks/bench_hf.py [--repeat 3] [--context 1536] [--new 16]

The chat: a system prompt holding ``--context`` tokens of a text (Python's
``pydoc_data.topics``), then three user questions, each answered with ``--new`` greedy
tokens through :class:`rkv.adapters.hf_chat.ChatSession`. Per turn, on the same prompt:

- **cold**: every prompt token computed (``generate(restore=False)``, nothing stored): the
  baseline, measured in the same run;
- **warm**: rkv restores what it holds (the earlier turns' prompts and answers, verified
  reads from the embedded default store's DRAM tier) and the model prefills the rest.

Time to first token = from the call to the first token's logits, restore included. One
thread (``torch.set_num_threads(1)``); weights 4-bit (Q4_1) dequantized to fp32, fp32 KV.
Each repeat runs the whole chat on a fresh store; cold and warm alternate which goes first.
Reports medians over repeats and the ratio cold / warm per turn.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("TQDM_DISABLE", "1")   # before torch imports tqdm: no GGUF load bar
import torch

from rkv import Engine
from rkv.adapters.hf import HFPrefixCache
from rkv.adapters.hf_chat import ChatSession
from rkv.eval.quality import load_smollm2, text_windows

QUESTIONS = ("What is this text about? One sentence.",
             "Name one keyword it mentions and say what it means.",
             "Thanks. Summarize your two answers in a few words.")
MODEL_ID = "SmolLM2-135M-Instruct-Q4_1"


def one_chat(model: Any, tok: Any, system: str, new: int, cold_first: bool
             ) -> list[dict[str, Any]]:
    root = Path(tempfile.mkdtemp(prefix="rkv-bench-hf-"))
    out = []
    try:
        with Engine.open(root / "store") as e:
            cold = HFPrefixCache(e, model, model_id=MODEL_ID, store=False)
            chat = ChatSession(HFPrefixCache(e, model, model_id=MODEL_ID), tok, system=system)
            for q in QUESTIONS:
                ids = chat.prompt_ids(q)
                if cold_first:
                    c = cold.generate([ids], restore=False, max_new_tokens=1)
                turn = chat.say(q, max_new_tokens=new, do_sample=False)
                if not cold_first:
                    c = cold.generate([ids], restore=False, max_new_tokens=1)
                r = turn.result.rows[0]
                out.append({"prompt": len(ids), "restored": r.restored,
                            "prefilled": r.prefilled, "stored": r.stored,
                            "cold_ttft_s": c.ttft, "warm_ttft_s": turn.result.ttft})
    finally:
        Engine.destroy(root / "store")
        shutil.rmtree(root, ignore_errors=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--context", type=int, default=1536, help="tokens of text in the system "
                    "prompt")
    ap.add_argument("--new", type=int, default=16, help="new tokens per answer")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    model, tok = load_smollm2(threads=1)
    torch.set_num_threads(1)
    system = "Answer briefly about this text:\n" + tok.decode(
        text_windows(tok, 1, args.context)[0])
    one_chat(model, tok, "Be brief.", 2, True)      # warm-up: allocations, kernels
    runs = [one_chat(model, tok, system, args.new, rep % 2 == 0) for rep in range(args.repeat)]
    rows = []
    for i in range(len(QUESTIONS)):
        turn = [run[i] for run in runs]
        c = statistics.median(t["cold_ttft_s"] for t in turn)
        w = statistics.median(t["warm_ttft_s"] for t in turn)
        first = turn[0]
        # Greedy answers: every repeat sees the same tokens.
        assert all(t["restored"] == first["restored"] for t in turn)
        rows.append({"turn": i + 1, **{k: first[k] for k in ("prompt", "restored",
                                                             "prefilled", "stored")},
                     "cold_ttft_s": c, "warm_ttft_s": w, "ratio": c / w})
    print(f"\nSmolLM2-135M-Instruct (4-bit Q4_1 weights, fp32 compute and KV), 1 thread, "
          f"{args.context}-token context, {args.new} new tokens per answer, "
          f"median of {args.repeat}\n")
    print("| turn | prompt tokens | restored | prefilled | stored | cold TTFT (s) | "
          "warm TTFT (s) | cold / warm |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['turn']} | {r['prompt']} | {r['restored']} | {r['prefilled']} | "
              f"{r['stored']} | {r['cold_ttft_s']:.3f} | {r['warm_ttft_s']:.3f} | "
              f"{r['ratio']:.1f}x |")
    if args.json:
        Path(args.json).write_text(json.dumps({"context": args.context, "new": args.new,
                                               "repeat": args.repeat, "turns": rows},
                                              indent=2))


if __name__ == "__main__":
    main()
