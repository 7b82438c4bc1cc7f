"""Run ``vllm.LLM`` on prompts with or without a KV connector, from a JSON job file.

``python scripts/vllm_job.py JOB.json`` builds one ``vllm.LLM`` (CPU here) and runs the
job's phases in order (not ``python -m`` this module: see scripts/vllm_job.py). The tests
(tests/vllm/) and the benchmark (benchmarks/bench_vllm.py) drive vLLM through it, each vLLM
instance in a process of its own (vLLM spawns its engine processes, so ``LLM`` is built
under ``__main__``). The job::

    {"model": null,                        # a HF directory; null: SmolLM2 (vllm_model)
     "connector": {"name": "RkvConnector", "extra": {"store": "...", ...}},  # or null
     "llm": {"max_model_len": 4096},       # more vllm.LLM arguments
     "phases": [{"name": "cold", "prompts": [[1, 2, 3]], "max_tokens": 16,
                 "repeat": 1, "wait_saves": true,
                 "corrupt_files": {"dir": "...", "model": "raw-ber", "hours": 1, "seed": 0}}],
     "out": "result.json"}

Greedy decoding (temperature 0). Each phase records each prompt's generated tokens and the
seconds of each repeat; ``wait_saves`` waits until the connector's background saves are
done (read from its ``stats_file``); ``corrupt_files`` first applies a fault model to the
bytes of every file under ``dir`` (how the ExampleConnector's files are damaged for the
comparison in docs/vllm.md). The result has ``startup_s``, the phases and the connector's
counters (worker and scheduler).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

#: Defaults for a small CPU machine (the job's ``llm`` overrides them).
LLM_DEFAULTS: dict[str, Any] = {
    "dtype": "float32",                 # bf16 greedy tokens differed with/without a connector
    "max_model_len": 4608,
    "enforce_eager": True,              # no torch.compile: minutes on 2 cores
    "enable_prefix_caching": False,     # vLLM's own cache would hide the connector
    "kv_cache_memory_bytes": 1 << 30,
    "max_num_batched_tokens": 4608,
    "seed": 0,
}


def _environment() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("DO_NOT_TRACK", "1")


def read_stats(path: str | None) -> dict[str, Any]:
    """The connector's counters in ``path`` (empty when there is none yet)."""
    if not path:
        return {}
    try:
        return dict(json.loads(Path(path).read_text()))
    except (OSError, ValueError):
        return {}


def wait_saves(path: str | None, timeout: float = 120.0) -> None:
    """Until every save the worker queued is done (or dropped)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        st = read_stats(path)
        if st.get("saves_done", 0) + st.get("saves_dropped", 0) >= st.get("saves_queued", 0):
            return
        time.sleep(0.05)
    raise TimeoutError(f"the connector's saves did not finish in {timeout} s")


def corrupt_files(spec: dict[str, Any]) -> dict[str, int]:
    """Apply fault model ``spec["model"]`` (``hours`` of age, ``seed``) to the bytes of every
    file under ``spec["dir"]``, in place; counts of files and bits flipped."""
    import numpy as np

    import faultmodels

    model = faultmodels.get_model(spec["model"])
    rng = np.random.default_rng(int(spec.get("seed", 0)))
    files = flips = erased = 0
    for p in sorted(Path(spec["dir"]).rglob("*")):
        if not p.is_file():
            continue
        buf = np.frombuffer(p.read_bytes(), dtype=np.uint8).copy()
        pat = model.sample(buf.size, float(spec.get("hours", 1.0)), rng)
        if pat.is_empty:
            continue
        pat.apply(buf, rng)        # a raw file has no way to report an erasure: garbage
        p.write_bytes(buf.tobytes())
        files += 1
        flips += int(np.asarray(pat.flips).size)
        erased += sum(int(n) for _, n, _ in pat.erasures)
    return {"files": files, "flips": flips, "erased_bytes": erased}


def run(job: dict[str, Any]) -> dict[str, Any]:
    """Run ``job`` (see the module docstring) and return its result."""
    _environment()
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.inputs import TokensPrompt

    from rkv.adapters.vllm_model import smollm2_hf_dir

    model = job.get("model") or str(smollm2_hf_dir())
    kw = {**LLM_DEFAULTS, **job.get("llm", {})}
    conn = job.get("connector")
    stats_file = None
    if conn:
        extra = dict(conn.get("extra", {}))
        stats_file = extra.get("stats_file")
        module = conn.get("module", "rkv.adapters.vllm" if conn["name"] == "RkvConnector"
                          else None)
        kw["kv_transfer_config"] = KVTransferConfig(
            kv_connector=conn["name"], kv_connector_module_path=module, kv_role="kv_both",
            kv_load_failure_policy=conn.get("failure_policy", "recompute"),
            kv_connector_extra_config=extra)
    t0 = time.perf_counter()
    llm = LLM(model, **kw)
    out: dict[str, Any] = {"startup_s": time.perf_counter() - t0, "model": model, "phases": []}
    for ph in job.get("phases", []):
        rec: dict[str, Any] = {"name": ph.get("name", ""), "seconds": []}
        if ph.get("corrupt_files"):
            rec["corrupted"] = corrupt_files(ph["corrupt_files"])
        sp = SamplingParams(temperature=0.0, max_tokens=int(ph.get("max_tokens", 16)),
                            ignore_eos=bool(ph.get("ignore_eos", True)))
        prompts = [TokensPrompt(prompt_token_ids=list(p)) for p in ph["prompts"]]
        for _ in range(int(ph.get("repeat", 1))):
            t = time.perf_counter()
            res = llm.generate(prompts, sp, use_tqdm=False)
            rec["seconds"].append(time.perf_counter() - t)
            rec["tokens"] = [list(r.outputs[0].token_ids) for r in res]
            if ph.get("wait_saves", True) and stats_file:
                wait_saves(stats_file)
        rec["stats"] = read_stats(stats_file)
        out["phases"].append(rec)
    if stats_file:
        out["stats"] = read_stats(stats_file)
        out["scheduler_stats"] = read_stats(stats_file + ".scheduler")
    del llm
    return out


def main(argv: list[str]) -> int:
    job = json.loads(Path(argv[0]).read_text())
    result = run(job)
    text = json.dumps(result)
    if job.get("out"):
        Path(job["out"]).write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
