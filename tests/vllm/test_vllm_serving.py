"""rkv inside a real vLLM (CPU, SmolLM2-135M with 4-bit Q4_1 weights, fp32 compute): the
greedy tokens with rkv's KV loaded equal the tokens of vLLM without a connector, across a
restart and across two instances; corrupted or faulty blocks are recomputed or corrected,
never served; a changed salt is a miss; the canary refuses a wrong paged layout.

Each vLLM instance runs in a process of its own (about 30 s to start on 2 cores); the
instances of this module run one after the other, sharing the module's fixtures."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from vllm_jobs import extra, local_store_config, needs_vllm, phase, prompts, run_job

pytestmark = needs_vllm
NEW = 16                   # greedy tokens generated per request


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("vllm")


@pytest.fixture(scope="module")
def texts() -> tuple[list[int], list[int]]:
    return prompts()


@pytest.fixture(scope="module")
def baseline(work: Path, texts: tuple[list[int], list[int]]) -> dict[str, Any]:
    """vLLM without a connector: the tokens every other run must give."""
    p1, p3 = texts
    return run_job(work, "baseline", {"connector": None, "phases": [
        {"name": "p1", "prompts": [p1], "max_tokens": NEW},
        {"name": "p3", "prompts": [p3], "max_tokens": NEW}]})


@pytest.fixture(scope="module")
def store_a(work: Path, texts: tuple[list[int], list[int]]
            ) -> Iterator[tuple[Path, dict[str, Any]]]:
    """Store A: P1 computed and stored (cold), then P1 again (warm, loaded)."""
    p1, _ = texts
    store = work / "store-a"
    result = run_job(work, "store-a", {"connector": {"name": "RkvConnector", "extra": extra(
        store, work / "a.stats.json")}, "phases": [
        {"name": "cold", "prompts": [p1], "max_tokens": NEW},
        {"name": "warm", "prompts": [p1], "max_tokens": NEW}]})
    yield store, result


def test_warm_restore_gives_the_tokens_of_recompute(baseline: dict[str, Any],
                                                     store_a: tuple[Path, dict[str, Any]]
                                                     ) -> None:
    _, r = store_a
    want = phase(baseline, "p1")["tokens"]
    cold, warm = phase(r, "cold"), phase(r, "warm")
    assert cold["tokens"] == want
    assert cold["stats"]["canary"] == "ok"
    assert cold["stats"]["saves_done"] == 1 and cold["stats"]["chunks_written"] == 2
    assert cold["stats"].get("loads", 0) == 0          # nothing stored yet: recomputed
    assert warm["tokens"] == want
    st = warm["stats"]
    # The 700-token prompt's two whole chunks (512 tokens) came from rkv, all 60 blocks
    # (2 chunks x 30 layers) verified, none failed.
    assert st["loads"] == 1 and st["load_tokens"] == 512
    assert st["load_blocks"] == 60 and st["failed_blocks"] == 0
    assert r["scheduler_stats"]["hit_tokens"] == 512


def test_queued_requests_are_announced_held_and_released(work: Path, baseline: dict[str, Any],
                                                         texts: tuple[list[int], list[int]]
                                                         ) -> None:
    """Two running at a time (max_num_seqs=2), eight queued: the six that wait are announced
    to the worker (prefetch + hold), each hold is dropped when its request is scheduled,
    and every request still gets the tokens of vLLM without a connector."""
    p1, _ = texts
    r = run_job(work, "queue", {"llm": {"max_num_seqs": 2}, "connector": {
        "name": "RkvConnector", "extra": extra(work / "store-q", work / "q.stats.json")},
        "phases": [{"name": "fill", "prompts": [p1], "max_tokens": NEW},
                   {"name": "queue", "prompts": [p1] * 8, "max_tokens": NEW}]})
    want = phase(baseline, "p1")["tokens"]
    assert phase(r, "fill")["tokens"] == want
    assert phase(r, "queue")["tokens"] == want * 8
    st, sched = r["stats"], r["scheduler_stats"]
    assert sched["queued"] == 9
    assert st["queue_announced"] == 6 and st["queue_released"] == 6
    assert st.get("queue_errors", 0) == 0
    assert st["loads"] == 8                       # every queued one restored its prefix


def test_preempted_requests_are_announced_again(work: Path,
                                                texts: tuple[list[int], list[int]]) -> None:
    """A KV cache of 13 vLLM blocks (128 tokens each) and two 700-token prompts that grow
    past their sixth block while decoding: vLLM preempts one. rkv announces it again, holds
    its stored prefix while it waits, releases the hold when vLLM resumes it (which then
    loads the prefix back), and the tokens are those of the same vLLM without rkv."""
    p1, _ = texts
    llm = {"num_gpu_blocks_override": 13, "max_model_len": 1024,
           "max_num_batched_tokens": 2048}
    phases = [{"name": "two", "prompts": [p1, p1], "max_tokens": 112}]
    base = run_job(work, "preempt-base", {"llm": llm, "connector": None, "phases": phases})
    r = run_job(work, "preempt", {"llm": llm, "connector": {
        "name": "RkvConnector", "extra": extra(work / "store-pre", work / "pre.stats.json")},
        "phases": phases})
    assert phase(r, "two")["tokens"] == phase(base, "two")["tokens"]
    st, sched = r["stats"], r["scheduler_stats"]
    assert sched.get("preempted", 0) >= 1
    assert st["queue_announced"] == st["queue_released"] >= sched["preempted"]
    assert st.get("queue_errors", 0) == 0
    assert st["loads"] >= 1                       # the resumed request loaded its prefix


def _vllm_spec(store: Path) -> Any:
    from rkv import Engine

    with Engine.open(store) as e:
        (spec,) = [s for s in e.models() if s.model_id.startswith("vllm:")]
    return spec


def test_restart_serves_stored_prefixes_and_recomputes_a_corrupted_block(
        work: Path, baseline: dict[str, Any], store_a: tuple[Path, dict[str, Any]],
        texts: tuple[list[int], list[int]]) -> None:
    from faultmodels import ErrorPattern
    from rkv import Engine
    from rkv.format.keys import as_token_array, block_key, chunk_keys
    from rkv.tiers.faulty import FaultyTier

    p1, p3 = texts
    store = work / "store-a-corrupt"
    shutil.copytree(store_a[0], store)            # a store is its directory
    spec = _vllm_spec(store)
    keys = chunk_keys(as_token_array(p1[:512]), spec.fingerprint(), 256)
    bad = block_key(keys[1], 7)                   # chunk 1 (tokens 256-511), layer 7
    with Engine.open(store) as e:
        tier = e.wrap_tier("dram", lambda t: FaultyTier(t, seed=5))
        assert isinstance(tier, FaultyTier)
        before = bytes(tier.inner.get(bad) or b"")
        flips = 8 * (len(before) // 2) + np.arange(0, 8 * 64, 8)   # 64 bytes mid-record
        tier.inject(bad, ErrorPattern(nbytes=len(before), flips=flips))
        after = bytes(tier.inner.get(bad) or b"")
    changed = np.flatnonzero(np.frombuffer(before, np.uint8) != np.frombuffer(after, np.uint8))
    assert changed.size == 64                     # the record was really corrupted
    r = run_job(work, "restart", {"connector": {"name": "RkvConnector", "extra": extra(
        store, work / "restart.stats.json")}, "phases": [
        {"name": "p3", "prompts": [p3], "max_tokens": NEW}]})
    got = phase(r, "p3")
    assert got["tokens"] == phase(baseline, "p3")["tokens"]
    st = got["stats"]
    # Restarted, the store served chunk 0 (256 tokens) of the earlier request; chunk 1's
    # corrupted block failed verification, was never injected, and its two vLLM blocks
    # were reported as load errors, so vLLM recomputed tokens 256-511.
    assert st["loads"] == 1 and st["load_tokens"] == 256
    assert st["failed_blocks"] >= 1 and st["failed_vllm_blocks"] == 2
    assert st["recomputed_tokens"] == 256


def test_another_salt_is_a_miss(work: Path, baseline: dict[str, Any],
                                store_a: tuple[Path, dict[str, Any]],
                                texts: tuple[list[int], list[int]]) -> None:
    p1, _ = texts
    store = work / "store-a-salt"
    shutil.copytree(store_a[0], store)
    r = run_job(work, "salt", {"connector": {"name": "RkvConnector", "extra": extra(
        store, work / "salt.stats.json", salt="engine-build-2")}, "phases": [
        {"name": "p1", "prompts": [p1], "max_tokens": NEW}]})
    got = phase(r, "p1")
    assert got["tokens"] == phase(baseline, "p1")["tokens"]
    assert got["stats"].get("loads", 0) == 0 and r["scheduler_stats"]["hit_tokens"] == 0
    assert got["stats"]["saves_done"] == 1           # stored again, under its own keys
    from rkv import Engine

    with Engine.open(store) as e:
        salts = sorted(dict(s.extra)["salt"] for s in e.models()
                       if s.model_id.startswith("vllm:"))
    assert salts == ["", "engine-build-2"]


def test_the_canary_refuses_a_permuted_layout(work: Path, baseline: dict[str, Any],
                                              texts: tuple[list[int], list[int]]) -> None:
    p1, _ = texts
    store = work / "store-permuted"
    # The layout vLLM's CPU backend code suggests (keys not transposed): the shapes fit,
    # the values would not.
    r = run_job(work, "permuted", {"connector": {"name": "RkvConnector", "extra": extra(
        store, work / "permuted.stats.json", layout="blocks-heads-kv-tokens")}, "phases": [
        {"name": "p1", "prompts": [p1], "max_tokens": NEW},
        {"name": "again", "prompts": [p1], "max_tokens": NEW}]})
    st = phase(r, "again")["stats"]
    assert st["canary"].startswith("failed: gathering vLLM-written KV")
    assert st.get("saves_queued", 0) == 0 and st.get("load_tokens", 0) == 0
    assert phase(r, "p1")["tokens"] == phase(r, "again")["tokens"] == phase(
        baseline, "p1")["tokens"]


def test_two_instances_share_prefixes_through_redis(work: Path, baseline: dict[str, Any],
                                                    texts: tuple[list[int], list[int]],
                                                    redis_server: Any) -> None:
    from redis_server import remote_config

    p1, p3 = texts
    cfg = remote_config(redis_server.url, "vllm-share", local=True, chunk_tokens=256).to_dict()
    first = run_job(work, "share-1", {"connector": {"name": "RkvConnector", "extra": {
        **extra(work / "node-1", work / "n1.stats.json"), "config": cfg}}, "phases": [
        {"name": "prefill", "prompts": [p1], "max_tokens": NEW}]})
    assert phase(first, "prefill")["stats"]["saves_done"] == 1
    second = run_job(work, "share-2", {"connector": {"name": "RkvConnector", "extra": {
        **extra(work / "node-2", work / "n2.stats.json"), "config": cfg}}, "phases": [
        {"name": "follow-up", "prompts": [p3], "max_tokens": NEW}]})
    got = phase(second, "follow-up")
    assert got["tokens"] == phase(baseline, "p3")["tokens"]
    # Node 2 never computed P1: its 512 stored tokens came from node 1 through Redis.
    assert got["stats"]["load_tokens"] == 512 and got["stats"]["failed_blocks"] == 0


def test_faults_while_serving_are_corrected_or_recomputed(work: Path,
                                                          baseline: dict[str, Any],
                                                          texts: tuple[list[int], list[int]]
                                                          ) -> None:
    p1, _ = texts
    faults = [{"tier": "dram", "model": {"model": "raw-ber", "ber": 2e-5}, "hours": 1.0,
               "seed": 3}]
    r = run_job(work, "faults", {"connector": {"name": "RkvConnector", "extra": {
        **extra(work / "store-faults", work / "faults.stats.json", faults=faults),
        "config": local_store_config(ecc="rs(255,239)")}}, "phases": [
        {"name": "cold", "prompts": [p1], "max_tokens": NEW},
        {"name": "warm", "prompts": [p1], "max_tokens": NEW, "repeat": 2}]})
    want = phase(baseline, "p1")["tokens"]
    warm = phase(r, "warm")
    assert phase(r, "cold")["tokens"] == want and warm["tokens"] == want
    st = warm["stats"]
    # Every read of the two loads drew bit errors (about 60 flips per 393 KB record):
    # Reed-Solomon corrected them, so every block was used.
    assert st["faults_injected"] >= 100
    assert st["corrected_blocks"] >= 100 and st["load_tokens"] == 1024
