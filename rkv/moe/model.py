"""A real MoE model on a CPU: MoEfication of SmolLM2-135M (or any Llama-style SwiGLU model).

:meth:`MoEModel.build` splits every decoder layer's MLP into ``E`` equal experts of
co-activated neurons and fits a linear router per layer (:mod:`rkv.moe.fit`), then replaces
each layer's ``mlp`` module by a :class:`MoEMLP`; the rest of the HF model runs unchanged.
Each token picks its own top-``k`` experts by router score; the chosen experts' outputs are
summed without reweighting, so ``k == E`` reproduces the dense MLP (up to float summation
order). Per layer and forward step the MLP asks its :class:`~rkv.moe.experts.ExpertProvider`
once for the union of the experts its tokens chose, and (if ``hint``) then calls
``provider.hint(layer + 1, ids)`` with speculative routing: layer ``l+1``'s router applied to
layer ``l``'s MLP input, before layer ``l``'s experts run.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rkv.errors import InputError, RkvError
from rkv.extras import require_torch
from rkv.moe.experts import ExpertProvider, ExpertWeights, ResidentExperts
from rkv.moe.fit import (
    CAL_LENGTH,
    CAL_WINDOWS,
    Fit,
    FitCacheError,
    FitConfig,
    cache_path,
    default_cache_dir,
    dense_weights,
    fit_moe,
    load_fit,
    mlp_layers,
    model_fingerprint,
    save_fit,
)

Recorder = Callable[[int, Any, Any, Any], None]   # (layer, mlp input, top ids, top scores)


@dataclass(frozen=True)
class MoESpec:
    """What identifies a MoE model and sizes its experts (for keying stored experts and
    for trace headers). ``expert_bytes`` is one expert's three matrices at fp16."""

    model: str
    fingerprint: str
    layers: int
    experts: int
    top_k: int
    d_model: int
    d_ff: int

    @property
    def expert_neurons(self) -> int:
        return self.d_ff // self.experts

    @property
    def expert_bytes(self) -> int:
        return 3 * self.expert_neurons * self.d_model * 2


@dataclass(frozen=True)
class Routes:
    """Per-token routing of one forward: ``experts`` [T, L, k] int64 (each token's chosen
    experts per layer, by descending router score), their ``scores`` [T, L, k] float32, and
    ``hints`` [T, L, k] int64: per token, layer ``l``'s router applied to layer ``l-1``'s MLP
    input (the speculative routing the model hints; -1 for layer 0)."""

    experts: np.ndarray
    scores: np.ndarray
    hints: np.ndarray


class _Shared:
    """State every layer's MoEMLP reads (kept outside nn.Module registration)."""

    def __init__(self, provider: ExpertProvider, top_k: int, hint: bool,
                 routers: list[tuple[Any, Any]]) -> None:
        self.provider = provider
        self.top_k = top_k
        self.hint = hint
        self.routers = routers
        self.recorder: Recorder | None = None


def _tensor(a: np.ndarray, dtype: Any) -> Any:
    torch = require_torch("the MoE model")

    if not a.flags.writeable:
        a = a.copy()
    return torch.from_numpy(np.ascontiguousarray(a)).to(dtype)


def _make_mlp_class() -> type:
    require_torch("the MoE model")      # the typed error when torch is missing
    import torch
    import torch.nn.functional as fn

    class MoEMLP(torch.nn.Module):  # type: ignore[misc]
        """A top-k MoE replacement of one layer's SwiGLU MLP."""

        def __init__(self, layer: int, n_experts: int, shared: _Shared) -> None:
            super().__init__()
            self.layer = layer
            self.n_experts = n_experts
            self._shared = shared

        def _select(self, h: Any, layer: int, k: int) -> tuple[Any, Any]:
            w, b = self._shared.routers[layer]
            scores = fn.linear(h, w, b)
            return scores.topk(k, dim=-1)  # type: ignore[no-any-return]

        def forward(self, x: Any) -> Any:
            s = self._shared
            shape = x.shape
            h = x.reshape(-1, shape[-1])
            k = min(s.top_k, self.n_experts)
            top_s, top_i = self._select(h, self.layer, k)
            if s.recorder is not None:
                s.recorder(self.layer, h, top_i, top_s)
            union = sorted(int(e) for e in torch.unique(top_i).tolist())
            got = s.provider.experts(self.layer, union)
            missing = [e for e in union if e not in got]
            if missing:
                raise RkvError(f"expert provider returned no weights for layer {self.layer} "
                               f"experts {missing}")
            if s.hint and self.layer + 1 < len(s.routers):
                _, nxt = self._select(h, self.layer + 1, k)
                s.provider.hint(self.layer + 1, sorted(int(e) for e in
                                                       torch.unique(nxt).tolist()))
            out = torch.zeros_like(h)
            chosen = torch.zeros(h.shape[0], self.n_experts, dtype=torch.bool,
                                 device=h.device).scatter_(1, top_i, True)
            for e in union:
                wts = got[e]
                gate, up, down = (_tensor(a, h.dtype) for a in (wts.gate, wts.up, wts.down))
                rows = torch.nonzero(chosen[:, e]).squeeze(1)
                if len(rows) == h.shape[0]:
                    out += fn.linear(fn.silu(fn.linear(h, gate)) * fn.linear(h, up), down)
                else:
                    hr = h.index_select(0, rows)
                    y = fn.linear(fn.silu(fn.linear(hr, gate)) * fn.linear(hr, up), down)
                    out.index_add_(0, rows, y)
            return out.reshape(shape)

    return MoEMLP


def split_experts(gate: np.ndarray, up: np.ndarray, down: np.ndarray, perm: np.ndarray,
                  n_experts: int) -> list[ExpertWeights]:
    """The ``n_experts`` experts of one dense SwiGLU layer, expert ``e`` holding neurons
    ``perm[e*n:(e+1)*n]`` (float32, C-contiguous copies)."""
    n = gate.shape[0] // n_experts
    out = []
    for e in range(n_experts):
        idx = perm[e * n:(e + 1) * n]
        out.append(ExpertWeights(np.ascontiguousarray(gate[idx], dtype=np.float32),
                                 np.ascontiguousarray(up[idx], dtype=np.float32),
                                 np.ascontiguousarray(down[:, idx], dtype=np.float32)))
    return out


class MoEModel:
    """A HF causal LM whose MLPs are top-k MoE layers (build with :meth:`build`)."""

    def __init__(self, model: Any, fit: Fit, experts: list[list[ExpertWeights]], name: str,
                 top_k: int, provider: ExpertProvider | None, hint: bool) -> None:
        torch = require_torch("the MoE model")

        self.model = model
        self.fit = fit
        self.experts = experts
        self.name = name
        self.n_experts = fit.n_experts
        self._dense = [la.mlp for la in mlp_layers(model)]
        routers = [(torch.from_numpy(fit.router_w[i].copy()), torch.from_numpy(
            fit.router_b[i].copy())) for i in range(len(self._dense))]
        self._shared = _Shared(provider or ResidentExperts(experts), 1, hint, routers)
        self.set_top_k(top_k)
        cls = _make_mlp_class()
        for i, la in enumerate(mlp_layers(model)):
            la.mlp = cls(i, self.n_experts, self._shared)
        h = hashlib.sha256(fit.model_fingerprint.encode())
        for a in (fit.perm, fit.router_w, fit.router_b):
            h.update(np.ascontiguousarray(a).tobytes())
        self.fingerprint = h.hexdigest()

    # -- construction --------------------------------------------------------------------
    @classmethod
    def build(cls, model: Any, n_experts: int = 8, top_k: int = 2,
              provider: ExpertProvider | None = None, cache_dir: str | Path | None = None,
              *, tokenizer: Any = None, calibration: Sequence[Sequence[int]] | None = None,
              hint: bool = True, name: str | None = None, config: FitConfig | None = None,
              log: Callable[[str], None] | None = None) -> MoEModel:
        """MoEfy ``model`` in place (its MLP modules are replaced; :meth:`restore` puts them
        back). Calibration tokens: ``calibration`` windows, else ``tokenizer`` over the first
        windows of ``pydoc_data.topics`` (:func:`calibration_text`). The fit is loaded from
        ``cache_dir`` (default ``~/.cache/rkv/moe``) or fitted and saved there; a damaged
        cache file is refitted and overwritten."""
        cfg = config or FitConfig(n_experts=n_experts)
        if cfg.n_experts != n_experts:
            raise InputError("config.n_experts differs from n_experts")
        layers = mlp_layers(model)
        gate0, _, _ = dense_weights(layers[0].mlp)
        d_ff, d_model = gate0.shape
        if n_experts < 1 or d_ff % n_experts:
            raise InputError(f"{d_ff} neurons do not split into {n_experts} equal experts")
        if calibration is None:
            if tokenizer is None:
                raise InputError("need calibration token windows or a tokenizer")
            calibration = calibration_text(tokenizer)
        fp = model_fingerprint(model)
        digest = cfg.digest(calibration)
        path = cache_path(Path(cache_dir) if cache_dir else default_cache_dir(), fp,
                          n_experts, digest)
        fit: Fit | None = None
        try:
            fit = load_fit(path, fp, digest, len(layers), d_ff, d_model, n_experts)
        except FileNotFoundError:
            pass
        except FitCacheError as exc:
            warnings.warn(f"refitting: {exc}", stacklevel=2)
        if fit is None:
            if log:
                log(f"fitting E={n_experts} experts on {len(calibration)} windows ...")
            fit = fit_moe(model, calibration, cfg)
            save_fit(path, fit)
            if log:
                log(f"fitted in {fit.seconds:.1f} s; cached at {path}")
        experts = [split_experts(*dense_weights(la.mlp), fit.perm[i], n_experts)
                   for i, la in enumerate(layers)]
        return cls(model, fit, experts, name or str(getattr(model.config, "name_or_path", "")
                                                     or "model"), top_k, provider, hint)

    # -- settings ------------------------------------------------------------------------
    @property
    def top_k(self) -> int:
        return self._shared.top_k

    def set_top_k(self, k: int) -> None:
        if not 1 <= int(k) <= self.n_experts:
            raise InputError(f"top_k must be in 1..{self.n_experts}, got {k}")
        self._shared.top_k = int(k)

    @property
    def provider(self) -> ExpertProvider:
        return self._shared.provider

    def set_provider(self, provider: ExpertProvider | None) -> None:
        """Where the experts' weights come from (None: the resident split)."""
        self._shared.provider = provider or ResidentExperts(self.experts)

    @property
    def hint(self) -> bool:
        return self._shared.hint

    def set_hint(self, enabled: bool) -> None:
        self._shared.hint = bool(enabled)

    @property
    def spec(self) -> MoESpec:
        d_model = int(self.experts[0][0].gate.shape[1])
        return MoESpec(self.name, self.fingerprint, len(self.experts), self.n_experts,
                       self.top_k, d_model, int(self.fit.perm.shape[1]))

    def trace_header(self) -> dict[str, Any]:
        """The header of a routing trace of this model at its current ``top_k``."""
        s = self.spec
        return {"format": "rkv-moe-trace", "version": 1, "model": s.model,
                "fingerprint": s.fingerprint, "layers": s.layers, "experts": s.experts,
                "top_k": s.top_k, "expert_bytes": s.expert_bytes}

    # -- running -------------------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.model(*args, **kwargs)

    __call__ = forward

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        return self.model.generate(*args, **kwargs)

    def route(self, input_ids: Any) -> Routes:
        """Run one forward (no KV cache) over ``input_ids`` (batch 1: a list of ids, or a
        [T] / [1, T] tensor) and return each token's chosen experts per layer."""
        torch = require_torch("the MoE model")
        import torch.nn.functional as fn

        ids = torch.as_tensor(input_ids, dtype=torch.long)
        if ids.dim() == 1:
            ids = ids[None]
        if ids.dim() != 2 or ids.shape[0] != 1 or ids.shape[1] == 0:
            raise InputError(f"route takes one non-empty sequence, got shape "
                             f"{tuple(ids.shape)}")
        got: dict[int, tuple[Any, Any, Any]] = {}

        def record(layer: int, h: Any, idx: Any, scores: Any) -> None:
            got[layer] = (h.detach(), idx, scores.detach())

        self._shared.recorder = record
        try:
            with torch.no_grad():
                self.model(ids, use_cache=False)
        finally:
            self._shared.recorder = None
        n, k = len(self.experts), self.top_k
        experts = np.stack([got[i][1].numpy() for i in range(n)], axis=1).astype(np.int64)
        scores = np.stack([got[i][2].float().numpy() for i in range(n)], axis=1)
        hints = np.full_like(experts, -1)
        with torch.no_grad():
            for i in range(1, n):
                w, b = self._shared.routers[i]
                hints[:, i] = fn.linear(got[i - 1][0], w, b).topk(k, dim=-1).indices.numpy()
        return Routes(experts, scores.astype(np.float32), hints)

    def restore(self) -> Any:
        """Put the dense MLPs back (this MoEModel is unusable afterwards); the HF model."""
        for la, mlp in zip(mlp_layers(self.model), self._dense, strict=True):
            la.mlp = mlp
        return self.model


def calibration_text(tokenizer: Any, n_windows: int = CAL_WINDOWS,
                     length: int = CAL_LENGTH) -> list[list[int]]:
    """Calibration windows: ``n_windows`` evenly spaced windows of the first
    ``40 * length * (n_windows + 1)`` characters of ``pydoc_data.topics`` (as
    :func:`rkv.eval.calibrate_measure.calibration_windows` cuts them)."""
    from rkv.eval.calibrate_measure import calibration_windows

    return calibration_windows(tokenizer, n_windows, ("topics",), length)[0]


def heldout_text(tokenizer: Any, n_windows: int, length: int = CAL_LENGTH,
                 source: str = "topics") -> list[list[int]]:
    """Windows of text the fit never saw: ``topics``: evenly spaced in the part of
    ``pydoc_data.topics`` after the calibration characters; ``docs``: rkv's own docs."""
    if source == "topics":
        from pydoc_data.topics import topics

        text = "\n\n".join(topics[k] for k in sorted(topics))
        ids = list(tokenizer(text[40 * CAL_LENGTH * (CAL_WINDOWS + 1):]).input_ids)
    elif source == "docs":
        from rkv.eval.calibrate_measure import docs_files

        ids = list(tokenizer("\n\n".join(p.read_text(encoding="utf-8")
                                         for p in docs_files())).input_ids)
    else:
        raise InputError(f"held-out sources are 'topics' and 'docs', got {source!r}")
    if n_windows < 1 or len(ids) < n_windows * length:
        raise InputError(f"{source} holds {len(ids)} tokens, not {n_windows} windows of "
                         f"{length}")
    step = len(ids) // n_windows
    return [ids[i * step:i * step + length] for i in range(n_windows)]


def load_moe_smollm2(n_experts: int = 8, top_k: int = 2,
                     provider: ExpertProvider | None = None,
                     cache_dir: str | Path | None = None, *, hint: bool = True,
                     threads: int | None = None, log: Callable[[str], None] | None = None
                     ) -> tuple[MoEModel, Any]:
    """(MoEModel, tokenizer) of SmolLM2-135M-Instruct, fitted on ``pydoc_data.topics``
    (cached; the first fit takes about a minute on 2 cores)."""
    from rkv.eval.quality import SMOLLM2_ID, load_smollm2

    model, tok = load_smollm2(threads=threads)
    moe = MoEModel.build(model, n_experts, top_k, provider, cache_dir, tokenizer=tok,
                         hint=hint, name=SMOLLM2_ID, log=log)
    return moe, tok

