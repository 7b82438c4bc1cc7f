"""Helpers of the vLLM connector tests: prompts, store configs, and a real vLLM (CPU) run
per job in a process of its own (``python scripts/vllm_job.py``)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rkv import EngineConfig, TierConfig

_spec = importlib.util.find_spec("vllm")
#: (tests/vllm itself is importable as a namespace package "vllm": it has no origin)
HAVE_VLLM = _spec is not None and _spec.origin is not None
#: Tests that start vLLM skip cleanly where it is not installed (.venv); the README's test
#: command runs them in .venv-vllm (scripts/setup-vllm.sh).
needs_vllm = pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not installed here "
                                "(scripts/test.sh runs these tests in .venv-vllm)")
ROOT = Path(__file__).resolve().parents[2]
#: One vLLM run may take this long (start-up is about 30 s on 2 cores).
JOB_TIMEOUT = 600


def local_store_config(ecc: str = "none") -> dict[str, Any]:
    """One memory tier inside the store directory (kept across a restart, copied with the
    store), chunks of 256 tokens (two vLLM blocks of 128)."""
    tier = TierConfig("dram", medium="memory", path="t/dram", capacity_bytes=1 << 30, ecc=ecc)
    return EngineConfig(chunk_tokens=256, tiers=(tier,)).to_dict()


def extra(store: Path, stats: Path, **more: Any) -> dict[str, Any]:
    """``kv_connector_extra_config`` of a test store."""
    return {"store": str(store), "stats_file": str(stats), "config": local_store_config(),
            **more}


def prompts() -> tuple[list[int], list[int]]:
    """(P1, P3): a 700-token document (text of rkv's own docs) and P1 followed by a
    follow-up question (the second request of a conversation)."""
    from transformers import AutoTokenizer

    from rkv.adapters.vllm_model import smollm2_hf_dir

    tok = AutoTokenizer.from_pretrained(str(smollm2_hf_dir()))
    text = (ROOT / "docs" / "engine.md").read_text()
    p1 = tok(text)["input_ids"][:700]
    follow = tok("\n\nQuestion: what does a store hold, in one sentence?\nAnswer:")["input_ids"]
    return p1, p1 + follow


def run_job(tmp: Path, name: str, job: dict[str, Any]) -> dict[str, Any]:
    """Run ``job`` in a new process with a real vLLM; its result (the log on failure)."""
    tmp.mkdir(parents=True, exist_ok=True)
    job = {**job, "out": str(tmp / f"{name}.result.json")}
    path = tmp / f"{name}.job.json"
    path.write_text(json.dumps(job))
    env = dict(os.environ)
    iomp = Path(sys.prefix) / "lib" / "libiomp5.so"
    if iomp.exists():     # vLLM's CPU kernels need the venv's OpenMP runtime preloaded
        env["LD_PRELOAD"] = f"{iomp}:{env['LD_PRELOAD']}" if env.get("LD_PRELOAD") else str(iomp)
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1")
    log = tmp / f"{name}.log"
    with log.open("w") as f:
        proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "vllm_job.py"), str(path)],
                              stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                              timeout=JOB_TIMEOUT, check=False)
    if proc.returncode != 0:
        tail = log.read_text()[-6000:]
        pytest.fail(f"vLLM job {name} failed (exit {proc.returncode}):\n{tail}")
    return dict(json.loads(Path(job["out"]).read_text()))


def phase(result: dict[str, Any], name: str) -> dict[str, Any]:
    return next(p for p in result["phases"] if p["name"] == name)
