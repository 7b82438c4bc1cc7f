"""The performance suite: every engine and codec figure as a ratio to a baseline measured in
the same run, in one command.

    .venv/bin/python benchmarks/perf_suite.py [--repeat 5] [--quick] [--hf]

Runs ``bench_engine.py`` (put, get and get out= against raw LMDB; put_many against one put
at a time; the first layer of a layer stream against a full get) and ``bench_threads.py``
(one thread against the codec pool), each writing its JSON under benchmarks/results/, then
prints one markdown table of the ratios next to the targets of docs/performance.md. With
``--hf`` it also runs ``bench_hf_stream.py`` (time to first token, cold / warm / warm streamed on
SmolLM2-135M, 4-bit Q4_1 weights). Timings are never asserted; the machine is shared, so
each script records its load.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"


def run(script: str, *args: str) -> None:
    cmd = [sys.executable, str(HERE / script), *args]
    print("$", " ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, check=True)


def rows(engine: dict[str, Any], threads: dict[str, Any], hf: dict[str, Any] | None
         ) -> list[tuple[str, str, float, str]]:
    """(figure, baseline, ratio, target) for the table."""
    out: list[tuple[str, str, float, str]] = []
    for r in engine["engine"]:
        kib = r["block_bytes"] // 1024
        out += [(f"put, {kib} KiB blocks", "raw LMDB put, 2 MiB transactions",
                 r["put_ratio_sliced"], ">= 0.9"),
                (f"put, {kib} KiB blocks", "raw LMDB put, one transaction per sequence",
                 r["put_ratio"], ">= 0.9"),
                (f"verified get, {kib} KiB blocks", "raw LMDB read and copy",
                 r["get_ratio"], ">= 0.8"),
                (f"verified get out=, {kib} KiB blocks", "raw LMDB read into a buffer",
                 r["get_into_ratio"], ">= 0.8")]
    for r in engine["put_many"]:
        out.append((f"put_many, {r['seqs']} x {r['tokens']} tokens", "the same puts one at a "
                    "time", r["ratio"], ">= 1.5"))
        share = 100 * r["raw_share_of_put_many"]
        out.append((f"raw LMDB writes of those blocks, batched ({share:.0f} % of put_many's "
                    "time)", "a transaction per sequence", r["raw_ratio"], ""))
    s = engine["stream"]
    out.append((f"first layer of a {s['layers']}-layer {s['tokens']}-token stream",
                "a full get (time, lower is better)", s["first_layer_over_get"], "< 0.10"))
    for r in threads["rows"]:
        out.append((r["stage"], "one thread (speed-up)", r["speedup"],
                    ">= 1.7" if "encode" in r["stage"] or "get" in r["stage"] else ""))
    if hf is not None:
        out.append(("warm TTFT, streamed restore", "warm TTFT, full restore (time)",
                    hf["streamed_over_warm"], "< 1"))
        out.append(("warm TTFT", "cold TTFT (speed-up)", hf["speedup"], ">= 3"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="fewer repeats and a smaller prefix")
    ap.add_argument("--hf", action="store_true", help="also time to first token on SmolLM2")
    args = ap.parse_args()
    rep = "2" if args.quick else str(args.repeat)
    engine_json, threads_json = RESULTS / "engine.json", RESULTS / "threads.json"
    run("bench_engine.py", "--repeat", rep, "--json", str(engine_json))
    run("bench_threads.py", "--repeat", str(max(3, int(rep))), "--json", str(threads_json),
        *(["--mib", "16"] if args.quick else []))
    hf = None
    if args.hf:
        hf_json = RESULTS / "hf_stream.json"
        run("bench_hf_stream.py", "--repeat", str(max(2, int(rep) - 1)), "--prefix", "2048",
            "--suffix", "16", "--json", str(hf_json))
        hf = json.loads(hf_json.read_text())
    table = rows(json.loads(engine_json.read_text()), json.loads(threads_json.read_text()), hf)
    print("\n| figure | baseline (same run) | ratio | target |\n|---|---|---|---|")
    for fig, base, ratio, target in table:
        print(f"| {fig} | {base} | {ratio:.2f} | {target} |")


if __name__ == "__main__":
    main()
