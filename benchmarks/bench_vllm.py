"""rkv as vLLM's KV connector on this CPU: time to first token, decode throughput, a second
instance, and faults against vLLM's ExampleConnector (results in docs/vllm.md).

Run in .venv-vllm (scripts/setup-vllm.sh) through scripts/vllm-env.sh::

    bash scripts/vllm-env.sh .venv-vllm/bin/python benchmarks/bench_vllm.py --repeat 3 \\
        --json benchmarks/results/vllm.json

Every arm is one vLLM instance (``scripts/vllm_job.py``, its own processes), SmolLM2-135M
(4-bit Q4_1 weights dequantized to fp32), greedy, vLLM's prefix caching off (so every
repeat of a warm arm loads from its connector). The prompt is a document of ``--doc``
tokens (rkv's docs) plus a question; TTFT is the time of a request for one token.

- ``recompute``: no connector (the baseline, in the same run);
- ``rkv-dram`` / ``rkv-nvme``: the document stored first, then the follow-up (document +
  question) loads it, verified, from a memory tier (no ECC, checksums) or a disk tier
  (shardrs ECC);
- ``example``: vLLM's ExampleConnector (safetensors files, no checksum), the same prompt
  twice (it matches whole prompts only), and ``rkv-same`` the same for rkv;
- ``decode``: tokens/s of ``--decode`` greedy tokens with rkv storing each new chunk,
  against no connector;
- ``second``: instance 2 (its own store, a Redis tier shared with instance 1) answers the
  follow-up on the document instance 1 stored;
- ``--faults BER,...``: the same raw bit-error rate applied to rkv's reads (through
  ``FaultyTier``) and to the ExampleConnector's files: do the tokens stay those of a clean
  run?
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def run_job(tmp: Path, name: str, job: dict[str, Any]) -> dict[str, Any]:
    job = {**job, "out": str(tmp / f"{name}.json")}
    (tmp / f"{name}.job.json").write_text(json.dumps(job))
    with (tmp / f"{name}.log").open("w") as log:
        rc = subprocess.run([sys.executable, str(ROOT / "scripts" / "vllm_job.py"),
                             str(tmp / f"{name}.job.json")], stdout=log,
                            stderr=subprocess.STDOUT, cwd=ROOT, check=False).returncode
    if rc:
        tail = (tmp / f"{name}.log").read_text()[-20000:]
        raise RuntimeError(f"{name} failed ({rc}):\n{tail}")
    return dict(json.loads((tmp / f"{name}.json").read_text()))


def store_config(tier: str, ecc: str | None = None) -> dict[str, Any]:
    from rkv import EngineConfig, TierConfig

    medium = "disk" if tier == "nvme" else "memory"
    kw: dict[str, Any] = {"ecc": ecc} if ecc else {}
    if tier == "nvme" and not ecc:
        kw["ecc"] = "shardrs(k=16,m=2)"
    t = TierConfig(tier, medium=medium, path=f"t/{tier}", capacity_bytes=4 << 30, **kw)
    return EngineConfig(chunk_tokens=256, tiers=(t,)).to_dict()


def rkv(tmp: Path, name: str, config: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {"name": "RkvConnector", "extra": {"store": str(tmp / f"{name}-store"),
                                              "stats_file": str(tmp / f"{name}.stats"),
                                              "config": config, **more}}


def example(tmp: Path, name: str) -> dict[str, Any]:
    d = tmp / f"{name}-files"
    d.mkdir(exist_ok=True)
    return {"name": "ExampleConnector", "extra": {"shared_storage_path": str(d)}}


def prompts(doc: int) -> tuple[list[int], list[int]]:
    from transformers import AutoTokenizer

    from rkv.adapters.vllm_model import smollm2_hf_dir

    tok = AutoTokenizer.from_pretrained(str(smollm2_hf_dir()))
    text = "\n\n".join((ROOT / "docs" / n).read_text() for n in ("engine.md", "format.md",
                                                                 "remote.md"))
    d = tok(text)["input_ids"][:doc]
    q = tok("\n\nQuestion: in one sentence, what happens when a stored block fails "
            "verification?\nAnswer:")["input_ids"]
    return d, d + q


def med(xs: list[float]) -> float:
    return float(statistics.median(xs))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--doc", type=int, default=3500, help="document tokens")
    ap.add_argument("--decode", type=int, default=384, help="tokens for decode throughput")
    ap.add_argument("--faults", default="", help="raw bit-error rates, comma-separated")
    ap.add_argument("--skip", default="", help="arms to skip, comma-separated")
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    tmp = Path(tempfile.mkdtemp(prefix="rkv-bench-vllm-"))
    doc, follow = prompts(args.doc)
    r = args.repeat
    one = {"max_tokens": 1, "repeat": r}
    out: dict[str, Any] = {"doc_tokens": len(doc), "prompt_tokens": len(follow), "repeat": r,
                           "load_before": os.getloadavg(), "cpus": os.cpu_count(),
                           "weights": "SmolLM2-135M-Instruct, 4-bit Q4_1 dequantized to fp32",
                           "arms": {}}
    arms = out["arms"]
    short = follow[:640]

    def note(name: str, res: dict[str, Any], **extra: Any) -> None:
        arms[name] = {**extra, "startup_s": res["startup_s"]}
        print(name, json.dumps(arms[name]), flush=True)

    res = run_job(tmp, "recompute", {"connector": None, "phases": [
        {"name": "ttft", "prompts": [follow], **one},
        {"name": "ttft-short", "prompts": [short], **one},
        {"name": "decode", "prompts": [short], "max_tokens": args.decode, "repeat": r}]})
    ph = {p["name"]: p for p in res["phases"]}
    base_tokens = ph["ttft"]["tokens"]
    t1 = med(ph["ttft-short"]["seconds"])
    note("recompute", res, ttft_s=med(ph["ttft"]["seconds"]), ttft_all=ph["ttft"]["seconds"],
         decode_tok_s=(args.decode - 1) / (med(ph["decode"]["seconds"]) - t1))
    for tier in ("dram", "nvme"):
        name = f"rkv-{tier}"
        if name in skip:
            continue
        res = run_job(tmp, name, {"connector": rkv(tmp, name, store_config(tier)), "phases": [
            {"name": "store", "prompts": [doc], "max_tokens": 1},
            {"name": "follow", "prompts": [follow], **one},
            {"name": "same", "prompts": [follow], **one},
            {"name": "ttft-short", "prompts": [short], "max_tokens": 1, "repeat": 1},
            {"name": "decode", "prompts": [short], "max_tokens": args.decode, "repeat": r}]})
        ph = {p["name"]: p for p in res["phases"]}
        st = ph["decode"]["stats"]
        note(name, res, ttft_s=med(ph["follow"]["seconds"]),
             ttft_all=ph["follow"]["seconds"], same_ttft_s=med(ph["same"]["seconds"]),
             loaded_tokens_per_request=ph["follow"]["stats"]["load_tokens"] // r,
             tokens_equal=ph["follow"]["tokens"] == base_tokens == ph["same"]["tokens"],
             decode_tok_s=(args.decode - 1) / (med(ph["decode"]["seconds"])
                                               - med(ph["ttft-short"]["seconds"])),
             decode_saves=st.get("saves_done", 0), save_s=st.get("save_s", 0.0),
             load_s=st.get("load_s", 0.0), failed_blocks=st.get("failed_blocks", 0))
    if "example" not in skip:
        res = run_job(tmp, "example", {"connector": example(tmp, "example"), "phases": [
            {"name": "store", "prompts": [follow], "max_tokens": 1},
            {"name": "same", "prompts": [follow], **one}]})
        ph = {p["name"]: p for p in res["phases"]}
        note("example", res, same_ttft_s=med(ph["same"]["seconds"]),
             ttft_all=ph["same"]["seconds"], tokens_equal=ph["same"]["tokens"] == base_tokens)
    if "offloading" not in skip:
        try:
            res = run_job(tmp, "offloading", {"connector": {
                "name": "OffloadingConnector", "extra": {"cpu_bytes_to_use": 1 << 30}},
                "phases": [{"name": "store", "prompts": [doc], "max_tokens": 1},
                           {"name": "follow", "prompts": [follow], **one}]})
            ph = {p["name"]: p for p in res["phases"]}
            note("offloading", res, ttft_s=med(ph["follow"]["seconds"]))
        except RuntimeError as exc:
            lines = str(exc).splitlines()
            last = ([ln for ln in lines if "failed with error" in ln]
                    or [ln for ln in lines if "Error" in ln])[-1:]
            arms["offloading"] = {"runs": False, "error": (last or [str(exc)[:200]])[0][:300]}
            print("offloading", arms["offloading"], flush=True)
    if "second" not in skip and shutil.which("redis-server"):
        port = free_port()
        srv = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                                "--save", "", "--appendonly", "no"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(1.0)
            from rkv import EngineConfig, TierConfig

            cfg = EngineConfig(chunk_tokens=256, tiers=(
                TierConfig("dram", medium="memory", path="t/dram", capacity_bytes=4 << 30),
                TierConfig("shared", kind="redis", url=f"redis://127.0.0.1:{port}/0",
                           capacity_bytes=4 << 30, remote={"namespace": "bench"}),
            )).to_dict()
            run_job(tmp, "instance-1", {"connector": rkv(tmp, "instance-1", cfg), "phases": [
                {"name": "prefill", "prompts": [doc], "max_tokens": 1}]})
            # Instance 2 starts after instance 1 stored the document: its first follow-up
            # misses locally and loads from Redis; the later ones find it locally.
            res = run_job(tmp, "instance-2", {"connector": rkv(tmp, "instance-2", cfg),
                                              "phases": [{"name": "follow", "prompts": [follow],
                                                          **one}]})
            ph = {p["name"]: p for p in res["phases"]}
            note("second", res, ttft_s=med(ph["follow"]["seconds"]),
                 first_ttft_s=ph["follow"]["seconds"][0], ttft_all=ph["follow"]["seconds"],
                 tokens_equal=ph["follow"]["tokens"] == base_tokens,
                 loaded_tokens=ph["follow"]["stats"]["load_tokens"])
        finally:
            srv.terminate()
            srv.wait(10)
    faults: list[dict[str, Any]] = []
    base16: list[list[int]] = []   # 16 clean greedy tokens (the first store run computes them)
    for ber in filter(None, args.faults.split(",")):
        model = {"model": "raw-ber", "ber": float(ber)}
        spec = [{"tier": "dram", "model": model, "hours": 1.0, "seed": 1}]
        res = run_job(tmp, f"faults-rkv-{ber}", {"connector": rkv(
            tmp, f"faults-rkv-{ber}", store_config("dram", "rs(255,239)"), faults=spec),
            "phases": [{"name": "store16", "prompts": [follow], "max_tokens": 16},
                       {"name": "warm", "prompts": [follow], "max_tokens": 16, "repeat": r}]})
        warm = {p["name"]: p for p in res["phases"]}["warm"]
        base16 = base16 or {p["name"]: p for p in res["phases"]}["store16"]["tokens"]
        files = tmp / f"faults-ex-{ber}-files"
        try:
            ex = run_job(tmp, f"faults-ex-{ber}", {"connector": example(tmp, f"faults-ex-{ber}"),
                                                     "phases": [
                {"name": "clean", "prompts": [follow], "max_tokens": 16},
                {"name": "warm-clean", "prompts": [follow], "max_tokens": 16},
                {"name": "warm", "prompts": [follow], "max_tokens": 16, "corrupt_files": {
                    "dir": str(files), "model": model, "hours": 1.0, "seed": 1}}]})
        except RuntimeError as exc:   # a damaged file can take the whole engine down
            lines = [ln for ln in str(exc).splitlines() if "failed with error" in ln]
            faults.append({"ber": float(ber), "rkv_tokens_equal": warm["tokens"] == base16,
                           "rkv_corrected_blocks": warm["stats"].get("corrected_blocks", 0),
                           "rkv_failed_blocks": warm["stats"].get("failed_blocks", 0),
                           "example_crashed": (lines or [str(exc)[-300:]])[-1][-300:]})
            print("faults", json.dumps(faults[-1]), flush=True)
            continue
        exp = {p["name"]: p for p in ex["phases"]}
        clean = exp["clean"]["tokens"]
        st = warm["stats"]
        faults.append({"ber": float(ber), "rkv_tokens_equal": warm["tokens"] == clean,
                       "rkv_faults_injected": st.get("faults_injected", 0),
                       "rkv_corrected_blocks": st.get("corrected_blocks", 0),
                       "rkv_failed_blocks": st.get("failed_blocks", 0),
                       "rkv_recomputed_tokens": st.get("recomputed_tokens", 0),
                       "example_clean_equal": exp["warm-clean"]["tokens"] == clean,
                       "example_tokens_equal": exp["warm"]["tokens"] == clean,
                       "example_corrupted": exp["warm"].get("corrupted", {}),
                       "example_first_diff": next((i for i, (a, b) in enumerate(zip(
                           exp["warm"]["tokens"][0], clean[0], strict=True)) if a != b), None)})
        print("faults", json.dumps(faults[-1]), flush=True)
    out["faults"] = faults
    out["load_after"] = os.getloadavg()
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=1))
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
