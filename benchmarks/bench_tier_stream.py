"""Tier in the plan: a streamed restore from a planned mixed-tier store against all-DRAM.

SmolLM2-135M-Instruct (**weights 4-bit Q4_1**, fp32 compute, 2 CPU threads) restores a
2048-token prefix (8 chunks of 256 tokens, 240 records of 192 KiB) from rkv layer by layer
(``HFPrefixCache.prefill(stream=True)``: ``Engine.get_layers`` into the model's forward over
the suffix), three stores in the same run:

* **all-DRAM**: one tier, ``dram`` (the baseline);
* **planned**: ``dram`` and ``nvme`` with ``[placement] place_tiers = true`` and
  ``layer_compute_us`` measured here (the model's per-layer time of this very forward), so
  the planner puts blocks in NVMe where the layers before them hide the read;
* **all-NVMe**: one tier, ``nvme``.

This machine has no separate devices (every tier is an LMDB file in the page cache), so each
tier's reads are **emulated**: a wrapper sleeps its tier's latency plus bytes over bandwidth
per record (DRAM 20 GB/s and 0.1 us, NVMe 6.5 GB/s and 80 us: the engine's default tier
figures), and the slept time is measured and reported. Same reliability targets everywhere
(``max_p_due`` per block over 24 h with the shipped fault models). Reported: medians of the
warm streamed prefill (restore + forward), the ratio to all-DRAM, the DRAM bytes the planned
store holds, the model's predicted stall, and P(DUE) per block-day of each placement.

    .venv/bin/python benchmarks/bench_tier_stream.py --json benchmarks/results/tier_stream.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rkv import Engine, EngineConfig, TierConfig  # noqa: E402
from rkv.tiers.base import Tier, TierReader  # noqa: E402
from rkv.tiers.wrapper import TierWrapper  # noqa: E402

SPEEDS = {"dram": (20.0, 0.1), "nvme": (6.5, 80.0)}      # GB/s, us
PRESETS = {"dram": "dram-ddr5", "nvme": "nvme-tlc"}
CODES = ["none", "rs(255,239)", "shardrs(k=16,m=2)"]


#: Sleeps shorter than this overshoot by about their own length on a loaded machine, so
#: time owed is slept once it adds up to this (the total stays right; a read waits for at
#: most this much longer or shorter than its own due).
OWED_S = 1e-3


class Emulated(TierWrapper):
    """A tier whose reads take its device's time: latency + bytes / bandwidth, slept."""

    def __init__(self, inner: Tier, gbps: float, latency_us: float) -> None:
        super().__init__(inner)
        self.gbps, self.latency_us = gbps, latency_us
        self.reads = 0
        self.asked_s = self.slept_s = self.owed_s = 0.0

    @contextmanager
    def _reader(self) -> Iterator[TierReader]:
        with self.inner.reader() as r:
            yield _Reader(r, self)

    def reader(self) -> Any:
        return self._reader()


class _Reader:
    def __init__(self, inner: TierReader, tier: Emulated) -> None:
        self.inner, self.tier = inner, tier

    def get(self, key: bytes) -> memoryview | None:
        t0 = time.perf_counter()
        got = self.inner.get(key)
        if got is not None:
            t = self.tier
            want = (t.latency_us + len(got) / (t.gbps * 1e3)) * 1e-6
            t.owed_s += want - (time.perf_counter() - t0)
            if t.owed_s >= OWED_S:
                s0 = time.perf_counter()
                time.sleep(t.owed_s)
                t.owed_s -= time.perf_counter() - s0
            t.reads += 1
            t.asked_s += want
            t.slept_s += time.perf_counter() - t0
        return got


def config(tiers: list[str], root: Path, placement: dict[str, Any]) -> EngineConfig:
    tcs = tuple(TierConfig(n, medium="memory" if n == "dram" else "disk",
                           path=str(root / n), capacity_bytes=8 << 30,
                           read_gbps=SPEEDS[n][0], latency_us=SPEEDS[n][1],
                           fault_model=PRESETS[n], ecc="none") for n in tiers)
    return EngineConfig(chunk_tokens=256, tiers=tcs, placement=placement, promote="never")


def emulate(e: Engine) -> dict[str, Emulated]:
    out = {}
    for name in list(e.core.tiers):
        out[name] = e.core.tiers[name] = Emulated(e.core.tiers[name], *SPEEDS[name])
    return out


def layer_us(model: Any, pc: Any, ids: list[int], prefix: int, repeat: int) -> float:
    """Median per-layer time of the suffix forward over a restored prefix (the compute that
    streaming overlaps)."""
    import torch

    times = []
    for _ in range(repeat):
        restored, cache, _ = pc.restore(ids)
        assert restored == prefix, restored
        t0 = time.perf_counter()
        with torch.no_grad():
            model(torch.tensor([ids[prefix:]]), cache=cache, use_cache=True)
        times.append(time.perf_counter() - t0)
    return 1e6 * statistics.median(times) / model.config.num_hidden_layers


def mean_p_due(e: Engine, pc: Any, tokens: list[int]) -> float:
    """Mean predicted P(DUE) per block over the planner's residency (24 h) of the put of
    ``tokens``, as the store's placement plans it (its tiers, its targets)."""
    ep = e.core.placement
    assert ep is not None
    n = e.config.chunk_tokens
    chunks = [min(n, len(tokens) - s) for s in range(0, len(tokens), n)]
    names = list(e.core.tiers) if ep.cfg.place_tiers else [next(iter(e.core.tiers))]
    plan = ep.planner(pc.spec).plan(ep.blocks(pc.spec, chunks, len(chunks), None),
                                    [ep.tier_input(t) for t in names])
    return float(statistics.fmean(b.p_due for b in plan.blocks))


def modeled(args: argparse.Namespace, root: Path, measured_us: float) -> list[dict[str, Any]]:
    """The planner alone over a range of per-layer compute times (a GPU computes a layer in
    tens of microseconds, this CPU in milliseconds): the planned store's DRAM share and its
    modeled stall against all-DRAM's, for the same put."""
    from rkv.format.model import ModelSpec
    from rkv.store.plans import EnginePlacement

    spec = ModelSpec("HuggingFaceTB/SmolLM2-135M", n_layers=30, n_kv_heads=3, head_dim=64,
                     dtype="float16")
    chunks = [256] * (args.prefix // 256)
    rows = []
    for lus, par in ((x, p) for x in (10.0, 30.0, 100.0, 300.0, 1000.0, measured_us)
                     for p in (False, True)):
        pl = {"max_p_due": args.max_p_due, "bits": [16], "codes": CODES,
              "capacity_cost": {"dram": 4000.0, "nvme": 30.0}, "layer_compute_us": lus,
              "place_tiers": True, "parallel_reads": par}
        ep = EnginePlacement.for_engine(config(["dram", "nvme"], root / "m", pl))
        assert ep is not None
        blocks = ep.blocks(spec, chunks, len(chunks), None)
        both = ep.planner(spec).plan(blocks, [ep.tier_input("dram"), ep.tier_input("nvme")])
        dram = ep.planner(spec).plan(blocks, [ep.tier_input("dram")])
        total = sum(both.tier_bytes.values())
        rows.append({"layer_compute_us": lus, "parallel_reads": par,
                     "dram_fraction": both.tier_bytes["dram"] / total,
                     "stall_us": both.extra["stall_us"],
                     "all_dram_stall_us": dram.extra["stall_us"],
                     "restore_us": 30 * lus + both.extra["stall_us"],
                     "all_dram_restore_us": 30 * lus + dram.extra["stall_us"]})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prefix", type=int, default=2048)
    ap.add_argument("--suffix", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=9, help="timed restores per store")
    ap.add_argument("--max-p-due", type=float, default=1e-5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    from rkv.adapters.hf import HFPrefixCache
    from rkv.eval.quality import load_smollm2, text_windows

    model, tok = load_smollm2(threads=args.threads)
    ids = text_windows(tok, 1, args.prefix + 2 * args.suffix, sources="docs")[0]
    first = ids[:args.prefix + args.suffix]
    second = ids[:args.prefix] + ids[-args.suffix:]
    base = {"max_p_due": args.max_p_due, "bits": [16], "codes": CODES,
            "capacity_cost": {"dram": 4000.0, "nvme": 30.0}}
    out: dict[str, Any] = {"model": "SmolLM2-135M-Instruct", "weights": "Q4_1 (4-bit)",
                           "command": "benchmarks/bench_tier_stream.py "
                           + " ".join(sys.argv[1:]), "prefix": args.prefix,
                           "suffix": args.suffix, "speeds": SPEEDS,
                           "load": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="rkv-ts-") as tmp:
        root = Path(tmp)
        with Engine.open(root / "probe", config(["dram"], root / "probe", base)) as e:
            pc = HFPrefixCache(e, model, model_id="SmolLM2-135M-Instruct-Q4_1")
            pc.prefill(first)
            lus = layer_us(model, pc, second, args.prefix, 5)
        out["layer_compute_us"] = lus
        print(f"layer compute {lus:.0f} us", file=sys.stderr)
        stores = {"all-dram": (["dram"], base),
                  "planned": (["dram", "nvme"], {**base, "place_tiers": True,
                                                "layer_compute_us": lus}),
                  "all-nvme": (["nvme"], base)}
        engines = {n: Engine.open(root / n, config(t, root / n, p))
                   for n, (t, p) in stores.items()}
        res: dict[str, Any] = {}
        try:
            caches = {}
            for name, e in engines.items():
                pc = HFPrefixCache(e, model, model_id="SmolLM2-135M-Instruct-Q4_1")
                pc.prefill(first)                  # stores the prefix's KV
                pc.store = False
                caches[name] = (pc, emulate(e))
                st = e.stats()
                res[name] = {"p_due_per_block_day": mean_p_due(e, pc, first),
                             "tier_bytes": {t: st["tiers"][t]["bytes"] for t in st["tiers"]},
                             "tier_blocks": {t: st["tiers"][t]["blocks"]
                                             for t in st["tiers"]},
                             "planned_stall_us": e.core.placement.timing.get("last_stall_us")
                             if e.core.placement is not None else None,
                             "seconds": []}
            # Stores interleaved, so load changes hit all of them alike.
            for _ in range(args.repeat):
                for name, (pc, _) in caches.items():
                    r = pc.prefill(second, stream=True)
                    assert r.restored_tokens == args.prefix, name
                    res[name]["seconds"].append(r.seconds)
            for name, (_, em) in caches.items():
                res[name]["emulated"] = {t: {"reads": x.reads, "asked_s": x.asked_s,
                                             "slept_s": x.slept_s} for t, x in em.items()}
        finally:
            for e in engines.values():
                e.close()
    for r in res.values():
        r["median_s"] = statistics.median(r["seconds"])
        total = sum(r["tier_bytes"].values())
        r["dram_fraction"] = r["tier_bytes"].get("dram", 0) / total
        r["ratio_to_all_dram"] = r["median_s"] / statistics.median(res["all-dram"]["seconds"])
    out["stores"] = res
    out["load_after"] = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="rkv-tsm-") as tmp:
        out["modeled"] = modeled(args, Path(tmp), out["layer_compute_us"])
    print(json.dumps(out["modeled"], indent=1), file=sys.stderr)
    print(json.dumps({n: {k: r[k] for k in ("median_s", "ratio_to_all_dram", "dram_fraction",
                                             "tier_blocks", "planned_stall_us")}
                      for n, r in res.items()}, indent=1), file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
