"""The longest stored prefix of a sequence counting a stored *partial* chunk that continues
it: what :meth:`Engine.lookup` answers with ``partial=True``.

Chunk keys chain whole chunks, and a partial chunk's key hashes its own length, so a partial
chunk that an earlier, shorter sequence ended with (turn 1 of a chat) is not on the key chain
of a longer sequence (turn 2). After ``k`` stored full chunks the candidates are the children
of chunk ``k - 1`` in the index (each stored chunk records its parent) that are shorter than
a chunk; at the first chunk, which has no parent entry, every length from the longest possible
down is tried. Cost: one hash of at most ``chunk_tokens`` tokens and one index read per try.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rkv.errors import CorruptStoreError
from rkv.format.keys import chunk_keys
from rkv.store.index import Index


def _has(index: Index, txn: Any, key: bytes) -> bool:
    """A readable entry for ``key``: a lookup that fails on a damaged page ends the prefix."""
    try:
        return index.has_chunk(txn, key)
    except CorruptStoreError:
        return False


def stored_prefix(index: Index, txn: Any, toks: np.ndarray, fp: bytes, chunk_tokens: int,
                  partial: bool) -> int:
    """Tokens of ``toks`` stored as whole chunks, plus the longest stored partial chunk that
    continues them when ``partial``; nothing is verified (a get does that)."""
    c = chunk_tokens
    n_full = len(toks) // c
    keys = chunk_keys(toks[:n_full * c], fp, c)
    full = 0
    for key in keys:
        if not _has(index, txn, key):
            break
        full += 1
    start = full * c
    room = min(c - 1, len(toks) - start)
    if room <= 0 or not partial:
        return start
    if full:
        lengths: list[int] = sorted({m.n_tokens for kid in index.kids(txn, keys[full - 1])
                                     if (m := index.read_chunk(txn, kid)) is not None
                                     and m.n_tokens <= room}, reverse=True)
    else:
        lengths = list(range(room, 0, -1))
    for n in lengths:
        # The chain key of the partial chunk [start, start + n): the prefix is hashed again
        # only for the few candidates a parent has.
        if _has(index, txn, chunk_keys(toks[:start + n], fp, c)[-1]):
            return start + n
    return start
