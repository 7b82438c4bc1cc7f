"""vLLM's waiting queue announced to rkv (``announce_queue``): does a queued request still
find its prefix after the requests ahead of it have saved theirs into a full store?

Run in .venv-vllm (scripts/setup-vllm.sh) through scripts/vllm-env.sh::

    bash scripts/vllm-env.sh .venv-vllm/bin/python benchmarks/bench_vllm_queue.py \\
        --json benchmarks/results/vllm_queue.json

Three vLLM instances in one run (``scripts/vllm_job.py``; SmolLM2-135M, 4-bit Q4_1 weights
dequantized to fp32, greedy, vLLM's prefix caching off, ``max_num_seqs`` 2 so that requests
queue): no connector (the tokens every arm must give), then rkv with ``announce_queue`` off
and on, each on a fresh store of one memory tier that holds ``--capacity`` chunks. Phase
``store``: ``--returning`` documents are computed and stored. Phase ``mixed``: ``--new``
other documents, then the returning ones again, submitted at once; the new ones run first
and save their chunks into the full store while the returning ones wait. Without the
announcement LRU evicts the waiting requests' prefixes to make room; with it they are held
until vLLM schedules them. Reported per arm: prompt tokens the returning requests loaded
from rkv, saves that found no room, and the phase's wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

# Run as a script, this file's folder is on sys.path: the vLLM benchmark's job runner.
from bench_vllm import ROOT, run_job

#: Bytes of one stored chunk of SmolLM2-135M (30 layers x 256 tokens x K+V x 3 heads x 64 x
#: fp32 = 11.8 MB) plus headroom for record headers.
CHUNK_BYTES = 30 * (256 * 2 * 3 * 64 * 4 + 4096)


def documents(n: int, tokens: int) -> list[list[int]]:
    """``n`` distinct prompts of ``tokens`` tokens from rkv's docs (different offsets)."""
    from transformers import AutoTokenizer

    from rkv.adapters.vllm_model import smollm2_hf_dir

    tok = AutoTokenizer.from_pretrained(str(smollm2_hf_dir()))
    text = "\n\n".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))
    ids = tok(text)["input_ids"]
    if len(ids) < n * tokens:
        raise SystemExit(f"the docs give {len(ids)} tokens, {n * tokens} needed")
    return [ids[i * tokens:(i + 1) * tokens] for i in range(n)]


def store(capacity_chunks: float) -> dict[str, Any]:
    from rkv import EngineConfig, TierConfig

    t = TierConfig("dram", medium="memory", path="t/dram", policy="lru",
                   capacity_bytes=int(capacity_chunks * CHUNK_BYTES))
    return EngineConfig(chunk_tokens=256, tiers=(t,)).to_dict()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--returning", type=int, default=4, help="documents that come back")
    ap.add_argument("--new", type=int, default=4, help="documents ahead of them")
    ap.add_argument("--tokens", type=int, default=600, help="tokens per document")
    ap.add_argument("--capacity", type=float, default=10.5, help="store size in chunks")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="rkv-bench-queue-"))
    docs = documents(args.returning + args.new, args.tokens)
    back, new = docs[:args.returning], docs[args.returning:]
    mt = args.max_tokens
    phases = [{"name": "store", "prompts": back, "max_tokens": mt},
              {"name": "mixed", "prompts": new + back, "max_tokens": mt}]
    llm = {"max_num_seqs": 2}
    out: dict[str, Any] = {
        "returning": args.returning, "new": args.new, "tokens": args.tokens,
        "capacity_chunks": args.capacity, "load_before": os.getloadavg(),
        "cpus": os.cpu_count(), "weights": "SmolLM2-135M-Instruct, 4-bit Q4_1 dequantized "
        "to fp32", "arms": {}}
    base = run_job(tmp, "recompute", {"llm": llm, "connector": None, "phases": phases})
    want = {p["name"]: p["tokens"] for p in base["phases"]}
    for announce in (False, True):
        name = f"announce-{'on' if announce else 'off'}"
        extra = {"store": str(tmp / f"{name}-store"), "stats_file": str(tmp / f"{name}.stats"),
                 "config": store(args.capacity), "announce_queue": announce}
        res = run_job(tmp, name, {"llm": llm, "phases": phases, "connector": {
            "name": "RkvConnector", "extra": extra}})
        ph = {p["name"]: p for p in res["phases"]}
        before, after = ph["store"]["stats"], ph["mixed"]["stats"]
        sched = res["scheduler_stats"]
        arm = {
            "same_tokens": all(ph[n]["tokens"] == want[n] for n in want),
            "loaded_tokens_mixed": after.get("load_tokens", 0) - before.get("load_tokens", 0),
            "loadable_tokens": args.returning * (args.tokens // 256) * 256,
            "saves_failed_mixed": after.get("saves_failed", 0) - before.get("saves_failed", 0),
            "mixed_s": ph["mixed"]["seconds"][0],
            "queue_announced": after.get("queue_announced", 0),
            "queue_released": after.get("queue_released", 0),
            "hit_tokens_scheduler": sched.get("hit_tokens", 0),
        }
        out["arms"][name] = arm
        print(name, json.dumps(arm), flush=True)
    out["recompute_mixed_s"] = next(p for p in base["phases"] if p["name"] == "mixed")[
        "seconds"][0]
    out["load_after"] = os.getloadavg()
    print(json.dumps(out, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
