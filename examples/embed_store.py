"""rkv embedded in a program: store the KV cache of two prompts that share a prefix, find and
read it back verified, and look at what the store holds (the README's example, whole).

Run: ``.venv/bin/python examples/embed_store.py [STORE_DIR]`` (default ``./kvstore``; the
store is destroyed at the end unless ``--keep`` is given).
"""

from __future__ import annotations

import argparse

import numpy as np

from rkv import Engine, ModelSpec

# What produced the KV: every field changes its bytes, so each model gets its own key space.
MODEL = ModelSpec("HuggingFaceTB/SmolLM2-135M", n_layers=30, n_kv_heads=3, head_dim=64,
                  dtype="float16")


def fake_kv(n_tokens: int, seed: int) -> np.ndarray:
    """KV shaped as a model would return it: [layers, 2 (keys, values), tokens, heads, dim]."""
    rng = np.random.default_rng(seed)
    shape = (MODEL.n_layers, 2, n_tokens, MODEL.n_kv_heads, MODEL.head_dim)
    return rng.standard_normal(shape).astype(np.float16)


def main(path: str, keep: bool) -> None:
    system = list(range(600))                      # a shared system prompt
    prompt_a = system + list(range(1000, 1400))    # two requests that start with it
    prompt_b = system + list(range(2000, 2100))
    kv_a = fake_kv(len(prompt_a), seed=1)
    kv_b = np.concatenate([kv_a[:, :, :len(system)], fake_kv(100, seed=2)], axis=2)

    with Engine.open(path) as store:               # embedded default: dram, cxl, nvme tiers
        store.put(prompt_a, kv_a, model=MODEL)     # chunks of 256 tokens
        blocks_a = store.stats()["tiers"]["dram"]["blocks"]
        store.put(prompt_b, kv_b, model=MODEL)     # its first 512 tokens are stored already
        blocks = store.stats()["tiers"]["dram"]["blocks"]
        print(f"prompt A: {blocks_a} blocks (one per layer and chunk); after prompt B: "
              f"{blocks} (the shared chunks are stored once)")

        # lookup counts whole chunks of a longer prompt; a stored partial chunk only matches
        # a prompt that ends where it ends
        longer = [*prompt_a, 7, 8, 9]
        found = (store.lookup(longer, model=MODEL), store.lookup(prompt_a, model=MODEL),
                 store.lookup(system + [5] * 50, model=MODEL))
        print("lookup: A + 3 tokens {}, A {}, the system prompt + others {}".format(*found))
        assert found == (768, 1000, 512)           # what README.md says
        # partial=True also counts the stored partial chunk that continues the longer prompt
        assert store.lookup(longer, model=MODEL, partial=True) == 1000

        got = store.get(prompt_b, model=MODEL)     # every block verified against its checksum
        assert got.ok and np.array_equal(got.kv, kv_b)
        print(f"get(B): {got.n_tokens} tokens, {got.counts}")

        part = store.get(longer, model=MODEL)     # the stored prefix of it
        print(f"get(A + 3 tokens): {part.n_tokens} of {len(longer)} tokens")
        assert np.array_equal(part.kv, kv_a[:, :, :part.n_tokens])

        for name, tier in store.stats()["tiers"].items():
            print(f"tier {name}: {tier['blocks']} blocks, {tier['bytes']:,} bytes, "
                  f"ecc {tier['ecc']}, fault model {tier['fault_model']}")
        report = store.verify()                    # reads every record: nothing corrupt
        print("verify:", report)

    if not keep:
        Engine.destroy(path)                       # the directory and its /dev/shm tiers


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("path", nargs="?", default="./kvstore")
    ap.add_argument("--keep", action="store_true", help="keep the store")
    args = ap.parse_args()
    main(args.path, args.keep)
