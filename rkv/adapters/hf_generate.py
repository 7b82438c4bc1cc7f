"""``model.generate`` with rkv as the persistent prefix cache (transformers imported lazily).

Per call and row: the longest stored prefix of the prompt (a stored partial last chunk
included: :func:`rkv.adapters.hf_store.stored_prefix`) is restored, verified; the rest of the
prompt is prefilled; ``model.generate`` decodes with the caller's arguments
(``max_new_tokens``, ``do_sample``, ``temperature``, ``eos_token_id``, streamers, logits
processors, ...); then the KV of the prompt *and* of the generated tokens is stored (all but
the last generated token, which the model never ran on), so the next turn of a conversation
restores the model's own answer as well.

Batch > 1 (rows of different lengths and different stored prefixes): each row restores its
own prefix and prefills its own rest up to its second-to-last token (batch 1), then the rows'
caches are left-padded to one length and ``model.generate`` runs the batch from each row's
last prompt token on (pads masked, positions from the attention mask). Per-row restore rather
than left-padding the prompts first: a left-padded batch cache has one length for all rows,
so it could only restore as far as the row that has least stored; per row, every row reuses
all it has. The output is left-padded, as ``model.generate`` returns a left-padded batch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Protocol

from rkv.adapters.hf_store import as_rows
from rkv.errors import InputError
from rkv.format.hf_kv import kv_tensor
from rkv.store.engine import Engine, GetResult

#: Arguments that would take the cache out of rkv's hands or change the batch's rows.
_OURS = ("cache", "past_key_values", "assistant_model")


class PrefixCache(Protocol):
    """What :func:`generate` needs of the prefix cache it runs with
    (:class:`rkv.adapters.hf.HFPrefixCache`)."""

    @property
    def engine(self) -> Engine: ...

    @property
    def model(self) -> Any: ...

    @property
    def store(self) -> bool: ...

    def restore(self, tokens: list[int]) -> tuple[int, Any, GetResult | None]: ...

    def put(self, items: list[tuple[list[int], Any]]) -> int: ...


@dataclass(frozen=True)
class RowReport:
    """One row of a :func:`generate` call, in tokens."""

    restored: int     # prompt tokens whose KV came from rkv, verified
    prefilled: int    # prompt tokens the model computed
    generated: int    # new tokens, up to and including an end-of-sequence token
    stored: int       # tokens whose KV was put in rkv: prompt + generated but the last one


@dataclass(frozen=True)
class GenerateResult:
    sequences: Any                  # [batch, width + new]: left-padded prompts, new tokens
    new_tokens: list[list[int]]     # per row: generated tokens up to and including EOS
    rows: list[RowReport]
    ttft: float                     # seconds from the call to the first token's logits
    seconds: float                  # the whole call, storing included
    store_seconds: float            # of which storing the KV in rkv
    reads: list[GetResult | None]   # rkv's report of each row's restore (None: nothing stored)
    output: Any                     # what model.generate returned

    @property
    def restored_tokens(self) -> int:
        return sum(r.restored for r in self.rows)

    @property
    def prefilled_tokens(self) -> int:
        return sum(r.prefilled for r in self.rows)

    @property
    def stored_tokens(self) -> int:
        return sum(r.stored for r in self.rows)


def generate(pc: PrefixCache, input_ids: Any, attention_mask: Any = None, *,
             restore: bool = True, **kwargs: Any) -> GenerateResult:
    """Generate from ``input_ids`` (``[batch, tokens]`` with an optional left- or
    right-padding ``attention_mask``, or lists of ints) with ``pc``'s store as the prefix
    cache; ``kwargs`` go to ``model.generate``. ``restore=False`` computes every prompt
    token (a cold baseline measured on the same path)."""
    import torch
    from transformers import DynamicCache, LogitsProcessorList

    model = pc.model
    rows = as_rows(input_ids, attention_mask)
    gen = kwargs.get("generation_config") or model.generation_config
    _check_kwargs(kwargs, gen)
    eos = _token_set(kwargs.get("eos_token_id", gen.eos_token_id))
    pad = kwargs.pop("pad_token_id", None)
    pad = gen.pad_token_id if pad is None else pad
    pad = (min(eos) if eos else 0) if pad is None else int(pad)
    timer = _first_token_timer()
    procs = LogitsProcessorList([*(kwargs.pop("logits_processor", None) or []), timer])

    t0 = time.perf_counter()
    got = [pc.restore(r) if restore else (0, None, None) for r in rows]
    width = max(len(r) for r in rows)
    with torch.no_grad():
        if len(rows) == 1:
            cache = got[0][1] if got[0][1] is not None else DynamicCache(config=model.config)
        else:
            cache = _left_padded(model, rows, got, width)
        ids = torch.full((len(rows), width), pad, dtype=torch.long, device=model.device)
        mask = torch.zeros_like(ids)
        for b, r in enumerate(rows):
            ids[b, width - len(r):] = torch.tensor(r)
            mask[b, width - len(r):] = 1
        out = model.generate(ids, attention_mask=mask, cache=cache, pad_token_id=pad,
                             logits_processor=procs, **kwargs)
    ttft = (timer.at or time.perf_counter()) - t0
    seqs = out if isinstance(out, torch.Tensor) else out.sequences

    t1 = time.perf_counter()
    new = [_until_eos(seqs[b, width:].tolist(), eos) for b in range(len(rows))]
    have = cache.get_seq_length()   # the model ran on every token but the last generated
    chunk = pc.engine.config.chunk_tokens
    items: dict[tuple[int, ...], Any] = {}
    kept = []
    for b, r in enumerate(rows):
        pos = width - len(r)
        n = min(len(r) + len(new[b]), have - pos)
        toks = (r + new[b])[:n]
        kept.append(n if pc.store else 0)
        if pc.store and tuple(toks) not in items:      # equal rows: one put
            kv = kv_tensor(cache, row=b, start=pos, stop=pos + n)
            items[tuple(toks)] = kv
            # The prompt, and all of it but its last token (the most a call with the same
            # prompt restores), on their own too: their partial last chunks (a few tokens
            # each) are what another sample of the same prompt, or a prompt that continues
            # this one differently (an edited answer), finds.
            for m in (len(r) - 1, len(r)):
                if 0 < m < n and m % chunk:
                    items.setdefault(tuple(r[:m]), kv[:, :, :m])
    pc.put([(list(t), kv) for t, kv in items.items()])
    t2 = time.perf_counter()
    reports = [RowReport(g[0], len(r) - g[0], len(nw), k)
               for g, r, nw, k in zip(got, rows, new, kept, strict=True)]
    return GenerateResult(seqs, new, reports, ttft, t2 - t0, t2 - t1, [g[2] for g in got], out)


def _check_kwargs(kwargs: dict[str, Any], gen: Any) -> None:
    for k in _OURS:
        if k in kwargs:
            raise InputError(f"generate(..., {k}=) is not supported with rkv as the cache")
    if kwargs.get("use_cache", True) is False:
        raise InputError("use_cache=False leaves nothing to store: call model.generate")
    for k in ("num_beams", "num_return_sequences"):
        if int(kwargs.get(k, getattr(gen, k, 1)) or 1) != 1:
            raise InputError(f"{k} must be 1 with rkv as the cache (one sequence per row)")


def _token_set(x: Any) -> set[int]:
    if x is None:
        return set()
    if hasattr(x, "tolist"):
        x = x.tolist()
    return {int(t) for t in x} if isinstance(x, list | tuple | set) else {int(x)}


def _until_eos(tokens: list[int], eos: set[int]) -> list[int]:
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[:i + 1]
    return tokens


def _left_padded(model: Any, rows: list[list[int]], got: list[tuple[int, Any, Any]],
                 width: int) -> Any:
    """Prefill each row up to its second-to-last token on its own restored cache, then one
    batch cache of ``width - 1`` positions, each row's KV at its end (zeros before: masked)."""
    import torch
    from transformers import DynamicCache

    length = width - 1
    per_row = []
    for r, (restored, cache, _) in zip(rows, got, strict=True):
        if len(r) - 1 > restored:
            cache = cache if cache is not None else DynamicCache(config=model.config)
            cache = model(torch.tensor([r[restored:-1]], device=model.device), cache=cache,
                          use_cache=True).cache
        per_row.append(cache)
    batch = DynamicCache(config=model.config)
    if length == 0:
        return batch
    one = next(c for c in per_row if c is not None).layers[0].keys
    for layer in range(len(batch.layers)):
        k = torch.zeros((len(rows), one.shape[1], length, one.shape[3]), dtype=one.dtype,
                        device=one.device)
        v = torch.zeros_like(k)
        for b, c in enumerate(per_row):
            if c is not None:
                n = c.layers[layer].keys.shape[2]
                k[b, :, length - n:] = c.layers[layer].keys[0]
                v[b, :, length - n:] = c.layers[layer].values[0]
        batch.update(k, v, layer)
    return batch


def _first_token_timer() -> Any:
    """A logits processor that notes when it first sees logits (the first token's)."""
    from transformers import LogitsProcessor

    class FirstToken(LogitsProcessor):  # type: ignore[misc]
        at: float | None = None

        def __call__(self, input_ids: Any, scores: Any) -> Any:
            if self.at is None:
                self.at = time.perf_counter()
            return scores

    return FirstToken()
