"""Chunking of token sequences and chained prefix keys.

Chunk ``i`` of a token sequence has the key
``h_i = blake2b(h_{i-1} || fingerprint || len_i || tokens_i)`` (32 bytes, ``h_{-1}`` = zeros),
so a key identifies the whole prefix up to and including its chunk, for one model
configuration. A trailing partial chunk gets a key of its own; because its length is hashed,
it never collides with a full chunk of the same prefix.

A *block* is one chunk of one layer; its key is the chunk key followed by the layer index as
two big-endian bytes, so the blocks of a chunk sort together in LMDB.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from rkv.errors import InputError

KEY_BYTES = 32
BLOCK_KEY_BYTES = KEY_BYTES + 2
_ROOT = bytes(KEY_BYTES)
_PERSON = b"rkv-chunk-v1"


def as_token_array(tokens: Any) -> np.ndarray:
    """Validate token ids and return them as a contiguous little-endian uint32 array."""
    if hasattr(tokens, "detach") and hasattr(tokens, "cpu"):  # a torch tensor
        tokens = tokens.detach().cpu().numpy()
    try:
        arr = np.asarray(tokens)
    except (TypeError, ValueError) as exc:
        raise InputError(f"tokens must be a sequence of ints: {exc}") from exc
    if arr.ndim != 1:
        raise InputError(f"tokens must be one-dimensional, got shape {arr.shape}")
    if arr.size == 0:
        return np.zeros(0, dtype="<u4")
    if arr.dtype.kind not in "iu":
        raise InputError(f"tokens must be integers, got dtype {arr.dtype}")
    if int(arr.min()) < 0 or int(arr.max()) > 0xFFFFFFFF:
        raise InputError("token ids must be in [0, 2**32)")
    return np.ascontiguousarray(arr, dtype="<u4")


def chunk_bounds(n_tokens: int, chunk_tokens: int) -> list[tuple[int, int]]:
    """``[start, end)`` of every chunk, the last one possibly partial."""
    return [(s, min(s + chunk_tokens, n_tokens)) for s in range(0, n_tokens, chunk_tokens)]


def chunk_keys(
    tokens: np.ndarray, fingerprint: bytes, chunk_tokens: int, *, partial: bool = True
) -> list[bytes]:
    """Chained keys of the chunks of ``tokens`` (from :func:`as_token_array`).

    With ``partial=False`` a trailing partial chunk is left out.
    """
    keys: list[bytes] = []
    prev = _ROOT
    raw = tokens.tobytes()
    for start, end in chunk_bounds(len(tokens), chunk_tokens):
        n = end - start
        if n < chunk_tokens and not partial:
            break
        h = hashlib.blake2b(digest_size=KEY_BYTES, person=_PERSON)
        h.update(prev)
        h.update(fingerprint)
        h.update(n.to_bytes(4, "little"))
        h.update(raw[4 * start : 4 * end])
        prev = h.digest()
        keys.append(prev)
    return keys


def block_key(chunk_key: bytes, layer: int) -> bytes:
    return chunk_key + layer.to_bytes(2, "big")


def split_block_key(key: bytes) -> tuple[bytes, int]:
    if len(key) != BLOCK_KEY_BYTES:
        raise InputError(f"block keys are {BLOCK_KEY_BYTES} bytes, got {len(key)}")
    return key[:KEY_BYTES], int.from_bytes(key[KEY_BYTES:], "big")

