"""The NVMe results across the documented ranges of the NAND wear exponent and clustering.

The wear exponent ``rber_pe_exp`` and the sector-clustering parameters ``cluster_p`` and
``cluster_bytes`` of ``nvme-tlc`` rest on little (docs/faultmodels/nvme.md, "Inputs that rest
on little"). For 192 KiB blocks (196,608 data bytes) under the tier's ``shardrs(k=16,m=2)``
and, for contrast, ``none`` (the record's checksum alone), this computes across those ranges:

* P(DUE) per block over 24 h: `predict(..., exact_counts=True)`, with its ``p_due_se`` (the
  standard error its sampled judgement of clustered classes leaves);
* the refresh age and scrub interval at a target of 1e-9 per block
  (`rkv.reliability.schedule.schedule`, ``rel_tol`` 1e-2 to save calls).

Two studies:

* **wear**: ``rber_pe_exp`` in {1.0, 1.25, 1.92, 2.6} at 3,000 and 10,000 P/E cycles, anchored
  two ways: ``fresh`` keeps the fresh point (``rber_fresh`` as in the preset; a lower exponent
  lowers RBER at every wear), ``rated`` keeps RBER at 3,000 P/E (``rber_fresh`` rescaled by
  ``31^(1.92 - alpha)``; the exponent then only changes how fast RBER grows past the rating,
  and the fresh RBER). At 3,000 P/E the ``rated`` rows are the preset by construction.
* **cluster**: ``cluster_p`` in {0, 0.25, 0.5, 0.75} x ``cluster_bytes`` in {1, 10, 100} MB at
  3,000 P/E. At 24 h the device ECC loses nothing at either wear (7e-20 per sector), so the
  24 h figures hold at 10,000 P/E too. The schedule is computed for ``none`` only (cheap);
  for ``shardrs`` the refresh age is the linear estimate ``24 h x 1e-9 / P(DUE, 24 h)``
  (every contributing class is Poisson episodes that lose a block on their own, so P(DUE)
  grows linearly with the age; checked at the worst corner by `predict` at 240 h), because
  a clustered ``predict`` takes up to minutes and a schedule needs 5-16 of them.

    .venv/bin/python benchmarks/bench_fm_ranges.py [--study wear|cluster] [--fresh]
                                                   [--workers N] [--table]

Writes benchmarks/results/fm_ranges.json after every point (a rerun skips points already
there unless ``--fresh``); ``--table`` prints the Markdown tables from it.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import faultmodels
from rkv.reliability.analytic import predict
from rkv.reliability.schedule import MAX_HOURS, schedule
from rkv.store.schedule_info import human_hours

PRESET = "nvme-tlc"
CODES = ("shardrs(k=16,m=2)", "none")
BLOCK_BYTES = 196608
TARGET = 1e-9
REL_TOL = 1e-2
ALPHA_DEFAULT = 1.92
ALPHAS = (1.0, 1.25, 1.92, 2.6)
PE = (3000, 10000)
CLUSTER_P = (0.25, 0.5, 0.75)
CLUSTER_BYTES = (1_000_000, 10_000_000, 100_000_000)
OUT = Path(__file__).parent / "results" / "fm_ranges.json"


def rated_fresh(alpha: float) -> float:
    """``rber_fresh`` that keeps RBER at 3,000 P/E (``(1 + 3000/100)^alpha``) as the preset's."""
    base = faultmodels.get_model(PRESET)
    assert isinstance(base, faultmodels.NandModel)
    wear = 1.0 + 3000.0 / base.rber_pe_scale
    return float(base.rber_fresh * wear ** (base.rber_pe_exp - alpha))


def points(study: str) -> list[dict[str, Any]]:
    """The grid: one dict per point (``id``, ``study``, ``params`` overriding the preset)."""
    out: list[dict[str, Any]] = []
    if study in ("wear", "all"):
        for pe in PE:
            for anchor in ("fresh", "rated"):
                for a in ALPHAS:
                    if anchor == "rated" and (a == ALPHA_DEFAULT or pe == 3000):
                        continue  # the same RBER as the fresh-anchored row / the preset
                    prm: dict[str, Any] = {"pe_cycles": pe, "rber_pe_exp": a}
                    if anchor == "rated":
                        prm["rber_fresh"] = rated_fresh(a)
                    out.append({"id": f"wear/{anchor}/a={a:g}/pe={pe}", "study": "wear",
                                "anchor": anchor, "params": prm})
    if study in ("cluster", "all"):
        grid = [(0.0, 10_000_000)] + [(q, b) for q in CLUSTER_P for b in CLUSTER_BYTES]
        for q, b in grid:
            out.append({"id": f"cluster/q={q:g}/b={b}", "study": "cluster",
                        "params": {"pe_cycles": 3000, "cluster_p": q, "cluster_bytes": b}})
    return out


def run_point(pt: dict[str, Any]) -> dict[str, Any]:
    """Everything the tables need for one point."""
    t0 = time.perf_counter()
    spec = {"preset": PRESET, **pt["params"]}
    model = faultmodels.get_model(spec)
    assert isinstance(model, faultmodels.NandModel)
    res: dict[str, Any] = dict(pt)
    res["rber_1d"] = model.rber(24.0)
    fresh = faultmodels.get_model({**spec, "pe_cycles": 0})
    assert isinstance(fresh, faultmodels.NandModel)
    res["rber_1d_fresh"] = fresh.rber(24.0)
    res["p_sector_24h"] = model.p_sector_fail(24.0)
    res["p_due_24h"] = {}
    res["schedule"] = {}
    for code in CODES:
        t1 = time.perf_counter()
        pr = predict(code, BLOCK_BYTES, model, 24.0, exact_counts=True)
        res["p_due_24h"][code] = pr.p_due
        res.setdefault("p_due_24h_se", {})[code] = pr.p_due_se   # its sampled judgements
        res.setdefault("seconds_24h", {})[code] = round(time.perf_counter() - t1, 1)
    codes = CODES if pt["study"] == "wear" else ("none",)
    for code in codes:
        t1 = time.perf_counter()
        s = schedule(model, code, BLOCK_BYTES, TARGET, rel_tol=REL_TOL, name=pt["id"])
        res["schedule"][code] = s.to_dict() | {"seconds": round(time.perf_counter() - t1, 1)}
    if pt["study"] == "cluster":
        p24 = res["p_due_24h"][CODES[0]]
        res["refresh_linear_hours"] = 24.0 * TARGET / p24 if p24 > 0 else math.inf
        if pt["params"]["cluster_p"] == max(CLUSTER_P) and pt["params"][
                "cluster_bytes"] == min(CLUSTER_BYTES):
            pr = predict(CODES[0], BLOCK_BYTES, model, 240.0, exact_counts=True)
            res["p_due_240h"], res["p_due_240h_se"] = pr.p_due, pr.p_due_se
    res["seconds"] = round(time.perf_counter() - t0, 1)
    return res


# -- output --------------------------------------------------------------------------------


def git_state() -> dict[str, Any]:
    def git(*a: str) -> str:
        return subprocess.run(["git", *a], capture_output=True, text=True,
                              check=False).stdout.strip()

    dirty = [ln[3:] for ln in git("status", "--porcelain").splitlines()
             if ln[3:].startswith(("rkv/", "faultmodels/"))]
    return {"commit": git("rev-parse", "HEAD"), "dirty": dirty}


def load() -> dict[str, Any]:
    if OUT.exists():
        got: dict[str, Any] = json.loads(OUT.read_text(encoding="utf-8"))
        return got
    return {"points": {}}


def save(data: dict[str, Any]) -> None:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    tmp = OUT.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(OUT)


def age(h: float | None) -> str:
    """Hours as a short age (:func:`rkv.store.schedule_info.human_hours`); never is the
    schedule's 100-year horizon."""
    return "never (100 y)" if h is None or math.isinf(h) else human_hours(h)


def _refresh(r: dict[str, Any], code: str) -> float | None:
    s = r["schedule"].get(code)
    return None if s is None else s["refresh_hours"]


def tables(data: dict[str, Any]) -> str:
    """The Markdown tables of docs/faultmodels/nvme.md from the results."""
    pts = data["points"]
    sh, no = CODES
    lines = ["| anchor | `rber_pe_exp` | RBER, 1 day: fresh / 3,000 / 10,000 P/E | "
             "3,000 P/E: P(DUE) 24 h | refresh age at 1e-9 | 10,000 P/E: P(DUE) 24 h | "
             "refresh age at 1e-9 |", "|---|---:|---|---:|---:|---:|---:|"]
    for anchor in ("fresh", "rated"):
        for a in ALPHAS:
            if anchor == "rated" and a == ALPHA_DEFAULT:
                continue  # the preset's row
            # rated rows keep RBER at 3,000 P/E: their 3,000 P/E results are the preset's
            r3 = pts.get(f"wear/{anchor}/a={a:g}/pe=3000") or pts.get(
                f"wear/fresh/a={ALPHA_DEFAULT:g}/pe=3000")
            r10 = pts.get(f"wear/{anchor}/a={a:g}/pe=10000")
            if r10 is None or r3 is None:
                continue
            label = f"{a:g}" + (" (preset)" if a == ALPHA_DEFAULT else "")
            lines.append(
                f"| {anchor} | {label} | {r10['rber_1d_fresh']:.2g} / {r3['rber_1d']:.2g} / "
                f"{r10['rber_1d']:.2g} | {r3['p_due_24h'][sh]:.2g} | "
                f"{age(_refresh(r3, sh))} | {r10['p_due_24h'][sh]:.2g} | "
                f"{age(_refresh(r10, sh))} |")
    nones: dict[str, list[str]] = {}
    for r in pts.values():
        if r["study"] == "wear":
            got = f"{r['p_due_24h'][no]:.3g} (refresh age {age(_refresh(r, no))})"
            nones.setdefault(got, []).append(r["id"])
    lines += ["", "(`none` over the wear rows: P(DUE) 24 h "
              + "; ".join(f"{k} in {len(v)} of them" for k, v in sorted(nones.items()))
              + ".)", ""]
    lines += ["| `cluster_p` | `cluster_bytes` | `shardrs`: P(DUE) 24 h | refresh age "
              "(linear) | `none`: P(DUE) 24 h | refresh age (schedule) |",
              "|---:|---:|---:|---:|---:|---:|"]
    for r in sorted((r for r in pts.values() if r["study"] == "cluster"),
                    key=lambda r: (r["params"]["cluster_p"], r["params"]["cluster_bytes"])):
        q, b = r["params"]["cluster_p"], r["params"]["cluster_bytes"]
        bl = "-" if q == 0 else f"{b / 1e6:g} MB"
        pre = " (preset)" if (q, b) == (0.5, 10_000_000) else ""
        se = r.get("p_due_24h_se", {}).get(sh)
        sd = "" if se is None else f" ± {se:.1g}"
        lin = r["refresh_linear_hours"]
        lin_s = f"never ({age(lin)})" if lin > MAX_HOURS else age(lin)
        lines.append(f"| {q:g}{pre} | {bl} | {r['p_due_24h'][sh]:.2g}{sd} | "
                     f"{lin_s} | {r['p_due_24h'][no]:.3g} | "
                     f"{age(_refresh(r, no))} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--study", choices=("wear", "cluster", "all"), default="all")
    ap.add_argument("--fresh", action="store_true", help="recompute points already saved")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--table", action="store_true", help="print the tables and stop")
    args = ap.parse_args()
    data = load()
    if args.table:
        print(tables(data))
        return
    todo = [p for p in points(args.study) if args.fresh or p["id"] not in data["points"]]
    data.update({"preset": PRESET, "codes": list(CODES), "data_bytes": BLOCK_BYTES,
                 "target": TARGET, "rel_tol": REL_TOL, "git": git_state()})
    t0 = time.perf_counter()
    print(f"{len(todo)} points, {args.workers} worker(s)", flush=True)
    with ProcessPoolExecutor(max(1, args.workers)) as pool:
        futs = {pool.submit(run_point, p): p["id"] for p in todo}
        for fut in as_completed(futs):
            r = fut.result()
            r["date"] = time.strftime("%Y-%m-%d")
            r["commit"] = data["git"]["commit"]
            data["points"][r["id"]] = r
            save(data)
            print(f"{r['id']}: P24 {r['p_due_24h']} refresh "
                  f"{ {c: age(s['refresh_hours']) for c, s in r['schedule'].items()} } "
                  f"({r['seconds']:.0f} s)", flush=True)
    data["seconds_last_run"] = round(time.perf_counter() - t0, 1)
    save(data)
    print(tables(data))


if __name__ == "__main__":
    main()
