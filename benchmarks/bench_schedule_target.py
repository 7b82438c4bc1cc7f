"""The scrub schedule's refresh age checked at a production target (1e-9), without `predict`.

For worn NVMe (``nvme-tlc`` at 10,000 P/E cycles, 30 C), the tier's ``shardrs(k=16,m=2)`` and
192 KiB blocks, the schedule's refresh age ``R`` says P(DUE) of a block read ``R`` hours after
its write is at most 1e-9 and above it just after. This checks that claim by two estimates
that go through the real engine (records written, faults injected at the tier boundary, read
back through ``Engine.get``) and never call `predict`'s fatality judgement:

1. **Stratified by the count of lost sectors** (the exact route). Near ``R`` almost all of
   P(DUE) is the device ECC's lost sectors (the binomial ``bch codeword failure`` class:
   each of the record's ``n_s`` sectors lost independently with ``p_sec(h)``, at uniform
   distinct positions), so ``P_bch(h) = sum_k Binom(n_s, k, p_sec(h)) f_k`` with ``f_k`` the
   fraction of records the engine loses given exactly ``k`` lost sectors. ``f_k`` does not
   depend on the age: it is measured once, by *every* one-, two- and three-sector pattern
   (exact; 27,720 reads for three) and by random draws for ``k >= 4`` (which add about
   0.2 % near ``R``); the count law is exact. The other classes (latent sector errors and
   silent runs) come from `predict`: its full P(DUE) minus that of the same model with them
   switched off; they are 0.3 % of 1e-9 at ``R``. (Decoder miscorrection, 1e-59 of the
   failing codewords, is left out.)
2. **An importance-sampled campaign** (`run_campaign` with a count tilt that puts about three
   lost sectors in each tilted record), and for comparison ``tilt = "auto"``.

    .venv/bin/python benchmarks/bench_schedule_target.py [--quick] [--refresh-hours H]
                                                         [--sample3 N] [--post]

Writes benchmarks/results/schedule_target.json (``--quick``: a smoke run, written nowhere;
``--post``: recompute what follows from the saved measurements). Also derived: the age at
which the engine-judged P(DUE) reaches 1e-9, to compare with the schedule's ``R``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import faultmodels
from faultmodels import ErrorPattern
from rkv.eval.faults.campaign import CampaignConfig, run_campaign, wilson
from rkv.eval.faults.harness import Harness
from rkv.format.dtypes import numpy_dtype
from rkv.format.keys import as_token_array, block_key, chunk_keys
from rkv.reliability.schedule import p_due, refresh_age

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_fm_ranges import git_state  # the same provenance record as that benchmark

MODEL: dict[str, Any] = {"preset": "nvme-tlc", "pe_cycles": 10000}
CODE = "shardrs(k=16,m=2)"
BLOCK_BYTES = 196608
TARGET = 1e-9
#: Only the device ECC's classes: the same model with field sector errors and silent runs off.
BCH_ONLY: dict[str, Any] = {**MODEL, "lse_rate": 0.0, "silent_rate": 0.0}
#: Ages checked, as multiples of the refresh age.
AGES = (0.5, 1.0, 1.1, 1.25, 2.0)
OUT = Path(__file__).parent / "results" / "schedule_target.json"


def nand() -> faultmodels.NandModel:
    """The checked model."""
    model = faultmodels.get_model(MODEL)
    assert isinstance(model, faultmodels.NandModel)
    return model


# -- 1. stratified by the number of lost sectors ---------------------------------------------


class _Blocks:
    """One-block records in a real engine: put, inject a pattern, read back, classify."""

    def __init__(self, seed: int) -> None:
        self.cfg = CampaignConfig(fault_model=MODEL, protection=CODE, hours=1.0)
        self.root = Path(tempfile.mkdtemp(prefix="rkv-schedtarget-"))
        self.h = Harness(self.root, self.cfg.tier_config(), chunk_tokens=self.cfg.chunk_tokens)
        self.spec = self.cfg.model_spec()
        self.rng = np.random.default_rng(seed)
        self.h.rng = np.random.default_rng(seed + 1)

    def close(self) -> None:
        self.h.close()
        shutil.rmtree(self.root, ignore_errors=True)

    def _put(self) -> tuple[Any, np.ndarray, bytes]:
        cfg = self.cfg
        tokens = self.rng.integers(0, 1 << 31, cfg.chunk_tokens)
        shape = (1, 2, cfg.chunk_tokens, cfg.kv_heads, cfg.head_dim)
        kv = self.rng.standard_normal(shape, dtype=np.float32).astype(numpy_dtype(cfg.dtype))
        key = block_key(chunk_keys(as_token_array(tokens), self.spec.fingerprint(),
                                   cfg.chunk_tokens)[0], 0)
        self.h.put(tokens, kv, self.spec)
        return tokens, self.h.reference(kv[0])[None], key

    def record_bytes(self) -> int:
        _, _, key = self._put()
        n = self.h.record_bytes(key)
        self.h.clear()
        return n

    def outcome(self, sectors: tuple[int, ...], sector_bytes: int) -> str:
        """The engine's outcome for a fresh record with exactly ``sectors`` lost."""
        tokens, ref, key = self._put()
        n = self.h.record_bytes(key)
        er = tuple((s * sector_bytes, min(sector_bytes, n - s * sector_bytes), "sector")
                   for s in sorted(sectors))
        inj = self.h.inject(key, ErrorPattern(n, erasures=er))
        out, _ = self.h.classify(tokens, self.spec, ref, inj)
        self.h.clear()
        return out


def fatal_fractions(draws: dict[int, int], seed: int) -> dict[str, Any]:
    """``f_k`` per ``k``: every pattern for the ``k`` with ``draws[k] == 0`` (enumerated),
    else that many uniform random ``k``-subsets of the record's sectors."""
    sb = nand().sector_bytes
    b = _Blocks(seed)
    try:
        record = b.record_bytes()
        n_s = -(-record // sb)
        out: dict[str, Any] = {"record_bytes": record, "sectors": n_s, "k": {}}
        for k, n in sorted(draws.items()):
            t0 = time.perf_counter()
            if n == 0:
                subsets: Any = itertools.combinations(range(n_s), k)
                how = "all"
            else:
                subsets = (tuple(b.rng.choice(n_s, size=k, replace=False).tolist())
                           for _ in range(n))
                how = "random"
            counts: dict[str, int] = {}
            for sel in subsets:
                o = b.outcome(sel, sb)
                counts[o] = counts.get(o, 0) + 1
            total = sum(counts.values())
            due = counts.get("due", 0)
            lo, hi = (due / total, due / total) if how == "all" else wilson(due, total)
            out["k"][str(k)] = {"patterns": how, "n": total, "due": due, "f": due / total,
                                "lo": lo, "hi": hi, "outcomes": counts,
                                "seconds": round(time.perf_counter() - t0, 1)}
            print(f"  k={k}: {due}/{total} lost ({how}), {time.perf_counter() - t0:.0f} s",
                  flush=True)
        return out
    finally:
        b.close()


def binom_pmf(n: int, k: int, p: float) -> float:
    if p <= 0.0:
        return 1.0 if k == 0 else 0.0
    if p >= 1.0:
        return 1.0 if k == n else 0.0
    return math.exp(math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
                    + k * math.log(p) + (n - k) * math.log1p(-p))


def stratified_p(fk: dict[str, Any], p_sec: float) -> dict[str, float]:
    """``sum_k Binom(n_s, k, p_sec) f_k`` with its bounds (per-``k`` Wilson bounds summed;
    the counts beyond the largest measured ``k`` go into the upper bound as fatal)."""
    n_s = int(fk["sectors"])
    est = lo = hi = 0.0
    kmax = max(int(k) for k in fk["k"])
    for k_s, row in fk["k"].items():
        w = binom_pmf(n_s, int(k_s), p_sec)
        est += w * row["f"]
        lo += w * row["lo"]
        hi += w * row["hi"]
    tail = sum(binom_pmf(n_s, k, p_sec) for k in range(kmax + 1, n_s + 1))
    return {"estimate": est, "lo": lo, "hi": hi + tail, "tail_beyond_kmax": tail}


# -- 2. importance-sampled campaigns ------------------------------------------------------------


def campaign(hours: float, tilt: float | str, trials: int, blocks: int, seed: int,
             workers: int) -> dict[str, Any]:
    cfg = CampaignConfig(fault_model=MODEL, protection=CODE, hours=hours, trials=trials,
                         blocks=blocks, tilt=tilt, seed=seed, workers=workers)
    t0 = time.perf_counter()
    s = run_campaign(cfg)
    assert s.importance is not None
    due = s.importance["due"]
    est, se = float(due["estimate"]), float(due["stderr"])
    row = {"hours": hours, "tilt": tilt, "blocks": s.blocks, "estimate": est, "stderr": se,
           "lo": max(0.0, est - 1.96 * se), "hi": est + 1.96 * se,
           "rel_err": due["rel_err"], "hits": due["hits"], "ess": due["ess"],
           "weight_ess": s.importance["weight_ess"],
           "plan_note": s.importance["plan"].get("note", ""),
           "seconds": round(time.perf_counter() - t0, 1)}
    print(f"  campaign {hours:.0f} h tilt {tilt}: {est:.3g} +- {se:.2g} "
          f"({due['hits']} hits, ess {due['ess']:.1f}, {s.blocks} blocks, "
          f"{row['seconds']:.0f} s)", flush=True)
    return row


def sector_tilt(hours: float, record: int, mean: float = 3.0) -> float:
    """The count tilt that gives the device-ECC class ``mean`` lost sectors per record."""
    model = faultmodels.get_model(MODEL)
    cls = next(c for c in model.event_classes(record, hours) if "codeword failure"
               in c.rate.label)
    return max(1.0, mean / (cls.units * cls.p))


def _boundary(fk: dict[str, Any], key: str, other: float, r: float) -> float:
    """The age in [r / 2, 2 r] at which the stratified P(DUE) (its ``key``: estimate, lo or
    hi) plus ``other`` reaches `TARGET` (bisection in log age; P grows with the age there,
    while the counts beyond the largest measured one are negligible)."""
    model = nand()
    lo, hi = 0.5 * r, 2.0 * r
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        p = stratified_p(fk, float(model.p_sector_fail(mid)))[key] + other
        lo, hi = (mid, hi) if p <= TARGET else (lo, mid)
        if hi / lo < 1.0 + 1e-9:
            break
    return lo


def derive(out: dict[str, Any]) -> None:
    """What follows from the measurements: the stratified P(DUE) at each age, and the age at
    which the engine-judged P(DUE) reaches the target (the independent refresh age)."""
    fk = out["fatal_fractions"]
    for row in out["ages"]:
        row["mean_lost_sectors"] = row["p_sector"] * fk["sectors"]
        st = stratified_p(fk, row["p_sector"])
        row["stratified_bch"] = st
        row["stratified_total"] = st["estimate"] + row["predict_other_classes"]
        row["stratified_over_predict"] = (row["stratified_total"] / row["predict_p_due"]
                                          if row["predict_p_due"] > 0 else None)
    at_r = next(a for a in out["ages"] if a["multiple"] == 1.0)
    other = at_r["predict_other_classes"]   # near R: 0.3 % of the target
    r = out["refresh_hours"]
    b = {k: _boundary(fk, k, other, r) for k in ("estimate", "lo", "hi")}
    out["engine_refresh_hours"] = {"estimate": b["estimate"], "lo": b["hi"], "hi": b["lo"],
                                   "schedule_over_engine": r / b["estimate"],
                                   "other_classes_at_R": other}


def report(out: dict[str, Any]) -> None:
    r = out["refresh_hours"]
    for row in out["ages"]:
        st = row["stratified_bch"]
        print(f"  {row['multiple']:g} R = {row['hours']:.0f} h: predict "
              f"{row['predict_p_due']:.3g} (bch {row['predict_p_due_bch_only']:.3g}); "
              f"stratified bch {st['estimate']:.3g} [{st['lo']:.3g}, {st['hi']:.3g}] "
              f"+ other {row['predict_other_classes']:.2g}")
    e = out["engine_refresh_hours"]
    print(f"refresh age: schedule {r:.1f} h, engine-judged {e['estimate']:.1f} h "
          f"[{e['lo']:.1f}, {e['hi']:.1f}]")
    for c in out.get("campaigns", []):
        print(f"  campaign {c['multiple']:g} R tilt {c['tilt']}: {c['estimate']:.3g} "
              f"[{c['lo']:.3g}, {c['hi']:.3g}] ({c['hits']} hits, ess {c['ess']:.1f}, "
              f"{c['blocks']} blocks, {c['seconds']:.0f} s)")


# -- the run ----------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a smoke run (small counts)")
    ap.add_argument("--refresh-hours", type=float, default=None,
                    help="skip the schedule search and use this refresh age")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sample3", type=int, default=0,
                    help="draw this many random three-sector patterns instead of all")
    ap.add_argument("--post", action="store_true",
                    help="recompute only what follows from the saved measurements")
    args = ap.parse_args()
    if args.post:
        saved: dict[str, Any] = json.loads(OUT.read_text(encoding="utf-8"))
        derive(saved)
        report(saved)
        OUT.write_text(json.dumps(saved, indent=1) + "\n", encoding="utf-8")
        return
    q = args.quick
    t_all = time.perf_counter()
    out: dict[str, Any] = {"model": MODEL, "code": CODE, "data_bytes": BLOCK_BYTES,
                           "target": TARGET, "date": time.strftime("%Y-%m-%d"),
                           "git": git_state()}

    t0 = time.perf_counter()
    if args.refresh_hours is None:
        r = refresh_age(MODEL, CODE, BLOCK_BYTES, TARGET)
        out["refresh_source"] = "rkv.reliability.schedule.refresh_age (rel_tol 1e-3)"
    else:
        r = float(args.refresh_hours)
        out["refresh_source"] = "--refresh-hours"
    out["refresh_hours"] = r
    out["refresh_seconds"] = round(time.perf_counter() - t0, 1)
    print(f"refresh age R = {r:.1f} h ({r / 24:.2f} d), {out['refresh_seconds']:.0f} s",
          flush=True)

    print("engine outcomes given exactly k lost sectors:", flush=True)
    # 0 = every pattern (k = 3: C(56, 3) = 27,720 reads, most of the run); k >= 4 matter
    # little near R (k = 4 adds about 0.2 % there, 7 % at 2 R), so they are sampled.
    draws = ({1: 0, 2: 30, 3: 60, 4: 20, 5: 10} if q else
             {1: 0, 2: 0, 3: args.sample3, 4: 2000, 5: 500, 6: 200, 7: 100, 8: 100})
    fk = fatal_fractions(draws, args.seed)
    out["fatal_fractions"] = fk

    model = nand()
    ages = []
    for m in AGES:
        h = m * r
        t0 = time.perf_counter()
        full = p_due(MODEL, CODE, BLOCK_BYTES, h)
        bch = p_due(BCH_ONLY, CODE, BLOCK_BYTES, h)
        ages.append({"multiple": m, "hours": h, "p_sector": float(model.p_sector_fail(h)),
                     "predict_p_due": full, "predict_p_due_bch_only": bch,
                     "predict_other_classes": max(full - bch, 0.0),
                     "predict_seconds": round(time.perf_counter() - t0, 1)})
    out["ages"] = ages

    print("importance-sampled campaigns:", flush=True)
    record = int(fk["record_bytes"])
    runs = []
    # (multiple of R, trials, blocks per trial, tilt): None = the count tilt of sector_tilt
    plan: list[tuple[float, int, int, str | None]] = (
        [(1.0, 2, 10, None), (1.0, 2, 10, "auto")] if q else
        [(1.0, 60, 200, None), (1.1, 20, 200, None), (2.0, 10, 200, None),
         (1.0, 20, 200, "auto")])
    for m, trials, blocks, tilt in plan:
        h = m * r
        runs.append(campaign(h, tilt or sector_tilt(h, record), trials, blocks, args.seed,
                             args.workers) | {"multiple": m})
    out["campaigns"] = runs
    out["seconds"] = round(time.perf_counter() - t_all, 1)
    derive(out)
    report(out)
    print(f"total {out['seconds']:.0f} s")
    if not q:
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
