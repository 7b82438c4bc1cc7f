"""Expert quality profile: the KL a MoE model's next-token distribution pays when one expert
is stored at ``bits`` bits (``rowq``), per (layer, expert, bits); what the expert planner
(:mod:`rkv.moe.expert_plans`) trades against bytes and read time (docs/moe.md, "Per-expert
bits and codes").

Measuring every expert alone would take ``layers x experts x bits`` forwards. Instead, per
layer and bit-width the profile measures the KL with **all** of that layer's experts quantized
(the model re-run from that layer only, every calibration window in one batch), then splits it
over the layer's experts in proportion to each one's share of the layer's output error: the
squared difference between its quantized and exact outputs, summed over the calibration tokens
the router sent to it. An expert the calibration text never chose gets no share (a token that
never visits it pays nothing). Errors do not add up: a quantized layer changes the routing of
the layers after it, and the KL saturates, so the sum of the per-layer KLs overstates the KL
of all layers quantized together (2.5-3.4x on SmolLM2-135M, E = 8, k = 6). The profile also
measures that whole-model KL per bit-width and scales every entry by ``all_kl / sum``, so a
uniform plan is predicted exactly; ``bench_moe_plan.py`` measures how far mixed plans are
off on held-out text.

The JSON document (``rkv-moe-profile`` version 1) carries the MoE model's fingerprint and
top-k, the stored dtype, the bit-widths, ``layer_kl[layer][bits]`` and
``share[layer][expert][bits]`` and ``all_kl[bits]``; reading it is strict
(:func:`rkv.specs.strict_json`, every value checked), so a damaged profile is a
:class:`~rkv.errors.ConfigError`, never a wrong plan.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rkv.errors import ConfigError, InputError
from rkv.moe.experts import ExpertWeights, ResidentExperts

if TYPE_CHECKING:
    from rkv.moe.model import MoEModel

FORMAT = "rkv-moe-profile"
VERSION = 1
PROFILE_BITS = (8, 4)


@dataclass(frozen=True, eq=False)
class ExpertProfile:
    """KL per (layer, expert, bits): ``scale[b] * layer_kl[l, b] * share[l, e, b]`` with
    ``scale = all_kl / layer_kl.sum(0)`` (16 bits: 0)."""

    model: str                 # the MoE model's fingerprint (MoEModel.fingerprint)
    top_k: int
    dtype: str                 # the stored dtype the quantizer saw
    bits: tuple[int, ...]
    layer_kl: np.ndarray       # [L, len(bits)] nats per token, all of a layer's experts
    share: np.ndarray          # [L, E, len(bits)], each [l, :, b] sums to 1 (or all 0)
    all_kl: np.ndarray         # [len(bits)] every expert of every layer at those bits
    windows: int = 0
    tokens: int = 0

    def __post_init__(self) -> None:
        lk, sh = np.asarray(self.layer_kl, np.float64), np.asarray(self.share, np.float64)
        al = np.asarray(self.all_kl, np.float64)
        nb = len(self.bits)
        if not self.bits or any(b not in PROFILE_BITS for b in self.bits) or \
                len(set(self.bits)) != nb:
            raise ConfigError(f"expert profile: bits must be distinct values of "
                              f"{PROFILE_BITS}, got {list(self.bits)}")
        if lk.ndim != 2 or lk.shape[1] != nb or sh.ndim != 3 or sh.shape[0] != lk.shape[0] \
                or sh.shape[2] != nb or sh.shape[1] < 1 or al.shape != (nb,):
            raise ConfigError(f"expert profile: layer_kl {list(lk.shape)} and share "
                              f"{list(sh.shape)} do not fit {nb} bit-widths")
        if not all(np.isfinite(a).all() and (a >= 0).all() for a in (lk, sh, al)):
            raise ConfigError("expert profile: values must be finite and >= 0")
        sums = sh.sum(axis=1)
        if not (np.isclose(sums, 1.0, atol=1e-6) | (sums == 0)).all():
            raise ConfigError("expert profile: each layer's shares must sum to 1")
        object.__setattr__(self, "layer_kl", lk)
        object.__setattr__(self, "share", sh)
        object.__setattr__(self, "all_kl", al)

    @property
    def scale(self) -> np.ndarray:
        """Per bit-width, measured whole-model KL over the sum of per-layer KLs."""
        tot = self.layer_kl.sum(axis=0)
        return np.where(tot > 0, self.all_kl / np.where(tot > 0, tot, 1.0), 0.0)

    @property
    def layers(self) -> int:
        return int(self.layer_kl.shape[0])

    @property
    def experts(self) -> int:
        return int(self.share.shape[1])

    def kl(self, layer: int, expert: int, bits: int) -> float:
        """Expected KL (nats per token) of storing this one expert at ``bits``."""
        if bits >= 16:
            return 0.0
        if bits not in self.bits:
            raise ConfigError(f"expert profile: no entry for {bits} bits (has "
                              f"{list(self.bits)})")
        if not (0 <= layer < self.layers and 0 <= expert < self.experts):
            raise ConfigError(f"expert profile: no expert {layer}/{expert} (profile of "
                              f"{self.layers} x {self.experts})")
        b = self.bits.index(bits)
        return float(self.scale[b] * self.layer_kl[layer, b] * self.share[layer, expert, b])

    def table(self) -> np.ndarray:
        """``[L, E, len(bits)]``: every entry of :meth:`kl`."""
        out: np.ndarray = self.share * self.layer_kl[:, None, :] * self.scale[None, None, :]
        return out

    # -- JSON ----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "model": self.model,
                "top_k": self.top_k, "dtype": self.dtype, "bits": list(self.bits),
                "windows": self.windows, "tokens": self.tokens,
                "layer_kl": self.layer_kl.tolist(), "share": self.share.tolist(),
                "all_kl": self.all_kl.tolist()}

    @classmethod
    def from_dict(cls, doc: Any) -> ExpertProfile:
        if not isinstance(doc, dict) or doc.get("format") != FORMAT or \
                doc.get("version") != VERSION:
            raise ConfigError(f"expert profile: not an {FORMAT} v{VERSION} document")
        want = {"format", "version", "model", "top_k", "dtype", "bits", "windows", "tokens",
                "layer_kl", "share", "all_kl"}
        if set(doc) != want:
            raise ConfigError(f"expert profile: keys {sorted(set(doc) ^ want)} are wrong")
        for key in ("top_k", "windows", "tokens"):
            if isinstance(doc[key], bool) or not isinstance(doc[key], int) or doc[key] < 0:
                raise ConfigError(f"expert profile: {key} must be an integer >= 0")
        if not (isinstance(doc["model"], str) and isinstance(doc["dtype"], str)
                and isinstance(doc["bits"], list)
                and all(isinstance(b, int) and not isinstance(b, bool) for b in doc["bits"])):
            raise ConfigError("expert profile: model, dtype and bits have the wrong types")
        try:
            lk = np.asarray(doc["layer_kl"], dtype=np.float64)
            sh = np.asarray(doc["share"], dtype=np.float64)
            al = np.asarray(doc["all_kl"], dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"expert profile: layer_kl/share are not numeric arrays: "
                              f"{exc}") from exc
        return cls(doc["model"], doc["top_k"], doc["dtype"], tuple(doc["bits"]), lk, sh, al,
                   doc["windows"], doc["tokens"])

    def save(self, path: str | Path) -> None:
        import json

        p = Path(path)
        tmp = p.with_name(p.name + ".tmp")
        tmp.write_text(json.dumps(self.to_dict()), encoding="utf-8")
        os.replace(tmp, p)

    @classmethod
    def load(cls, path: str | Path) -> ExpertProfile:
        from rkv.inputs import read_json

        return cls.from_dict(read_json(path, "expert profile"))


# -- measuring ---------------------------------------------------------------------------------
def quantized(w: ExpertWeights, bits: int, dtype: str = "float16") -> ExpertWeights:
    """The weights an expert stored at ``bits`` (``rowq``, after a cast to ``dtype``) reads
    back as, in float32: the exact transform :class:`rkv.adapters.moe.RkvExperts` applies."""
    from rkv.format.dtypes import numpy_dtype
    from rkv.moe.store import pack, unpack
    from rkv.quant.rowq import RowQuantizer

    dt = numpy_dtype(dtype)
    cast = ExpertWeights(w.gate.astype(dt), w.up.astype(dt), w.down.astype(dt))
    block = pack(cast)
    n, d = cast.gate.shape
    if bits < 16:
        q = RowQuantizer(bits)
        block = q.decode(q.encode(block), block.shape, dtype)
    back = unpack(block, n, d)
    return ExpertWeights(*(a.astype(np.float32) for a in (back.gate, back.up, back.down)))


class _Overlay(ResidentExperts):
    """Resident experts with one layer's replaced."""

    def __init__(self, base: Sequence[Sequence[ExpertWeights]]) -> None:
        super().__init__(base)
        self._base = [list(x) for x in base]

    def swap(self, layer: int, experts: Sequence[ExpertWeights] | None) -> None:
        self.layers[layer] = list(experts) if experts is not None else self._base[layer]


def _expert_out(w: ExpertWeights, h: Any) -> Any:
    import torch
    import torch.nn.functional as fn

    g, u, dn = (torch.from_numpy(np.ascontiguousarray(a)) for a in (w.gate, w.up, w.down))
    return fn.linear(fn.silu(fn.linear(h, g)) * fn.linear(h, u), dn)


def measure_expert_profile(moe: MoEModel, windows: Sequence[Sequence[int]],
                           bits: Sequence[int] = PROFILE_BITS, dtype: str = "float16",
                           log: Callable[[str], None] | None = None) -> ExpertProfile:
    """Measure a profile on ``windows`` (token lists of one length; calibration text, not
    the text it will be judged on). About ``layers x len(bits) / 2`` batched forwards."""
    import torch

    if not windows or len({len(w) for w in windows}) != 1 or len(windows[0]) < 2:
        raise InputError("profile windows must be one length, at least 2 tokens each")
    bits = tuple(int(b) for b in bits)
    layers = moe.model.model.layers
    n_layers, n_exp = len(moe.experts), moe.n_experts
    exact = [[quantized(w, 16, dtype) for w in layer] for layer in moe.experts]
    provider = _Overlay(exact)
    saved = moe.provider
    moe.set_provider(provider)
    ids = torch.tensor([list(w) for w in windows])
    inputs: dict[int, tuple[Any, dict[str, Any]]] = {}
    mlp_in: dict[int, tuple[Any, Any]] = {}

    def grab(i: int) -> Any:
        def hook(_m: Any, args: Any, kwargs: Any) -> None:
            inputs[i] = (args[0] if args else kwargs["hidden_states"], dict(kwargs))
        return hook

    handles = [la.register_forward_pre_hook(grab(i), with_kwargs=True)
               for i, la in enumerate(layers)]
    moe._shared.recorder = lambda layer, h, idx, _s: mlp_in.__setitem__(layer, (h, idx))
    try:
        with torch.no_grad():
            ref = torch.log_softmax(moe(ids, use_cache=False).logits.double(), -1)
    finally:
        moe._shared.recorder = None
        for h in handles:
            h.remove()
    p_ref = ref.exp()
    neg_ent = (p_ref * ref).sum(-1)

    def kl_from(start: int) -> float:
        h = inputs[start][0]
        with torch.no_grad():
            for i in range(start, n_layers):
                h = layers[i](h, **{k: v for k, v in inputs[i][1].items()
                                    if k != "hidden_states"})
            z = moe.model.lm_head(moe.model.model.norm(h)).double()
            kl = neg_ent - (p_ref * z).sum(-1) + torch.logsumexp(z, -1)
        return float(kl.mean())

    try:
        check = kl_from(0)
        if not check < 1e-6:
            raise InputError(f"re-running the layers does not reproduce the model's output "
                             f"(KL {check:.2e}): an unsupported model layout")
        layer_kl = np.zeros((n_layers, len(bits)))
        share = np.zeros((n_layers, n_exp, len(bits)))
        for li in range(n_layers):
            h, idx = mlp_in[li]
            for bi, b in enumerate(bits):
                q = [quantized(w, b, dtype) for w in moe.experts[li]]
                energy = np.zeros(n_exp)
                with torch.no_grad():
                    for e in range(n_exp):
                        rows = torch.nonzero((idx == e).any(-1)).squeeze(1)
                        if len(rows):
                            hr = h.index_select(0, rows).float()
                            diff = _expert_out(q[e], hr) - _expert_out(exact[li][e], hr)
                            energy[e] = float((diff.double() ** 2).sum())
                provider.swap(li, q)
                try:
                    layer_kl[li, bi] = max(kl_from(li), 0.0)
                finally:
                    provider.swap(li, None)
                total = energy.sum()
                share[li, :, bi] = energy / total if total > 0 else 0.0
            if log:
                log(f"layer {li + 1}/{n_layers}: KL " + ", ".join(
                    f"{b} bits {layer_kl[li, bi]:.4f}" for bi, b in enumerate(bits)))
        all_kl = np.zeros(len(bits))
        for bi, b in enumerate(bits):
            for li in range(n_layers):
                provider.swap(li, [quantized(w, b, dtype) for w in moe.experts[li]])
            all_kl[bi] = max(kl_from(0), 0.0)
            for li in range(n_layers):
                provider.swap(li, None)
    finally:
        moe.set_provider(saved)
    return ExpertProfile(moe.fingerprint, moe.top_k, dtype, bits, layer_kl, share, all_kl,
                         len(windows), len(windows) * len(windows[0]))


def profile_path(cache_dir: str | Path, moe: MoEModel, windows: Sequence[Sequence[int]],
                 bits: Sequence[int], dtype: str) -> Path:
    """Where a profile of these inputs is cached (keyed by model, top-k, text, bits, dtype)."""
    h = hashlib.sha256(f"{moe.fingerprint}|{moe.top_k}|{list(bits)}|{dtype}".encode())
    for w in windows:
        h.update(np.asarray(w, np.int64).tobytes())
    return Path(cache_dir) / f"profile-E{moe.n_experts}-k{moe.top_k}-{h.hexdigest()[:16]}.json"


def cached_profile(moe: MoEModel, windows: Sequence[Sequence[int]], cache_dir: str | Path,
                   bits: Sequence[int] = PROFILE_BITS, dtype: str = "float16",
                   log: Callable[[str], None] | None = None) -> ExpertProfile:
    """The cached profile of these inputs, measured (and cached) when missing or damaged."""
    path = profile_path(cache_dir, moe, windows, bits, dtype)
    if path.exists():
        try:
            prof = ExpertProfile.load(path)
            if prof.model == moe.fingerprint and prof.top_k == moe.top_k:
                return prof
        except ConfigError as exc:
            if log:
                log(f"re-measuring: {exc}")
    prof = measure_expert_profile(moe, windows, bits, dtype, log)
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.save(path)
    return prof


def shipped_path(experts: int, top_k: int) -> Path:
    # A subdirectory: rkv/profiles/*.json are KV quality profiles (rkv.profiles reads them).
    return Path(__file__).resolve().parent.parent / "profiles" / "moe" / (
        f"smollm2-135m-e{experts}k{top_k}.json")


def profile_for(moe: MoEModel, tokenizer: Any, cache_dir: str | Path | None = None,
                log: Callable[[str], None] | None = None) -> ExpertProfile:
    """The profile of this MoE model at its top-k: the shipped one when it is this model's
    (same fingerprint), else cached or measured on 6 calibration windows of 256 tokens (a few
    minutes on 2 cores)."""
    from rkv.moe.fit import default_cache_dir
    from rkv.moe.model import calibration_text

    shipped = shipped_path(moe.n_experts, moe.top_k)
    if shipped.exists():
        prof = ExpertProfile.load(shipped)
        if prof.model == moe.fingerprint and prof.top_k == moe.top_k:
            return prof
    if log:
        log("measuring the expert quality profile (cached) ...")
    windows = [w[:256] for w in calibration_text(tokenizer)[:6]]
    return cached_profile(moe, windows, Path(cache_dir) if cache_dir else default_cache_dir(),
                          log=log)
