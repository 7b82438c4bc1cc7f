"""Options per block: every tier x width x code, with its bytes, P(DUE), P(SDC) and cost terms.

A *width* is (key bits, value bits): the config's ``bits`` give K and V the same width, its
``kv_bits`` pairs of different ones (offered only to ``"kv"`` blocks, which hold both).

Blocks that share a shape, kind and residency share one *template* (the per-option bytes,
probabilities and per-read cost), computed once per tier set and cached; a put's option table
is then a few vectorised gathers. ``predict`` is a black box that can take seconds for a new
(code, size, model, residency): :class:`ReliabilityCache` keeps its answers.
"""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import numpy.typing as npt

from rkv.errors import ConfigError
from rkv.format.dtypes import check_dtype
from rkv.placement.config import BlockInput, PlacementConfig, TierInput
from rkv.quant.widths import Width, as_width, quant_spec

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
GIB = float(1 << 30)


def resolve_model(spec: Any) -> Any:
    """A ``faultmodels`` model from a model, a preset name or a ``get_model`` dict."""
    import faultmodels

    try:
        return faultmodels.get_model(spec)
    except faultmodels.FaultModelError as exc:
        raise ConfigError(f"fault model {spec!r}: {exc}") from exc


def model_key(model: Any) -> str:
    """The model's parameters as canonical JSON: equal models share cache entries."""
    return json.dumps(model.params(), sort_keys=True, default=str)


class ModelCache:
    """``resolve_model`` and ``model_key`` per fault-model spec: a preset name or a dict is
    resolved once (a preset is parsed from its TOML file, milliseconds; a preset file edited
    while the process runs is not re-read); a model object is keyed by its parameters on
    every call, so a changed model is never served stale."""

    def __init__(self) -> None:
        self._d: dict[str, tuple[Any, str]] = {}

    def get(self, spec: Any) -> tuple[Any, str]:
        if isinstance(spec, str):
            key = "s:" + spec
        elif isinstance(spec, Mapping):
            key = "d:" + json.dumps(spec, sort_keys=True, default=str)
        else:
            model = resolve_model(spec)
            return model, model_key(model)
        hit = self._d.get(key)
        if hit is None:
            model = resolve_model(spec)
            hit = self._d[key] = (model, model_key(model))
        return hit


class LRU(OrderedDict[Any, Any]):
    """A dict that keeps its ``size`` most recently used entries."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def lookup(self, key: Any) -> Any:
        hit = self.get(key)
        if hit is not None:
            self.move_to_end(key)
        return hit

    def store(self, key: Any, value: Any) -> None:
        self[key] = value
        if len(self) > self.size:
            self.popitem(last=False)


def _predict_job(args: tuple[str, int, dict[str, Any], float]) -> tuple[float, float, float]:
    from rkv.reliability.analytic import predict

    code, nbytes, params, hours = args
    p = predict(code, nbytes, resolve_model(params), hours)
    return float(p.p_due), float(p.p_sdc), float(p.p_degraded)


class ReliabilityCache:
    """(P(DUE), P(SDC), P(degraded)) by (code, data bytes, model parameters, hours)."""

    def __init__(self) -> None:
        self._d: dict[tuple[str, int, str, float], tuple[float, float, float]] = {}

    def __len__(self) -> int:
        return len(self._d)

    def get(self, code: str, data_bytes: int, model: Any, hours: float,
            mkey: str | None = None) -> tuple[float, float]:
        """(P(DUE), P(SDC))."""
        return self.outcomes(code, data_bytes, model, hours, mkey)[:2]

    def outcomes(self, code: str, data_bytes: int, model: Any, hours: float,
                 mkey: str | None = None) -> tuple[float, float, float]:
        """(P(DUE), P(SDC), P(degraded)): the last is non-zero only for layouts with a
        tolerant part (byte planes)."""
        key = (code, int(data_bytes), mkey or model_key(model), float(hours))
        hit = self._d.get(key)
        if hit is None:
            from rkv.reliability.analytic import predict

            p = predict(code, int(data_bytes), model, float(hours))
            hit = self._d[key] = (float(p.p_due), float(p.p_sdc), float(p.p_degraded))
        return hit

    def entries(self) -> list[tuple[Any, ...]]:
        """Every answer as (code, data bytes, model key, hours, P(DUE), P(SDC),
        P(degraded))."""
        return [(*k, *v) for k, v in self._d.items()]

    def add(self, entries: Iterable[Sequence[Any]]) -> None:
        """Take answers saved by :meth:`entries` (e.g. to skip ``predict`` in a benchmark);
        entries saved before P(degraded) existed (six fields) count it as 0."""
        for e in entries:
            code, nbytes, mkey, hours, p_due, p_sdc = e[:6]
            deg = float(e[6]) if len(e) > 6 else 0.0
            self._d[(str(code), int(nbytes), str(mkey), float(hours))] = (
                float(p_due), float(p_sdc), deg)

    def warm(self, requests: Iterable[tuple[str, int, Any, float]], workers: int = 1,
             progress: Callable[[int, int], None] | None = None) -> int:
        """Compute the missing ``(code, data_bytes, model, hours)`` entries, in ``workers``
        processes when above 1; ``progress(done, total)`` after each (seconds apart for
        some fault models: what ``rkv plan`` shows). Returns how many were computed."""
        todo: dict[tuple[str, int, str, float], tuple[str, int, dict[str, Any], float]] = {}
        for code, nbytes, model, hours in requests:
            key = (code, int(nbytes), model_key(model), float(hours))
            if key not in self._d:
                todo[key] = (code, int(nbytes), model.params(), float(hours))
        if progress is not None:
            progress(0, len(todo))
        if workers > 1 and len(todo) > 1:
            with ProcessPoolExecutor(max_workers=workers) as pool:
                futures = {pool.submit(_predict_job, a): key for key, a in todo.items()}
                for done, fut in enumerate(as_completed(futures), 1):
                    self._d[futures[fut]] = fut.result()
                    if progress is not None:
                        progress(done, len(todo))
        else:
            for done, (key, a) in enumerate(todo.items(), 1):
                self._d[key] = _predict_job(a)
                if progress is not None:
                    progress(done, len(todo))
        return len(todo)


DEFAULT_CACHE = ReliabilityCache()
#: Fault models by spec, process-wide (a preset file is read once per process).
MODELS = ModelCache()


@dataclass(frozen=True)
class Template:
    """Per option (tier-major, then width, then code): its tier index, key bits, code index,
    record bytes, data bytes, P(DUE), P(SDC), microseconds per read and capacity cost, and
    whether it meets the reliability limits and survives dominance pruning; ``width`` indexes
    the config's :attr:`~PlacementConfig.widths` and ``vbits`` are the values' bits."""

    tier: I64
    bits: I64
    code: I64
    record_bytes: F64
    data_bytes: I64
    p_due: F64
    p_sdc: F64
    read_us: F64
    cap_cost: F64
    meets: npt.NDArray[np.bool_]
    kept: npt.NDArray[np.bool_]
    p_degraded: F64 | None = None     # tolerant layouts only (None: all zero)
    width: I64 | None = None          # index into PlacementConfig.widths (None: bits order)
    vbits: I64 | None = None          # the values' bits (None: equal to bits)


def class_key(b: BlockInput) -> tuple[Any, ...]:
    return (b.tokens, b.kind, b.kv_heads, b.head_dim, b.dtype, b.residency_hours)


def data_bytes(b: BlockInput, bits: int | Width) -> int:
    """Bytes of the block's data at ``bits`` (a bit-width for K and V, or a (key bits,
    value bits) width; quantized size from the quantizer itself). A ``k`` or ``v`` block is
    half of its pair's encoding at equal widths (rounded up)."""
    return _data_bytes(b.tokens, b.kind, b.kv_heads, b.head_dim, b.dtype, as_width(bits))


@lru_cache(maxsize=4096)
def _data_bytes(tokens: int, kind: str, heads: int, dim: int, dtype: str, w: Width) -> int:
    from rkv.codec.stages import quantizer_for

    item = check_dtype(dtype, "block: dtype").itemsize
    shape = (2, tokens, heads, dim)
    q = quantizer_for(quant_spec(w))
    full = (q.encoded_size(shape, dtype) if q is not None
            else 2 * tokens * heads * dim * item)
    return full if kind == "kv" else -(-full // 2)


def record_bytes(b: BlockInput, bits: int | Width, code: str) -> int:
    """Bytes of the record the engine writes (framing, header copies, codec parity)."""
    return _record_bytes(b.tokens, b.kind, b.kv_heads, b.head_dim, b.dtype, as_width(bits),
                         code)


@lru_cache(maxsize=4096)
def _record_bytes(tokens: int, kind: str, heads: int, dim: int, dtype: str, w: Width,
                  code: str) -> int:
    from rkv.codec.pipeline import Pipeline

    if kind == "kv":
        shape = (2, tokens, heads, dim)
        pipe = Pipeline.parse(quant_spec(w), code)
        return pipe.for_block(shape, dtype).record_bytes(shape, dtype)
    nbytes = _data_bytes(tokens, kind, heads, dim, dtype, w)
    return Pipeline.parse("none", code).record_bytes_for(nbytes)


def block_widths(b: BlockInput, cfg: PlacementConfig) -> list[tuple[int, Width]]:
    """(index into ``cfg.widths``, width) of the widths ``b`` may take: split widths only
    for a block holding both K and V."""
    return [(i, w) for i, w in enumerate(cfg.widths) if b.kind == "kv" or w[0] == w[1]]


def build_template(b: BlockInput, tiers: Sequence[TierInput], models: Sequence[Any],
                   mkeys: Sequence[str], cfg: PlacementConfig,
                   cache: ReliabilityCache) -> Template:
    rows: list[tuple[int, int, int, int, int, float, float, float, float, int, int]] = []
    degraded: list[float] = []
    for ti, tier in enumerate(tiers):
        weight = float(cfg.capacity_cost.get(tier.name, 0.0)) / GIB
        for wi, w in block_widths(b, cfg):
            nbytes = data_bytes(b, w)
            for ci, code in enumerate(cfg.codes):
                judged = code
                if w[0] < 16 and by_value(code):
                    # Byte planes on a quantized block: its metadata strict, its codes
                    # tolerant; predicted with the block's own split (sizes bound in).
                    judged = quantized_code(b, w, code)
                    if not judged:
                        continue
                rec = record_bytes(b, w, code)
                p_due, p_sdc, p_deg = cache.outcomes(judged, nbytes, models[ti],
                                                     b.residency_hours, mkeys[ti])
                read = tier.latency_us + rec / (tier.read_gbps * 1e3)
                rows.append((ti, w[0], ci, rec, nbytes, p_due, p_sdc, read, weight * rec,
                             wi, w[1]))
                degraded.append(p_deg)
    if not rows:
        raise ConfigError(f"placement: no width and code can store {b.label} (codes laid "
                          f"out by value need 16 bits)")
    a = list(zip(*rows, strict=True))
    t = Template(
        tier=np.asarray(a[0], np.int64), bits=np.asarray(a[1], np.int64),
        code=np.asarray(a[2], np.int64), record_bytes=np.asarray(a[3], np.float64),
        data_bytes=np.asarray(a[4], np.int64), p_due=np.asarray(a[5], np.float64),
        p_sdc=np.asarray(a[6], np.float64), read_us=np.asarray(a[7], np.float64),
        cap_cost=np.asarray(a[8], np.float64),
        meets=(np.asarray(a[5]) <= cfg.max_p_due) & (np.asarray(a[6]) <= cfg.max_p_sdc),
        kept=np.ones(len(rows), bool), width=np.asarray(a[9], np.int64),
        vbits=np.asarray(a[10], np.int64),
    )
    assert t.width is not None
    # Dominance: within one tier and width, an option with no fewer bytes and no lower
    # P(DUE) than another is never better for any reuse or recompute cost.
    same = (t.tier[:, None] == t.tier[None, :]) & (t.width[:, None] == t.width[None, :])
    ok = t.meets[None, :] & t.meets[:, None]
    no_better = (t.record_bytes[None, :] <= t.record_bytes[:, None]) & \
        (t.p_due[None, :] <= t.p_due[:, None]) & (t.read_us[None, :] <= t.read_us[:, None])
    strictly = (t.record_bytes[None, :] < t.record_bytes[:, None]) | \
        (t.p_due[None, :] < t.p_due[:, None])
    idx = np.arange(len(rows))
    tie_first = (~strictly) & (idx[None, :] < idx[:, None])
    dominated = (same & ok & no_better & (strictly | tie_first)).any(axis=1)
    kept = t.meets & ~dominated
    deg = np.asarray(degraded, np.float64)
    return Template(t.tier, t.bits, t.code, t.record_bytes, t.data_bytes, t.p_due, t.p_sdc,
                    t.read_us, t.cap_cost, t.meets, kept, deg if deg.any() else None,
                    t.width, t.vbits)


@lru_cache(maxsize=256)
def by_value(code: str) -> bool:
    """True for codes laid out by value (byte planes): a quantized block gets them as
    quantized planes (:func:`quantized_code`)."""
    from rkv.codec.stages import codec_for

    c = codec_for(code)
    return c is not None and c.by_value


def quantized_code(b: BlockInput, bits: int | Width, code: str) -> str:
    """The spec of what a layout by value becomes on ``b`` quantized to ``bits``: quantized
    planes bound to the block's metadata and codes (``qplanes(...,head=,tail=)``), what
    ``predict`` must judge. Empty where the engine writes no such record: a ``k`` or ``v``
    half (a record holds both), or a chunk too short to quantize."""
    return _quantized_code(b.tokens, b.kind, b.kv_heads, b.head_dim, b.dtype, as_width(bits),
                           code)


@lru_cache(maxsize=4096)
def _quantized_code(tokens: int, kind: str, heads: int, dim: int, dtype: str, w: Width,
                    code: str) -> str:
    from rkv.codec.pipeline import Pipeline

    if kind != "kv":
        return ""
    shape = (2, tokens, heads, dim)
    pipe = Pipeline.parse(quant_spec(w), code).for_block(shape, dtype)
    return pipe.codec.spec if pipe.quant is not None and pipe.codec is not None else ""


@dataclass
class Table:
    """What a put's option table takes from the blocks' shapes, layers and kinds, the tiers
    (fault models, bandwidth, latency), the config and the profile: built once per put shape
    and reused (see :class:`rkv.placement.Planner`). Per block and column (the template
    options some block may take): read cost per expected read, P(DUE), capacity cost, whether
    offered, KL, record bytes and tier. Only reuse, the recompute cost (chunk position) and
    the tiers' free capacity change from put to put. ``start``: the multipliers of the last
    plan of this shape, where the next one's search begins, and ``hint`` its choice (a warm
    start)."""

    templates: tuple[Template, ...]
    cls: I64
    cols: I64
    tokens: I64
    read_us: F64
    p_due: F64
    cap_cost: F64
    kept: npt.NDArray[np.bool_]
    kl: F64
    nbytes: F64
    tier: I64
    start: F64 | None = None
    hint: I64 | None = None
    last: tuple[Any, Any, F64] | None = None     # the last put's (inputs, problem, recompute)
    checked: bool = False                        # a warm plan was checked against a cold one
    streamed: Any = None                         # the streamed search's per-table caches

    def cost(self, reuse: F64, recompute: F64) -> F64:
        """Expected cost of every (block, column); ``inf`` where not offered."""
        full = reuse[:, None] * self.read_us + self.p_due * recompute[:, None] + self.cap_cost
        return np.where(self.kept, full, np.inf)

    def held_cost(self, recompute: F64) -> F64:
        """Expected cost of every (block, column) without the read term (DUE recompute and
        capacity); ``inf`` where not offered."""
        return np.where(self.kept, self.p_due * recompute[:, None] + self.cap_cost, np.inf)

    def full_cost(self, reuse: F64, recompute: F64) -> F64:
        """Expected cost of every template option (limits and pruning ignored)."""
        def g(f: str) -> F64:
            return np.stack([getattr(t, f) for t in self.templates])[self.cls]
        return reuse[:, None] * g("read_us") + g("p_due") * recompute[:, None] + g("cap_cost")


def build_table(templates: Sequence[Template], cls: I64, kl_rows: F64, kl_idx: I64,
                tokens: I64, deg_kl: F64 | None = None, deg_kl_q: F64 | None = None
                ) -> Table:
    """The table of blocks whose template is ``templates[cls[i]]`` and whose KL per width
    (in the config's ``widths`` order, the templates' ``width``) is ``kl_rows[kl_idx[i]]``;
    vectorised gathers only. ``deg_kl``: what a degraded read of the block costs (per KL
    row; inf: unknown, so layouts that can degrade are not offered); ``deg_kl_q`` the same
    for a quantized block (quantized planes: values anywhere in their group's range; None:
    unknown)."""
    # Templates of one table have the same options (one tier set, one config), except
    # that blocks of kind "k"/"v" lack the split widths: pad those columns (never kept).
    n = max(len(t.tier) for t in templates)
    templates = [_padded(t, n) for t in templates]
    stack = {f: np.stack([getattr(t, f) for t in templates])
             for f in ("tier", "bits", "width", "record_bytes", "read_us", "cap_cost",
                       "p_due", "kept")}
    # Only the columns some block may take reach the solver (most options are pruned).
    cols = np.flatnonzero(stack["kept"].any(axis=0))
    sub = {f: v[:, cols][cls] for f, v in stack.items()}
    kl = np.take_along_axis(kl_rows[kl_idx], sub["width"], axis=1)
    kept = sub["kept"]
    if any(t.p_degraded is not None for t in templates):
        # A degraded read (a tolerant low byte plane failed) returns values within one unit
        # of their high byte: charged, in expectation, the block's KL at the fewest bits its
        # profile has; without a profile that cost is unknown and such layouts are dropped.
        deg = np.stack([np.zeros(len(t.tier)) if t.p_degraded is None else t.p_degraded
                        for t in templates])[:, cols][cls]
        # A degraded quantized read (quantized planes: the codes failed) leaves damaged
        # values anywhere in their group's range: its own, larger charge.
        unknown = np.full(len(kl_rows), np.inf)
        per = np.where(sub["bits"] < 16,
                       (unknown if deg_kl_q is None else deg_kl_q)[kl_idx][:, None],
                       (unknown if deg_kl is None else deg_kl)[kl_idx][:, None])
        with np.errstate(invalid="ignore"):
            extra = np.where(deg > 0, deg * per, 0.0)
        bad = ~np.isfinite(extra)
        kept = kept & ~bad
        kl = kl + np.where(bad, 0.0, extra)
    return Table(tuple(templates), cls, cols, tokens, sub["read_us"], sub["p_due"],
                 sub["cap_cost"], kept, kl, sub["record_bytes"], sub["tier"])


def _padded(t: Template, n: int) -> Template:
    """``t`` with its option arrays padded to ``n`` by options that are never offered."""
    k = n - len(t.tier)
    if k == 0:
        return t
    assert t.width is not None and t.vbits is not None

    def pad(a: Any, v: Any) -> Any:
        return np.concatenate([a, np.full(k, v, a.dtype)])

    return Template(pad(t.tier, 0), pad(t.bits, 16), pad(t.code, 0),
                    pad(t.record_bytes, np.inf), pad(t.data_bytes, 0), pad(t.p_due, 1.0),
                    pad(t.p_sdc, 1.0), pad(t.read_us, np.inf), pad(t.cap_cost, np.inf),
                    pad(t.meets, False), pad(t.kept, False),
                    None if t.p_degraded is None else pad(t.p_degraded, 0.0),
                    pad(t.width, 0), pad(t.vbits, 16))


def recompute_costs(chunk: I64, n_chunks: I64, tokens: I64, cfg: PlacementConfig) -> F64:
    """Per block (its ``chunk``, ``n_chunks`` or -1 for 1 + the last chunk of the put, and
    ``tokens``): the recompute cost of its chunk and every later chunk of the prefix (what a
    DUE there costs: the read stops at the first bad chunk). A chunk's tokens are the most of
    its blocks'; chunks the put does not hold count the most of any block's."""
    uc, inv = np.unique(chunk, return_inverse=True)
    tmax = np.zeros(len(uc), np.int64)
    np.maximum.at(tmax, inv, tokens)
    per_chunk = dict(zip(uc.tolist(), tmax.tolist(), strict=True))
    default_tokens = int(tmax.max())
    last = int(uc[-1])
    n = np.where(n_chunks < 0, last + 1, n_chunks)
    width = int(n.max()) + 1
    pairs, pinv = np.unique(chunk * width + n, return_inverse=True)
    vals = np.asarray([math.fsum(cfg.recompute_us(per_chunk.get(c, default_tokens))
                                 for c in range(a // width, a % width))
                       for a in pairs.tolist()])
    return vals[pinv.reshape(-1)]
