"""Reading a sweep's results file (JSONL, one row per cell) and pooling the seeds of a setting.

The file is user input that a killed sweep may have left half-written, so every row is checked
field by field before anything uses it: a malformed row is an :class:`ResultsError` naming its
line, except a torn *last* line (an interrupted append), which is skipped with a
:class:`TornLineWarning`. Rows that differ only in ``config.seed`` are one *setting*; its
statistics are pooled here so that reports and Pareto sets compare settings, not seeds.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from rkv.eval.faults.campaign import wilson
from rkv.eval.stats import t_quantile
from rkv.eval.sweep.results import ResultsError, ResultsFile

_KEY = re.compile(r"[0-9a-f]{16}")
OUTCOMES = ("clean", "masked", "corrected", "degraded", "due", "sdc")


class TornLineWarning(UserWarning):
    """The results file ends in a partial row (an interrupted append); it was skipped."""


# -- validation -----------------------------------------------------------------------------------
def _num(v: Any, where: str, *, lo: float | None = None, null: bool = False) -> float | None:
    if v is None and null:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ValueError(f"{where}: expected a number, got {type(v).__name__}")
    x = float(v)
    if not math.isfinite(x):
        raise ValueError(f"{where}: {v!r} is not finite")
    if lo is not None and x < lo:
        raise ValueError(f"{where}: {v!r} is below {lo:g}")
    return x


def _int(v: Any, where: str, lo: int = 0) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{where}: expected an integer, got {type(v).__name__}")
    if v < lo:
        raise ValueError(f"{where}: {v} is below {lo}")
    return v


def _str(v: Any, where: str, limit: int = 200) -> str:
    if not isinstance(v, str) or not v or len(v) > limit or not v.isprintable():
        raise ValueError(f"{where}: expected a printable string of 1..{limit} characters")
    return v


def _dict(v: Any, where: str) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise ValueError(f"{where}: expected an object, got {type(v).__name__}")
    return v


def _interval(v: Any, where: str) -> None:
    d = _dict(v, where)
    lo, mean, hi = (_num(d.get(k), f"{where}.{k}", null=True) for k in ("lo", "mean", "hi"))
    if lo is not None and hi is not None and lo > hi + 1e-12 * max(1.0, abs(hi)):
        raise ValueError(f"{where}: lo {lo!r} > hi {hi!r}")
    del mean


def _check_config(c: dict[str, Any]) -> None:
    _str(c.get("tier"), "config.tier", 64)
    planned = c.get("placement") is not None        # then bits and code may be null
    if (c.get("bits") is not None or not planned) and _int(c.get("bits"), "config.bits", 1) > 64:
        raise ValueError(f"config.bits: {c['bits']} is above 64")
    if c.get("code") is not None or not planned:
        _str(c.get("code"), "config.code")
    _int(c.get("seed"), "config.seed", -(1 << 63))
    if c.get("preset") is not None:
        _str(c["preset"], "config.preset", 64)
    for k in ("ber_multiplier", "hours"):
        _num(c.get(k), f"config.{k}", lo=0.0, null=True)
    for k in ("params", "layout"):
        if c.get(k) is not None:
            _dict(c[k], f"config.{k}")
    if c.get("metrics") is not None and not (
            isinstance(c["metrics"], list) and all(isinstance(m, str) for m in c["metrics"])):
        raise ValueError("config.metrics: expected a list of strings")


def _check_reliability(r: dict[str, Any]) -> None:
    _int(r.get("blocks"), "reliability.blocks")
    _int(r.get("trials"), "reliability.trials")
    rates = _dict(r.get("rates"), "reliability.rates")
    for o in ("due", "sdc"):
        if o not in rates:
            raise ValueError(f"reliability.rates: no {o!r}")
    for o, v in rates.items():
        if o not in OUTCOMES:
            raise ValueError(f"reliability.rates: unknown outcome {o[:40]!r}")
        w = f"reliability.rates.{o}"
        d = _dict(v, w)
        _int(d.get("n"), f"{w}.n")
        lo, rate, hi = (_num(d.get(k), f"{w}.{k}", lo=0.0) for k in ("lo", "rate", "hi"))
        assert lo is not None and rate is not None and hi is not None
        if not lo <= hi * (1 + 1e-9) + 1e-300:
            raise ValueError(f"{w}: lo {lo!r} > hi {hi!r}")
    a = r.get("analytic")
    if a is not None:
        a = _dict(a, "reliability.analytic")
        for k in ("p_due", "p_sdc"):
            _num(a.get(k), f"reliability.analytic.{k}", lo=0.0, null=True)


def _check_quality(q: dict[str, Any]) -> None:
    _int(q.get("windows"), "quality.windows", 1)
    for k in ("ppl", "kl", "top1"):
        _interval(q.get(k), f"quality.{k}")
    if q.get("delta_ppl") is not None:
        _interval(q["delta_ppl"], "quality.delta_ppl")
    _num(q.get("ppl_ref"), "quality.ppl_ref", null=True)
    _num(q.get("ber_multiplier"), "quality.ber_multiplier", lo=0.0, null=True)
    for k in ("due_blocks", "recomputed_tokens", "faulted_windows", "recomputed_windows",
              "corrected_windows", "degraded_blocks"):
        _int(q.get(k, 0), f"quality.{k}")
    if q.get("wrong_kv_windows") is not None:
        _int(q["wrong_kv_windows"], "quality.wrong_kv_windows")
    if q.get("broken") is not None:
        b = _dict(q["broken"], "quality.broken")
        if _int(b.get("n"), "quality.broken.n") > _int(b.get("total"), "quality.broken.total"):
            raise ValueError("quality.broken: more broken windows than windows")


def _check_cost(c: dict[str, Any]) -> None:
    for k in ("bytes_per_token", "raw_bytes_per_token"):
        _num(c.get(k), f"cost.{k}", lo=0.0)
    for k in ("put_gbps", "get_gbps"):          # null where nothing is stored (raw)
        _num(c.get(k), f"cost.{k}", lo=0.0, null=True)
    _num(c.get("overhead"), "cost.overhead")


def check_row(row: Any) -> dict[str, Any]:
    """``row`` if it has the sweep's result schema, else ``ValueError`` naming the field."""
    d = _dict(row, "row")
    if not isinstance(d.get("key"), str) or not _KEY.fullmatch(d["key"]):
        raise ValueError("key: expected 16 lowercase hex digits")
    _str(d.get("sweep"), "sweep")
    _check_config(_dict(d.get("config"), "config"))
    if d.get("version") is not None:
        _str(d["version"], "version")
    for k, v in _dict(d.get("timings", {}), "timings").items():
        _num(v, f"timings.{str(k)[:40]}", lo=0.0)
    for name, check in (("reliability", _check_reliability), ("quality", _check_quality),
                        ("cost", _check_cost)):
        if d.get(name) is not None:
            check(_dict(d[name], name))
    return d


def load_rows(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a results file (read by :class:`rkv.eval.sweep.results.ResultsFile`, the one
    reader), each checked field by field (:class:`ResultsError` naming the line otherwise). A
    torn last line is skipped with a :class:`TornLineWarning`; a key seen twice keeps its last
    row (a warning says so when the two rows disagree)."""
    p = Path(path)
    if not p.exists():          # ResultsFile reads a missing file as empty (a new sweep)
        raise ResultsError(f"no results file {p}")
    try:
        rf = ResultsFile(p, repair=False)
    except IsADirectoryError as exc:
        raise ResultsError(f"{p} is a directory, not a results file") from exc
    except OSError as exc:
        raise ResultsError(f"cannot read results file {p}: {exc.strerror or exc}") from exc
    if rf.torn_line is not None:
        warnings.warn(f"{p}:{rf.torn_line}: skipped a torn last line (an interrupted append)",
                      TornLineWarning, stacklevel=2)
    for line in rf.conflicts:
        warnings.warn(f"{p}:{line}: a key appears twice with different results; the later "
                      "row is used", UserWarning, stacklevel=2)
    out = []
    for key, row in rf.rows.items():
        try:
            out.append(check_row(row))
        except (ValueError, RecursionError) as exc:
            raise ResultsError(f"{p}:{rf.lines[key]}: bad row: {_short(exc)}") from exc
    return out


def _short(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200] or type(exc).__name__


def _strip(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k not in ("timings", "version")}


# -- settings: rows that differ only in their seed -----------------------------------------------
@dataclass(frozen=True)
class Interval:
    """A mean with its 95 % CI; ``mean`` is ``inf`` when the cells could not compute it."""

    mean: float
    lo: float
    hi: float


@dataclass(frozen=True)
class Rate:
    """A per-block outcome rate pooled over seeds: ``n`` of ``total`` blocks observed."""

    n: int
    total: int
    rate: float
    lo: float
    hi: float
    pooled: bool            # True: Wilson on the pooled counts; False: averaged per-seed bounds

    def bound(self, which: str) -> float:
        return self.hi if which == "hi" else self.rate


@dataclass(frozen=True)
class Windows:
    """What the quality windows of a setting met, summed over its seeds: windows whose
    stored blocks met a fault, whose read was corrected, that were recomputed after a DUE,
    whose KV came back wrong (``None``: lossy cells, where that is not measured), and whose
    scores were not finite (``broken``, with its 95 % Wilson interval)."""

    total: int
    faulted: int
    corrected: int
    recomputed: int
    wrong_kv: int | None
    broken: Rate
    degraded_blocks: int


@dataclass(frozen=True)
class Setting:
    """One point of the grid: the pooled results of its seeds. ``tier`` is the panel it is
    reported in: its tier, or ``tier/preset`` when the preset is not the tier's default."""

    tier: str
    config: dict[str, Any]          # the rows' config without "seed"
    key: str                        # 12 hex digits of the setting's canonical config
    seeds: tuple[int, ...]
    rows: int
    sdc: Rate | None
    due: Rate | None
    p_sdc: float | None             # analytic (the first seed's: it does not depend on seeds)
    p_due: float | None
    kl: Interval | None
    ppl: Interval | None
    top1: Interval | None
    ppl_ref: float | None
    delta_ppl: Interval | None      # paired perplexity change (rows that report it)
    windows: int
    recomputed_tokens: int
    overhead: float | None
    bytes_per_token: float | None
    raw_bytes_per_token: float | None
    put_gbps: float | None
    get_gbps: float | None
    degraded: Rate | None = None
    quality_windows: Windows | None = None
    quality_multiplier: float | None = None       # the quality windows' fault multiplier

    @property
    def raw(self) -> bool:
        """Raw storage: the bare values, nothing verified."""
        return self.config.get("code") == "raw"

    @property
    def broken_windows(self) -> int:
        return self.quality_windows.broken.n if self.quality_windows else 0

    @property
    def bits(self) -> int | None:
        """Bits per KV value; ``None`` when a placement plan chooses them per block."""
        b = self.config.get("bits")
        return None if b is None else int(b)

    @property
    def code(self) -> str:
        """The code spec, ``raw`` for bare storage, ``planned`` when placement chooses."""
        c = self.config.get("code")
        return "planned" if c is None else str(c)


def canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _pool_rate(parts: Sequence[Mapping[str, Any]]) -> Rate:
    """Pool one outcome over seeds. A campaign's rate is ``s * n/N`` with Wilson bounds times
    ``s`` (``s`` = P(any fault) under conditional sampling, else 1); when every seed fits that
    with one ``s``, the pooled counts get a Wilson interval (narrower with more seeds).
    Otherwise (importance sampling) the seeds' rates and bounds are averaged, weighted by N."""
    ns = [int(p["n"]) for p in parts]
    totals = [int(p["N"]) for p in parts]
    n, total = sum(ns), sum(totals)
    scales = []
    for p, k, m in zip(parts, ns, totals, strict=True):
        whi = wilson(k, m)[1] if m else 0.0
        scales.append(float(p["hi"]) / whi if whi > 0 else math.nan)
    s = scales[0]
    fits = total > 0 and math.isfinite(s) and all(
        math.isclose(x, s, rel_tol=1e-6, abs_tol=1e-300) for x in scales) and all(
        math.isclose(float(p["rate"]), s * k / m if m else 0.0, rel_tol=1e-6, abs_tol=1e-300)
        for p, k, m in zip(parts, ns, totals, strict=True))
    if fits:
        lo, hi = wilson(n, total)
        return Rate(n, total, s * n / total, s * lo, s * hi, True)
    w = [max(m, 1) for m in totals]
    avg = [sum(float(p[k]) * x for p, x in zip(parts, w, strict=True)) / sum(w)
           for k in ("rate", "lo", "hi")]
    return Rate(n, total, avg[0], avg[1], avg[2], False)


#: The ratio of the seeds' variance to one seed's beyond which they are taken to differ
#: by more than their fault draws (chi-squared with 1 degree of freedom, 99 % point).
_SEED_EFFECT = 6.63


def pool_interval(parts: Sequence[tuple[Mapping[str, Any], int]]) -> Interval:
    """Pool the seeds' means (each with its 95 % t interval over ``windows`` text windows).

    The model of what varies between seeds: the seeds score the *same* text windows and
    differ only in their fault draws, so window ``j`` of seed ``i`` scores
    ``x_ij = w_j + e_ij``, with ``w_j`` the window's own value (shared) and ``e_ij`` what the
    seed's faults did to it (independent between seeds and windows). The pooled mean (the
    window-weighted mean of the seeds' means) has variance ``var(w)/n + var(e)/(n k)`` for
    ``k`` seeds of ``n`` windows. Each seed's half-width measures ``(var(w) + var(e)) / n``
    (averaged over seeds: more seeds add no windows), and the unweighted sample variance of
    the seeds' means measures ``var(e) / n`` (the seeds are exchangeable; their window counts
    only weight the mean), so the pooled variance is the first minus ``(k - 1) / k`` times the
    second (at least the first over ``k``), with Student's t on the windows' degrees of
    freedom. A seed-level effect (one seed shifting every window alike) is outside this
    model: where the seeds' spread is too wide for it, Student's t on the seeds' means
    (``k - 1`` degrees of freedom) is used if wider. Coverage on simulated seeds:
    tests/test_interval_coverage.py (docs/sweeps.md)."""
    if any(d.get("mean") is None for d, _ in parts):
        return Interval(math.inf, math.inf, math.inf)
    vals: list[tuple[float, float, float, int]] = []
    for d, w in parts:
        m = float(d["mean"])
        lo, hi = d.get("lo"), d.get("hi")
        vals.append((m, m if lo is None else float(lo), m if hi is None else float(hi), w))
    wsum = sum(w for *_, w in vals)
    mean = sum(m * w for m, _, _, w in vals) / wsum
    below = sum((m - lo) * w for m, lo, _, w in vals) / wsum
    above = sum((hi - m) * w for m, _, hi, w in vals) / wsum
    k = len(vals)
    if k < 2:
        return Interval(mean, mean - below, mean + above)
    df_w = max(min(w for *_, w in vals) - 1, 1)
    t_w = t_quantile(0.975, df_w)
    between = _stdev([m for m, *_ in vals]) ** 2
    if not math.isfinite(between):
        return Interval(math.inf, math.inf, math.inf)
    ends = []
    for half in (below, above):
        var = (half / t_w) ** 2           # one seed's (var(w) + var(e)) / n
        half = t_w * math.sqrt(max(var - (k - 1) / k * between, var / k))
        # Seeds that disagree far beyond what their windows allow (the variance ratio past
        # chi2(1)'s 99 % point, 6.63, the loosest for any k) show a seed-level effect.
        if between > _SEED_EFFECT * var:
            half = max(half, t_quantile(0.975, k - 1) * math.sqrt(between / k))
        ends.append(half)
    return Interval(mean, mean - ends[0], mean + ends[1])


def _stdev(xs: Sequence[float]) -> float:
    mu = sum(xs) / len(xs)
    return math.sqrt(sum((x - mu) ** 2 for x in xs) / (len(xs) - 1))


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def settings(rows: Sequence[Mapping[str, Any]]) -> list[Setting]:
    """Group checked rows by setting (config without seed) and pool each group's seeds; in the
    order of first appearance."""
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for r in rows:
        cfg = {k: v for k, v in r["config"].items() if k != "seed"}
        groups.setdefault((panel(cfg), canonical(cfg)), []).append(r)
    return [_setting(tier, text, grp) for (tier, text), grp in groups.items()]


def panel(config: Mapping[str, Any]) -> str:
    """The name a setting is reported under: its tier, or ``tier/preset`` when its fault
    preset is not the tier's default one (so that, e.g., dram with dram-ddr5 and dram with
    raw-ber are compared separately)."""
    tier, preset = str(config["tier"]), config.get("preset")
    if preset is None or preset == _default_presets().get(tier, preset):
        return tier
    return f"{tier}/{preset}"


@cache
def _default_presets() -> dict[str, str]:
    from rkv.store.config import default_tiers

    return {t.name: str(t.fault_model) for t in default_tiers()}


def _windows(qual: Sequence[Mapping[str, Any]]) -> Windows | None:
    """The window counts of the rows that report them (None if none does)."""
    have = [x for x in qual if x.get("broken") is not None]
    if not have:
        return None
    total = sum(int(x["broken"]["total"]) for x in have)
    n = sum(int(x["broken"]["n"]) for x in have)
    lo, hi = wilson(n, total)
    rate = n / total if total else 0.0
    wrong = [x.get("wrong_kv_windows") for x in have]
    return Windows(total, sum(int(x.get("faulted_windows", 0)) for x in have),
                   sum(int(x.get("corrected_windows", 0)) for x in have),
                   sum(int(x.get("recomputed_windows", 0)) for x in have),
                   None if any(w is None for w in wrong) else sum(int(w or 0) for w in wrong),
                   Rate(n, total, rate, min(lo, rate), max(hi, rate), True),
                   sum(int(x.get("degraded_blocks", 0)) for x in have))


def _setting(tier: str, text: str, grp: Sequence[Mapping[str, Any]]) -> Setting:
    rel = [r["reliability"] for r in grp if r.get("reliability") is not None]
    qual = [r["quality"] for r in grp if r.get("quality") is not None]
    cost = [r["cost"] for r in grp if r.get("cost") is not None]
    rates: dict[str, Rate | None] = {"sdc": None, "due": None, "degraded": None}
    for o in rates:
        parts = []
        for r in rel:
            if o not in r["rates"]:
                continue
            n_all = sum(int(v["n"]) for v in r["rates"].values())
            total = n_all or int(r["blocks"]) * max(int(r["trials"]), 1)
            parts.append({**r["rates"][o], "N": total})
        rates[o] = _pool_rate(parts) if parts else None
    analytic = (rel[0].get("analytic") or {}) if rel else {}
    q: dict[str, Interval | None] = {"kl": None, "ppl": None, "top1": None}
    for k in q:
        if qual:
            q[k] = pool_interval([(x[k], int(x["windows"])) for x in qual])
    kl = q["kl"]
    if kl is not None and kl.lo < 0:        # a t interval cut at KL >= 0 keeps its coverage
        q["kl"] = Interval(kl.mean, 0.0, kl.hi)
    c = {k: _mean([float(x[k]) for x in cost if x.get(k) is not None]) for k in
         ("overhead", "bytes_per_token", "raw_bytes_per_token", "put_gbps", "get_gbps")}
    refs = [float(x["ppl_ref"]) for x in qual if x.get("ppl_ref") is not None]
    deltas = [(x["delta_ppl"], int(x["windows"])) for x in qual if x.get("delta_ppl")]
    delta = pool_interval(deltas) if deltas and len(deltas) == len(qual) else None
    return Setting(
        tier=tier, config=json.loads(text),
        key=hashlib.sha256(text.encode()).hexdigest()[:12],
        seeds=tuple(sorted({int(r["config"]["seed"]) for r in grp})), rows=len(grp),
        sdc=rates["sdc"], due=rates["due"],
        p_sdc=analytic.get("p_sdc"), p_due=analytic.get("p_due"),
        kl=q["kl"], ppl=q["ppl"], top1=q["top1"], ppl_ref=_mean(refs), delta_ppl=delta,
        windows=sum(int(x["windows"]) for x in qual),
        recomputed_tokens=sum(int(x.get("recomputed_tokens", 0)) for x in qual),
        overhead=c["overhead"], bytes_per_token=c["bytes_per_token"],
        raw_bytes_per_token=c["raw_bytes_per_token"], put_gbps=c["put_gbps"],
        get_gbps=c["get_gbps"], degraded=rates["degraded"], quality_windows=_windows(qual),
        quality_multiplier=(float(qual[0]["ber_multiplier"])
                            if qual and qual[0].get("ber_multiplier") is not None else None))
