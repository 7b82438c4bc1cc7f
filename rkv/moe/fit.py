"""Fitting a MoEfication of a dense SwiGLU model, and its on-disk cache.

For every decoder layer, the MLP's ``d_ff`` neurons are split into ``E`` equal groups of
neurons that fire together (balanced k-means on the neurons' activation patterns
``|silu(gate x) * (up x)|`` over calibration tokens, after Zhang et al. 2022, "MoEfication"),
and a linear router ``d_model -> E`` is fitted by ridge least squares to predict each group's
activation mass ``||a_S(x)||_2`` from the MLP input ``x``. The fit is a neuron permutation
per layer (expert ``e`` holds neurons ``perm[e*n:(e+1)*n]``) and the router weights.

The fit is cached as ``.npz`` (no pickle) keyed by the dense model's fingerprint, ``E`` and a
hash of the fit settings and calibration tokens; a damaged cache file is a typed
:class:`FitCacheError` (the loader in :mod:`rkv.moe.model` refits and rewrites it).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rkv.errors import InputError, IntegrityError

FIT_VERSION = 1
CAL_WINDOWS = 16
CAL_LENGTH = 256


class FitCacheError(IntegrityError):
    """A cached MoE fit file is unreadable, malformed or for another model or setting."""


@dataclass(frozen=True)
class FitConfig:
    """What a fit depends on besides the model and the calibration tokens."""

    n_experts: int = 8
    iters: int = 20          # balanced k-means rounds (stops early when stable)
    seed: int = 0
    ridge: float = 1e-3      # relative to mean(diag(X^T X))
    version: int = FIT_VERSION

    def digest(self, calibration: Sequence[Sequence[int]]) -> str:
        h = hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode())
        for w in calibration:
            h.update(np.asarray(w, dtype=np.int64).tobytes())
            h.update(b"|")
        return h.hexdigest()


@dataclass(frozen=True)
class Fit:
    """A fitted MoEfication: ``perm`` [L, d_ff] (int64), ``router_w`` [L, E, d_model] and
    ``router_b`` [L, E] (float32)."""

    perm: np.ndarray
    router_w: np.ndarray
    router_b: np.ndarray
    model_fingerprint: str
    config_digest: str
    seconds: float

    @property
    def n_experts(self) -> int:
        return int(self.router_w.shape[1])


# -- the dense model -------------------------------------------------------------------------
def mlp_layers(model: Any) -> list[Any]:
    """The decoder layers of a Llama-style HF causal LM (each with ``.mlp``)."""
    try:
        layers = list(model.model.layers)
    except AttributeError as exc:
        raise InputError("not a Llama-style causal LM (no model.layers)") from exc
    if not layers:
        raise InputError("the model has no decoder layers")
    return layers


def dense_weights(mlp: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(gate [d_ff, d], up [d_ff, d], down [d, d_ff]) of a SwiGLU MLP, float32 numpy."""
    try:
        act = getattr(mlp, "act_fn", None)
        parts = [mlp.gate_proj, mlp.up_proj, mlp.down_proj]
    except AttributeError as exc:
        raise InputError("the MLP is not SwiGLU (gate_proj, up_proj, down_proj)") from exc
    if any(getattr(p, "bias", None) is not None for p in parts):
        raise InputError("MLPs with biases are not supported")
    if act is not None and type(act).__name__ not in ("SiLU", "SiLUActivation"):
        raise InputError(f"the MLP's activation is {type(act).__name__}, not SiLU")
    gate, up, down = (p.weight.detach().float().cpu().numpy() for p in parts)
    return gate, up, down


def model_fingerprint(model: Any) -> str:
    """sha256 (hex) of the model's config shape and every parameter's bytes."""
    h = hashlib.sha256()
    cfg = model.config
    h.update(json.dumps([int(cfg.num_hidden_layers), int(cfg.hidden_size),
                         int(cfg.intermediate_size), int(cfg.vocab_size)]).encode())
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(str(p.dtype).encode())
        h.update(p.detach().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def mlp_inputs(model: Any, windows: Sequence[Sequence[int]]) -> np.ndarray:
    """[L, T, d_model] float32: every layer's MLP input for the windows' tokens (the dense
    model, each window a separate forward)."""
    import torch

    layers = mlp_layers(model)
    got: list[list[np.ndarray]] = [[] for _ in layers]

    def hook(i: int) -> Any:
        def pre(_mod: Any, args: tuple[Any, ...]) -> None:
            got[i].append(args[0].detach().float().reshape(-1, args[0].shape[-1]).numpy())
        return pre

    handles = [la.mlp.register_forward_pre_hook(hook(i)) for i, la in enumerate(layers)]
    try:
        with torch.no_grad():
            for w in windows:
                model(torch.tensor([list(w)], dtype=torch.long), use_cache=False)
    finally:
        for hd in handles:
            hd.remove()
    return np.stack([np.concatenate(g) for g in got]).astype(np.float32, copy=False)


# -- the fit ---------------------------------------------------------------------------------
def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))  # type: ignore[no-any-return]


def balanced_assign(sim: np.ndarray, size: int) -> np.ndarray:
    """Labels [n]: each row to a column, at most ``size`` rows per column, greedily by
    descending similarity (``sim`` [n, k], n == k * size)."""
    n, k = sim.shape
    order = np.argsort(-sim, axis=None, kind="stable")
    labels = np.full(n, -1, dtype=np.int64)
    room = np.full(k, size, dtype=np.int64)
    left = n
    for flat in order.tolist():
        i, c = divmod(flat, k)
        if labels[i] < 0 and room[c] > 0:
            labels[i] = c
            room[c] -= 1
            left -= 1
            if left == 0:
                break
    return labels


def balanced_kmeans(features: np.ndarray, k: int, iters: int, seed: int) -> np.ndarray:
    """Equal-size clusters of the rows of ``features`` [n, T] by cosine similarity
    (spherical k-means with a balanced assignment step); labels [n]."""
    n = features.shape[0]
    if k < 1 or n % k:
        raise InputError(f"{n} neurons do not split into {k} equal experts")
    f = features / np.maximum(np.linalg.norm(features, axis=1, keepdims=True), 1e-12)
    rng = np.random.default_rng(seed)
    # k-means++ seeding on cosine distance
    centers = [int(rng.integers(n))]
    best = 1.0 - f @ f[centers[0]]
    for _ in range(1, k):
        p = np.maximum(best, 0.0) ** 2
        total = float(p.sum())
        c = int(rng.choice(n, p=p / total)) if total > 0 else int(rng.integers(n))
        centers.append(c)
        best = np.minimum(best, 1.0 - f @ f[c])
    cent = f[centers].copy()
    labels = np.full(n, -1, dtype=np.int64)
    for _ in range(max(1, iters)):
        new = balanced_assign(f @ cent.T, n // k)
        if np.array_equal(new, labels):
            break
        labels = new
        for c in range(k):
            m = f[labels == c].mean(axis=0)
            cent[c] = m / max(float(np.linalg.norm(m)), 1e-12)
    return labels


def fit_layer(gate: np.ndarray, up: np.ndarray, x: np.ndarray, cfg: FitConfig
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(perm [d_ff], router_w [E, d], router_b [E]) for one layer from its MLP inputs x."""
    e = cfg.n_experts
    act = np.abs(_silu(x @ gate.T) * (x @ up.T))                 # [T, d_ff]
    labels = balanced_kmeans(act.T, e, cfg.iters, cfg.seed)
    perm = np.concatenate([np.flatnonzero(labels == c) for c in range(e)])
    size = gate.shape[0] // e
    mass = np.sqrt((act[:, perm] ** 2).reshape(len(x), e, size).sum(axis=2))  # [T, E]
    xb = np.concatenate([x, np.ones((len(x), 1), dtype=x.dtype)], axis=1).astype(np.float64)
    gram = xb.T @ xb
    lam = cfg.ridge * float(np.mean(np.diag(gram)))
    sol = np.linalg.solve(gram + lam * np.eye(len(gram)), xb.T @ mass.astype(np.float64))
    return (perm.astype(np.int64), sol[:-1].T.astype(np.float32),
            sol[-1].astype(np.float32))


def fit_moe(model: Any, calibration: Sequence[Sequence[int]], cfg: FitConfig) -> Fit:
    """Fit every layer of ``model`` on the calibration windows (token id lists)."""
    if not calibration or not all(len(w) for w in calibration):
        raise InputError("no calibration tokens")
    t0 = time.perf_counter()
    layers = mlp_layers(model)
    xs = mlp_inputs(model, calibration)
    perms, ws, bs = [], [], []
    for i, la in enumerate(layers):
        gate, up, _down = dense_weights(la.mlp)
        p, w, b = fit_layer(gate, up, xs[i], cfg)
        perms.append(p)
        ws.append(w)
        bs.append(b)
    return Fit(np.stack(perms), np.stack(ws), np.stack(bs), model_fingerprint(model),
               cfg.digest(calibration), time.perf_counter() - t0)


# -- the cache -------------------------------------------------------------------------------
def cache_path(cache_dir: Path, fingerprint: str, n_experts: int, digest: str) -> Path:
    return cache_dir / f"{fingerprint[:16]}-E{n_experts}-{digest[:16]}.npz"


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "rkv" / "moe"


def save_fit(path: Path, fit: Fit) -> None:
    """Write the fit atomically (temporary file, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, perm=fit.perm, router_w=fit.router_w, router_b=fit.router_b,
                     fingerprint=np.array(fit.model_fingerprint),
                     digest=np.array(fit.config_digest), seconds=np.array(fit.seconds),
                     version=np.array(FIT_VERSION))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_fit(path: Path, fingerprint: str, digest: str, layers: int, d_ff: int,
             d_model: int, n_experts: int) -> Fit:
    """The fit cached at ``path``, checked against what it must be; FitCacheError if the file
    is unreadable, malformed, or for another model or setting (FileNotFoundError if absent)."""
    if not path.exists():
        raise FileNotFoundError(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            arrs = {k: z[k] for k in ("perm", "router_w", "router_b", "fingerprint", "digest",
                                      "seconds", "version")}
    except Exception as exc:   # zipfile, OSError, ValueError, KeyError, EOFError ...
        raise FitCacheError(f"{path}: unreadable MoE fit cache ({exc})") from exc
    perm, w, b = arrs["perm"], arrs["router_w"], arrs["router_b"]
    problems = []
    if str(arrs["fingerprint"]) != fingerprint or str(arrs["digest"]) != digest:
        problems.append("fit for another model or setting")
    if arrs["version"].shape != () or int(arrs["version"]) != FIT_VERSION:
        problems.append("other fit version")
    if perm.shape != (layers, d_ff) or perm.dtype.kind not in "iu":
        problems.append(f"perm shape {perm.shape}")
    elif not all(np.array_equal(np.sort(row), np.arange(d_ff)) for row in perm):
        problems.append("perm is not a permutation")
    if w.shape != (layers, n_experts, d_model) or b.shape != (layers, n_experts):
        problems.append(f"router shapes {w.shape}, {b.shape}")
    elif w.dtype.kind != "f" or b.dtype.kind != "f" or not (
            np.all(np.isfinite(w)) and np.all(np.isfinite(b))):
        problems.append("router weights not finite floats")
    if arrs["seconds"].shape != () or arrs["seconds"].dtype.kind not in "fiu":
        problems.append("seconds is not a number")
    if problems:
        raise FitCacheError(f"{path}: bad MoE fit cache: {'; '.join(problems)}")
    return Fit(perm.astype(np.int64), w.astype(np.float32), b.astype(np.float32), fingerprint,
               digest, float(arrs["seconds"]))
