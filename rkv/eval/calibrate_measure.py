"""Measurement side of ``rkv calibrate``: text windows, rkv's KIVI quantizer per block, and a
fast continuation forward that re-runs only the layers a quantized block can change.

For one window the model prefills ``prefix`` tokens once; the reference pass then records the
hidden state entering every layer for the scored tokens, the exact prefix KV and the
reference next-token log-probabilities. Quantizing layer ``l``'s prefix K (or V) cannot
change anything below layer ``l``, so a case only re-runs layers ``l..L-1`` of the scored
tokens (plus the final norm and the LM head), batched over the cases of one layer. The
scored tokens' own K and V are recomputed from their (changed) hidden states, exactly as a
serving engine does after restoring a prefix. Everything is fp32, as the model computes
(its weights are 4-bit Q4_1, dequantized by transformers' GGUF loader).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rkv.errors import InputError
from rkv.extras import require_torch
from rkv.format.hf_kv import cache_from_kv, kv_from_cache

KINDS = ("k", "v")
BITS = (8, 4, 2)
PREFIX = 512
LENGTH = 576
CHUNK_TOKENS = 256     # the engine's default chunk: one stored block per chunk and layer
GROUP = 32

Plan = Mapping[tuple[int, str], int]


# -- text ------------------------------------------------------------------------------------
def docs_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "docs"


def docs_files() -> list[Path]:
    """rkv's own docs (text the model cannot have seen), without calibration.md (which
    quotes the results and would change the text each time it is regenerated)."""
    d = docs_dir()
    files = sorted(p for p in d.glob("*.md") if p.name != "calibration.md")
    if not files:
        raise InputError(f"no rkv docs under {d}: calibrate from a source checkout, or use "
                         "--text topics")
    return files


def _source_ids(tokenizer: Any, source: str, n_windows: int, length: int) -> list[int]:
    """The token ids a source's ``n_windows`` windows are cut from (for ``topics``, the
    same prefix of ``pydoc_data.topics`` :func:`rkv.eval.quality.text_windows` tokenizes)."""
    if source == "topics":
        from pydoc_data.topics import topics

        text = "\n\n".join(topics[k] for k in sorted(topics))
        return list(tokenizer(text[: 40 * length * (n_windows + 1)]).input_ids)
    if source == "docs":
        text = "\n\n".join(p.read_text(encoding="utf-8") for p in docs_files())
        return list(tokenizer(text).input_ids)
    raise InputError(f"text sources are 'topics' and 'docs', got {source!r}")


def _describe(source: str, n: int, length: int) -> str:
    if source == "topics":
        return f"pydoc_data.topics: {n} windows of {length} tokens"
    h = hashlib.sha256()
    for p in docs_files():
        h.update(p.read_bytes())
    return (f"rkv docs/*.md ({len(docs_files())} files, sha256 {h.hexdigest()[:12]}): {n} "
            f"windows of {length} tokens")


def _counts(n_windows: int, sources: Sequence[str]) -> dict[str, int]:
    if n_windows < 1:
        raise InputError("need at least one window")
    bad = [s for s in sources if s not in ("topics", "docs")]
    if bad or not sources:
        raise InputError(f"text sources are 'topics' and 'docs', got {list(sources)}")
    return {s: (n_windows + len(sources) - 1 - i) // len(sources)
            for i, s in enumerate(sources)}


def _interleave(per: dict[str, list[list[int]]]) -> list[list[int]]:
    out: list[list[int]] = []
    for i in range(max(len(v) for v in per.values())):
        out.extend(v[i] for v in per.values() if i < len(v))
    return out


def calibration_windows(tokenizer: Any, n_windows: int, sources: Sequence[str] = ("topics",
                        "docs"), length: int = LENGTH) -> tuple[list[list[int]], list[str]]:
    """Disjoint windows alternating between the sources (``topics``: Python's
    ``pydoc_data.topics``, as :func:`rkv.eval.quality.text_windows` cuts them; ``docs``: rkv's
    own docs, text the model cannot have seen), evenly spaced within each source.
    Returns the windows and one line per source describing the text."""
    per: dict[str, list[list[int]]] = {}
    described = []
    for s, n in _counts(n_windows, sources).items():
        if n == 0:
            continue
        ids = _source_ids(tokenizer, s, n, length)
        if len(ids) < n * length:
            raise InputError(f"{s} holds {len(ids)} tokens, fewer than {n} windows of "
                             f"{length}")
        step = len(ids) // n
        per[s] = [ids[i * step:i * step + length] for i in range(n)]
        described.append(_describe(s, n, length))
    return _interleave(per), described


def heldout_windows(tokenizer: Any, n_calibration: int, n_windows: int,
                    sources: Sequence[str] = ("topics", "docs"), length: int = LENGTH
                    ) -> list[list[int]]:
    """Windows disjoint from :func:`calibration_windows` (``n_calibration``): each starts
    half a step after a calibration window of the same source."""
    per: dict[str, list[list[int]]] = {}
    cal = _counts(n_calibration, sources)
    for s, n in _counts(n_windows, sources).items():
        if n == 0:
            continue
        ids = _source_ids(tokenizer, s, cal[s], length)
        step = len(ids) // cal[s]
        if step < 2 * length or n > cal[s]:
            raise InputError(f"{s} has no room for {n} held-out windows")
        per[s] = [ids[i * step + step // 2:i * step + step // 2 + length] for i in range(n)]
    return _interleave(per)


# -- quantization with rkv's quantizer -----------------------------------------------------
def quantize_layer(kv_layer: np.ndarray, bits: int, chunk: int = CHUNK_TOKENS,
                   group: int = GROUP) -> np.ndarray:
    """One layer's prefix KV ``[2, tokens, heads, dim]`` through rkv's KIVI quantizer, block
    by block (``chunk`` tokens per stored block, as the engine stores them); 16 bits: exact."""
    if bits == 16:
        return kv_layer.copy()
    from rkv.quant import get_quantizer

    q = get_quantizer(f"kivi(bits={bits},group={group})")
    out = np.empty_like(kv_layer)
    for s in range(0, kv_layer.shape[1], chunk):
        block = np.ascontiguousarray(kv_layer[:, s:s + chunk])
        out[:, s:s + chunk] = q.decode(q.encode(block), block.shape, block.dtype)
    return out


def quantize_plan(kv: np.ndarray, plan: Plan) -> np.ndarray:
    """The prefix KV ``[layers, 2, tokens, heads, dim]`` with every (layer, kind) of ``plan``
    quantized to its bits (K and V of a block are quantized independently by KIVI, so taking
    one half of a block quantized at some bits is exactly what storing it so returns)."""
    out = kv.copy()
    cache: dict[tuple[int, int], np.ndarray] = {}
    for (layer, kind), bits in plan.items():
        if bits == 16:
            continue
        if (layer, bits) not in cache:
            cache[(layer, bits)] = quantize_layer(kv[layer], bits)
        i = KINDS.index(kind)
        out[layer, i] = cache[(layer, bits)][i]
    return out


def block_bits(bits: int, n_heads: int = 3, head_dim: int = 64, dtype: str = "float16"
               ) -> float:
    """Stored bits per element of a full block at ``bits`` (16: the raw dtype), metadata
    included: what a byte budget counts."""
    if bits == 16:
        return 16.0 if dtype != "float32" else 32.0
    from rkv.quant import get_quantizer

    q = get_quantizer(f"kivi(bits={bits},group={GROUP})")
    return q.bits_per_element((2, CHUNK_TOKENS, n_heads, head_dim), dtype)


# -- the fast continuation forward ---------------------------------------------------------
@dataclass
class Reference:
    """One window's reference pass: everything a case needs to re-run from any layer."""

    hidden: list[Any]          # hidden state entering layer i, [1, n, hidden], i = 0..L
    kv: np.ndarray             # exact prefix KV [L, 2, P, H, D] (fp32)
    kv_t: list[Any]            # per layer (K, V) torch [1, H, P, D]
    cos: Any
    sin: Any
    mask: Any                  # [n, P + n] additive mask (0 / -inf)
    ref_lp: Any                # [n + 1, vocab] float64 log-probs of the scored tokens
    targets: Any               # [n + 1] scored token ids
    nll_ref: float


def _layer(model: Any, i: int, h: Any, kp: Any, vp: Any, ref: Reference) -> Any:
    """Decoder layer ``i`` on the scored tokens ``h`` ``[B, n, hidden]`` with prefix keys and
    values ``kp``, ``vp`` ``[B or 1, H, P, D]`` (post-RoPE, as cached)."""
    torch = require_torch("calibration")
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    layer = model.model.layers[i]
    attn = layer.self_attn
    b, n, _ = h.shape
    d = attn.head_dim
    x = layer.input_layernorm(h)
    q = attn.q_proj(x).view(b, n, -1, d).transpose(1, 2)
    k = attn.k_proj(x).view(b, n, -1, d).transpose(1, 2)
    v = attn.v_proj(x).view(b, n, -1, d).transpose(1, 2)
    q, k = apply_rotary_pos_emb(q, k, ref.cos, ref.sin)
    kk = torch.cat([kp.expand(b, -1, -1, -1), k], dim=2)
    vv = torch.cat([vp.expand(b, -1, -1, -1), v], dim=2)
    rep = q.shape[1] // kk.shape[1]
    kk = kk.repeat_interleave(rep, dim=1)
    vv = vv.repeat_interleave(rep, dim=1)
    o = torch.nn.functional.scaled_dot_product_attention(q, kk, vv, attn_mask=ref.mask,
                                                         scale=attn.scaling)
    h = h + attn.o_proj(o.transpose(1, 2).reshape(b, n, -1))
    return h + layer.mlp(layer.post_attention_layernorm(h))


def _logits(model: Any, h: Any) -> Any:
    return model.lm_head(model.model.norm(h))


def _log_probs(model: Any, h: Any) -> Any:
    torch = require_torch("calibration")

    return torch.log_softmax(_logits(model, h).double(), dim=-1)


def reference(model: Any, ids: Sequence[int], prefix: int = PREFIX) -> Reference:
    """Prefill ``ids[:prefix]`` with the model, then run the scored tokens through the fast
    path with the exact cache, recording each layer's input."""
    torch = require_torch("calibration")

    if len(ids) <= prefix + 1:
        raise InputError(f"windows must be longer than prefix + 1 = {prefix + 1} tokens")
    x = torch.tensor([list(ids)])
    n = len(ids) - prefix - 1          # inputs whose outputs are scored (the last is not)
    with torch.no_grad():
        pre = model(x[:, :prefix], use_cache=True)
        kv = kv_from_cache(pre.past_key_values)
        kv_t = [(torch.from_numpy(kv[i, 0]).permute(1, 0, 2)[None].contiguous(),
                 torch.from_numpy(kv[i, 1]).permute(1, 0, 2)[None].contiguous())
                for i in range(kv.shape[0])]
        pos = torch.arange(prefix, prefix + n)[None]
        h = model.model.embed_tokens(x[:, prefix:prefix + n])
        cos, sin = model.model.rotary_emb(h, pos)
        mask = torch.zeros(n, prefix + n)
        mask[:, prefix:] = torch.triu(torch.full((n, n), -math.inf), diagonal=1)
        ref = Reference([h], kv, kv_t, cos, sin, mask, None, x[0, prefix:], 0.0)
        for i in range(kv.shape[0]):
            h = _layer(model, i, h, *kv_t[i], ref)
            ref.hidden.append(h)
        first = torch.log_softmax(pre.logits[0, -1:].double(), dim=-1)
        ref.ref_lp = torch.cat([first, _log_probs(model, h)[0]], dim=0)
        ref.nll_ref = -float(ref.ref_lp.gather(1, ref.targets[:, None]).sum())
    return ref


def run_cases(model: Any, ref: Reference, start: int,
              cases: Sequence[Mapping[tuple[int, str], np.ndarray]]
              ) -> list[tuple[float, float]]:
    """(mean KL per scored token, summed NLL) of each case: a case replaces the prefix K or
    V of some layers ``>= start`` by the given ``[P, H, D]`` arrays; layers below ``start``
    are taken from the reference."""
    torch = require_torch("calibration")

    b = len(cases)
    with torch.no_grad():
        h = ref.hidden[start].expand(b, -1, -1)
        for i in range(start, len(ref.kv_t)):
            halves = []
            for j, kind in enumerate(KINDS):
                if any((i, kind) in c for c in cases):
                    halves.append(torch.stack([
                        torch.from_numpy(np.ascontiguousarray(c[(i, kind)])).permute(1, 0, 2)
                        if (i, kind) in c else ref.kv_t[i][j][0] for c in cases]))
                else:
                    halves.append(ref.kv_t[i][j])
            h = _layer(model, i, h, halves[0], halves[1], ref)
        # KL(p || q) = sum p log p - sum p z + logsumexp(z) per position (z: the test
        # logits, sum p = 1): one pass over the vocabulary in float64 instead of five.
        z = _logits(model, h).double()
        lse = torch.logsumexp(z, dim=-1)
        p = ref.ref_lp[1:].exp()
        neg_ent = (p * ref.ref_lp[1:]).sum(dim=-1)
        kl = neg_ent[None] - torch.einsum("bnv,nv->bn", z, p) + lse
        tgt = ref.targets[1:]
        nll = lse - z[:, torch.arange(len(tgt)), tgt]
        nll0 = -float(ref.ref_lp[0, ref.targets[0]])
        n = ref.ref_lp.shape[0]
        return [(float(kl[c].sum()) / n, float(nll[c].sum()) + nll0) for c in range(b)]


def hf_case(model: Any, ids: Sequence[int], ref: Reference, kv2: np.ndarray,
            prefix: int = PREFIX) -> tuple[float, float]:
    """(mean KL, summed NLL) of the scored tokens when the model itself continues from the
    prefix cache ``kv2`` (a ``DynamicCache``, as ``rkv quality`` does): the independent
    path the fast one is checked against, and how plans are measured."""
    torch = require_torch("calibration")

    x = torch.tensor([list(ids)])
    with torch.no_grad():
        out = model(x[:, prefix:-1], cache=cache_from_kv(kv2, model.config), use_cache=True)
        test = torch.cat([ref.ref_lp[:1], torch.log_softmax(out.logits[0].double(), dim=-1)])
    kl = (ref.ref_lp.exp() * (ref.ref_lp - test)).sum(dim=-1)
    return float(kl.mean()), -float(test.gather(1, ref.targets[:, None]).sum())


def hf_reference_lp(model: Any, ids: Sequence[int], prefix: int = PREFIX) -> Any:
    """The scored tokens' reference log-probs through the model's own forward (for tests)."""
    torch = require_torch("calibration")

    x = torch.tensor([list(ids)])
    with torch.no_grad():
        pre = model(x[:, :prefix], use_cache=True)
        out = model(x[:, prefix:-1], cache=pre.past_key_values, use_cache=True)
        logits = torch.cat([pre.logits[0, -1:], out.logits[0]], dim=0)
    return torch.log_softmax(logits.double(), dim=-1)


def window_cases(model: Any, ids: Sequence[int], layers: Sequence[int] | None = None,
                 bits: Sequence[int] = BITS, prefix: int = PREFIX
                 ) -> tuple[dict[str, float], dict[str, float], float, float]:
    """One window: KL and NLL of every ``"<layer>:<kind>:<bits>"`` case, the reference NLL
    and the fast path's noise floor (KL of an unmodified case re-run from layer 0)."""
    ref = reference(model, ids, prefix)
    n_layers = ref.kv.shape[0]
    kl: dict[str, float] = {}
    nll: dict[str, float] = {}
    floor = run_cases(model, ref, 0, [{}])[0][0]
    for layer in (range(n_layers) if layers is None else layers):
        qs = {b: quantize_layer(ref.kv[layer], b) for b in bits}
        keys = [f"{layer}:{kind}:{b}" for kind in KINDS for b in bits]
        cases = [{(layer, kind): qs[b][j]} for j, kind in enumerate(KINDS) for b in bits]
        for key, (k_, n_) in zip(keys, run_cases(model, ref, layer, cases), strict=True):
            kl[key], nll[key] = k_, n_
    return kl, nll, ref.nll_ref, floor
