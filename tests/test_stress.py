"""Bounded stress: writers, a deleter, a clearer, readers and a patrol scrubber on one store,
then an audit.

Sequences share prefixes (some are whole chunk-aligned prefixes of others) and the upper tiers
are tiny, so chunks are demoted all the time while they are read, deleted and cleared. Every
worker logs each call with ``time.monotonic_ns()`` taken right before the call and right after
it returns (CLOCK_MONOTONIC is one clock for every process of the machine), so the audit can
tell which operations certainly did not overlap:

* no worker sees any exception (the last tier never fills, ``on_full`` is ``evict``);
* the scrubber (every block past its refresh age, so each pass rewrites everything it finds)
  never loses a block: nothing is damaged, so a block it cannot read back was lost by a race;
* a reader never gets an ``uncorrectable`` block, and the KV it gets is always exactly the
  synthetic KV of the prefix it was returned for;
* a read reports ``missing`` blocks only while some delete or clear runs, and a writer's
  read-back of what it just put is complete unless a delete of it or a clear overlapped;
* a sequence whose last acknowledged put *started* after every ``delete`` of it and every
  ``clear()`` had *returned* is fully readable and exact afterwards;
* deleting every sequence frees every chunk, ``clear()`` leaves no block and no record in any
  tier, and ``verify()`` is clean with no orphans.

One variant runs the workers as processes (spawn, about 25 s), one as threads (about 10 s).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import threading
import time
import traceback
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
from rkvtest import SMALL, local_config

from rkv import Engine, EngineConfig
from rkv.eval.demo import synthetic_kv
from rkv.store.scrub import ScrubConfig

CHUNK = 16
CAPS = (64 << 10, 256 << 10, 64 << 20)    # dram, cxl tiny: demotions all the time
N_SEQS = 60
MAX_OPS = 20_000
CLEAR_EVERY_S = 3.0
MAX_ERRORS = 20                           # a worker stops after this many failed calls
PROC_RUN_S = 20.0
THREAD_RUN_S = 8.0

#: (role, how many)
ROLES = (("writer", 2), ("deleter", 1), ("clearer", 1), ("reader", 2), ("scrubber", 1))
OK_STATUSES = ("ok", "corrected", "missing")


def sequences() -> list[np.ndarray]:
    """Deterministic sequences on a prefix tree: each new one continues a chunk-aligned prefix
    of an earlier one (sometimes all of it), so chunks are shared at many depths."""
    rng = np.random.default_rng(20240601)
    seqs: list[np.ndarray] = []
    for i in range(N_SEQS):
        if i < 4 or rng.random() < 0.15:
            head = np.empty(0, dtype=np.int64)
        else:
            parent = seqs[int(rng.integers(len(seqs)))]
            whole = len(parent) // CHUNK
            head = parent[: CHUNK * int(rng.integers(1, whole + 1))] if whole else parent[:0]
        # Tails: whole chunks only (so later sequences can extend this one completely) or a
        # partial trailing chunk.
        n = int(rng.integers(1, 8)) * CHUNK + (0 if rng.random() < 0.5 else
                                               int(rng.integers(1, CHUNK)))
        seqs.append(np.concatenate([head, rng.integers(0, 5000, n)]).astype(np.int64))
    return seqs


def config() -> EngineConfig:
    return local_config(CHUNK, caps=CAPS)


def _worker(role: str, wid: int, path: str, run_s: float, log_path: str, barrier: Any) -> None:
    """One worker: logs a JSON line per call (and per failed check) to ``log_path``."""
    seqs = sequences()
    rng = np.random.default_rng(1000 + wid)
    with open(log_path, "w") as log:

        def record(**entry: Any) -> None:
            log.write(json.dumps({"w": wid, "role": role, **entry}) + "\n")
            log.flush()

        engine: Engine | None = None
        try:
            engine = Engine.open(path)
        except BaseException:
            record(op="open", err=traceback.format_exc())
        try:
            barrier.wait(timeout=120)
        except threading.BrokenBarrierError:
            record(op="barrier", err="broken barrier")
        if engine is None:
            return
        errors = 0
        ops = 0
        start = time.monotonic()
        deadline = start + run_s
        next_clear = start + CLEAR_EVERY_S
        try:
            while ops < MAX_OPS and errors < MAX_ERRORS and time.monotonic() < deadline:
                if role == "clearer":
                    while time.monotonic() < min(next_clear, deadline):
                        time.sleep(0.02)
                    if time.monotonic() >= deadline:
                        break
                    next_clear = time.monotonic() + CLEAR_EVERY_S
                elif role in ("deleter", "scrubber"):
                    time.sleep(float(rng.uniform(0.0, 0.005)))
                i = int(rng.integers(len(seqs)))
                s = seqs[i]
                kv = synthetic_kv(SMALL, s) if role == "writer" else None
                ops += 1
                t0 = time.monotonic_ns()
                try:
                    if role == "writer":
                        res: Any = engine.put(s, kv, model=SMALL)
                    elif role == "deleter":
                        res = engine.delete(s, model=SMALL)
                    elif role == "clearer":
                        res = engine.clear()
                    elif role == "scrubber":
                        res = engine.scrub(ScrubConfig(
                            refresh_hours={t: 1e-12 for t in engine.tiers}, batch=8))
                    else:
                        res = engine.get(s, model=SMALL)
                except BaseException:
                    errors += 1
                    record(op=role, s=i, t0=t0, t1=time.monotonic_ns(),
                           err=traceback.format_exc())
                    continue
                t1 = time.monotonic_ns()
                if role == "reader":
                    problem = _check_get(res, s)
                    errors += bool(problem)
                    record(op=role, s=i, t0=t0, t1=t1, n=res.n_tokens,
                           missing=res.counts["missing"], err=problem or None)
                    continue
                if role == "scrubber":
                    lost = res.total("lost") + res.total("repaired")
                    errors += bool(lost)
                    record(op=role, s=i, t0=t0, t1=t1, refreshed=res.total("refreshed"),
                           err=f"{lost} blocks lost or repaired: {res.render()}" if lost
                           else None)
                    continue
                record(op=role, s=i, t0=t0, t1=t1)
                if role == "writer":
                    # Read back at once: unless a delete of it or a clear overlaps, it is all
                    # there (checked by the audit).
                    try:
                        res = engine.get(s, model=SMALL)
                    except BaseException:
                        errors += 1
                        record(op="readback", s=i, t0=t0, t1=time.monotonic_ns(),
                               err=traceback.format_exc())
                        continue
                    problem = _check_get(res, s)
                    errors += bool(problem)
                    record(op="readback", s=i, t0=t0, t1=time.monotonic_ns(), n=res.n_tokens,
                           missing=res.counts["missing"], err=problem or None)
        finally:
            try:
                engine.close()
            except BaseException:
                record(op="close", err=traceback.format_exc())


def _check_get(res: Any, s: np.ndarray) -> str:
    """What is wrong with a GetResult for ``s`` ("" when nothing)."""
    bad = [f"chunk {b.chunk} layer {b.layer} in {b.tier}: {b.status} {b.error!r}"
           for b in res.blocks if b.status not in OK_STATUSES]
    if bad:
        return f"bad blocks {bad[:4]}"
    if not 0 <= res.n_tokens <= len(s):
        return f"n_tokens {res.n_tokens} for a sequence of {len(s)}"
    if res.kv.shape[2] != res.n_tokens:
        return f"kv holds {res.kv.shape[2]} tokens, n_tokens {res.n_tokens}"
    if not np.array_equal(res.kv, synthetic_kv(SMALL, s[: res.n_tokens])):
        return f"wrong KV for the first {res.n_tokens} tokens"
    return ""


def _workers() -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []
    for role, n in ROLES:
        out += [(role, len(out) + k) for k in range(n)]
    return out


def _read_logs(logs: list[Path]) -> list[dict[str, Any]]:
    ops: list[dict[str, Any]] = []
    for p in logs:
        if p.exists():
            ops += [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
    return ops


def _audit(path: str, ops: list[dict[str, Any]]) -> list[str]:
    """Everything that went wrong, as messages (empty: the run was correct)."""
    problems = [f"worker {o['w']} ({o['role']}) {o['op']} seq {o.get('s')}: {o['err']}"
                for o in ops if o.get("err")]
    roles = {o["role"] for o in ops if o["op"] == o["role"]}
    problems += [f"no {r} ran" for r in ("writer", "deleter", "reader", "clearer", "scrubber")
                 if r not in roles]
    if not any(o.get("refreshed") for o in ops if o["op"] == "scrubber"):
        problems.append("the scrubber never rewrote a block")
    seqs = sequences()
    problems += _audit_reads(ops)
    # A put P of S is durable when P started after every delete(S) and every clear() had
    # returned (failed ones included: they may have taken effect).
    clears_end = max((o["t1"] for o in ops if o["op"] == "clearer"), default=-1)
    kill_end: dict[int, int] = defaultdict(lambda: clears_end)
    for o in ops:
        if o["op"] == "deleter":
            kill_end[o["s"]] = max(kill_end[o["s"]], o["t1"])
    required = {o["s"] for o in ops
                if o["op"] == "writer" and not o.get("err") and o["t0"] > kill_end[o["s"]]}
    try:
        problems += _final(path, seqs, required)
    except Exception:
        problems.append(f"the final checks raised:\n{traceback.format_exc()}")
    if not required:
        problems.append("no put was ever certainly after the deletes and clears")
    print(_summary(ops), f"{len(required)} sequences required at the end")
    return problems


def _final(path: str, seqs: list[np.ndarray], required: set[int]) -> list[str]:
    """Required sequences are complete; deleting all frees all; clear() leaves nothing."""
    problems: list[str] = []
    with Engine.open(path) as e:
        for i, s in enumerate(seqs):
            got = e.get(s, model=SMALL)
            bad = [b.status for b in got.blocks if b.status not in OK_STATUSES]
            if bad:
                problems.append(f"final read of seq {i}: blocks {bad}")
            if not np.array_equal(got.kv, synthetic_kv(SMALL, s[: got.n_tokens])):
                problems.append(f"final read of seq {i}: wrong KV ({got.n_tokens} tokens)")
            if i in required and got.n_tokens != len(s):
                problems.append(
                    f"seq {i} ({len(s)} tokens) was put after its last delete and the last "
                    f"clear, but reads back {got.n_tokens} tokens "
                    f"(lookup {e.lookup(s, model=SMALL)}, blocks {got.counts})"
                )
        problems += _consistency(e, "after the run")
        # Deleting every sequence frees every chunk (no reference count drifted).
        for s in seqs:
            e.delete(s, model=SMALL)
        st = e.stats()
        if st["chunks"]:
            problems.append(f"{st['chunks']} chunks left after deleting every sequence")
        problems += _consistency(e, "after deleting every sequence")
        e.clear()
        st = e.stats()
        if st["chunks"]:
            problems.append(f"{st['chunks']} chunks left after clear()")
        for name, t in st["tiers"].items():
            if t["blocks"] or t["records"] or t["bytes"]:
                problems.append(f"after clear() tier {name} has {t['blocks']} blocks, "
                                f"{t['records']} records, {t['bytes']} bytes")
        problems += _consistency(e, "after clear()")
    return problems


def _spans(ops: list[dict[str, Any]], op: str, seq: int | None = None
           ) -> tuple[np.ndarray, np.ndarray]:
    sel = [o for o in ops if o["op"] == op and (seq is None or o["s"] == seq)]
    return (np.array([o["t0"] for o in sel], dtype=np.int64),
            np.array([o["t1"] for o in sel], dtype=np.int64))


def _overlaps(spans: tuple[np.ndarray, np.ndarray], t0: int, t1: int) -> bool:
    return bool(np.any((spans[0] < t1) & (spans[1] > t0)))


def _audit_reads(ops: list[dict[str, Any]]) -> list[str]:
    """Reads that lost data no concurrent call could have removed.

    * A reader's get that reports a missing block while no delete (of any sequence) and no
      clear overlapped it: the index promised a record its tier does not hold.
    * A writer's read-back right after its put (the span from the put's start to the read's
      end) that is short, while no delete of that sequence and no clear overlapped it.
    """
    problems = []
    seqs = sequences()
    clears = _spans(ops, "clearer")
    deletes = _spans(ops, "deleter")
    deletes_of = {i: _spans(ops, "deleter", i) for i in range(len(seqs))}
    for o in ops:
        if o.get("err") or o["op"] not in ("reader", "readback"):
            continue
        t0, t1 = o["t0"], o["t1"]
        if o["op"] == "reader":
            if o["missing"] and not (_overlaps(clears, t0, t1) or _overlaps(deletes, t0, t1)):
                problems.append(f"worker {o['w']} read seq {o['s']}: {o['missing']} missing "
                                "blocks with no delete or clear running")
            continue
        want = len(seqs[o["s"]])
        if o["n"] != want and not (_overlaps(clears, t0, t1)
                                   or _overlaps(deletes_of[o["s"]], t0, t1)):
            problems.append(f"worker {o['w']} put seq {o['s']} and read back {o['n']} of "
                            f"{want} tokens ({o['missing']} missing blocks) with no delete of "
                            "it or clear running")
    return problems


def _consistency(e: Engine, when: str) -> list[str]:
    out = []
    rep = e.verify()
    if not rep.clean or rep.orphans:
        out.append(f"{when}: verify clean={rep.clean} orphans={rep.orphans} "
                   f"missing={rep.missing} uncorrectable={rep.uncorrectable} "
                   f"problems={rep.problems[:3]}")
    for name, t in e.stats()["tiers"].items():
        if t["records"] != t["blocks"]:
            out.append(f"{when}: tier {name} holds {t['records']} records, the index counts "
                       f"{t['blocks']} blocks")
    return out


def _summary(ops: list[dict[str, Any]]) -> str:
    counts: dict[str, int] = defaultdict(int)
    for o in ops:
        counts[o["op"]] += 1
    short = sum(1 for o in ops if o["op"] in ("reader", "readback") and o.get("missing"))
    hits = sum(1 for o in ops if o["op"] == "reader" and o.get("n"))
    return f"calls {dict(counts)}; reader hits {hits}; reads with missing blocks {short};"


def _report(problems: list[str], ops: list[dict[str, Any]]) -> str:
    return f"{len(problems)} problems; {_summary(ops)}\n" + "\n".join(problems[:40])


def test_processes_stress(tmp_path: Path) -> None:
    path = str(tmp_path / "store")
    with Engine.open(path, config()):
        pass
    ctx = mp.get_context("spawn")
    workers = _workers()
    barrier = ctx.Barrier(len(workers))
    logs = [tmp_path / f"worker-{wid}.jsonl" for _, wid in workers]
    procs = [ctx.Process(target=_worker, args=(role, wid, path, PROC_RUN_S, str(log), barrier))
             for (role, wid), log in zip(workers, logs, strict=True)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=PROC_RUN_S + 120)
    hung = [p.pid for p in procs if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    ops = _read_logs(logs)
    problems = [f"worker pid {pid} did not stop" for pid in hung]
    problems += [f"worker {wid} ({role}) exited with {p.exitcode}"
                 for (role, wid), p in zip(workers, procs, strict=True) if p.exitcode != 0]
    problems += _audit(path, ops)
    assert not problems, _report(problems, ops)


def test_threads_stress(tmp_path: Path) -> None:
    path = str(tmp_path / "store")
    with Engine.open(path, config()):
        pass
    workers = _workers()
    barrier = threading.Barrier(len(workers))
    logs = [tmp_path / f"worker-{wid}.jsonl" for _, wid in workers]
    threads = [threading.Thread(target=_worker,
                                args=(role, wid, path, THREAD_RUN_S, str(log), barrier),
                                daemon=True)
               for (role, wid), log in zip(workers, logs, strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=THREAD_RUN_S + 120)
    hung = [t.name for t in threads if t.is_alive()]
    ops = _read_logs(logs)
    problems = [f"thread {name} did not stop" for name in hung]
    if not hung:
        problems += _audit(path, ops)
    assert not problems, _report(problems, ops)
