"""Helpers of the Hugging Face adapter tests: a tiny random Llama, a corrupted block."""

from __future__ import annotations

from typing import Any

from rkv import Engine
from rkv.format.keys import as_token_array, block_key, chunk_keys
from rkv.format.model import ModelSpec
from rkv.format.record import decode_record


def tiny(layers: int = 2, dtype: Any = None, **config: Any) -> Any:
    """A random Llama (64 wide, vocab 97 unless ``config`` says), seeded, in eval mode, in
    ``dtype``."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = {"vocab_size": 97, **config}
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=layers, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=512,
                                   **config)
    model = transformers.LlamaForCausalLM(cfg)
    model.eval()
    return model if dtype is None else model.to(dtype)


def corrupt(e: Engine, spec: ModelSpec, tokens: list[int], *, chunk: int, layer: int,
            chunk_tokens: int = 16) -> None:
    """Flip a payload bit of one stored block of ``tokens`` (its checksum then fails)."""
    tier = e.tiers["dram"]
    key = block_key(chunk_keys(as_token_array(tokens), spec.fingerprint(), chunk_tokens)[chunk],
                    layer)
    rec = bytearray(tier.get(key) or b"")
    assert rec, "no such block in the dram tier"
    rec[decode_record(rec).header_bytes + 11] ^= 0x40
    tier.put(key, rec)


def greedy(model: Any, tokens: list[int], n: int) -> list[int]:
    """Plain ``model.generate`` (no rkv): the ``n`` greedy new tokens."""
    import torch

    out = model.generate(torch.tensor([tokens]), max_new_tokens=n, do_sample=False,
                         pad_token_id=0)
    return list(out[0, len(tokens):].tolist())
