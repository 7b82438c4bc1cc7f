"""Damaged database pages: every call returns exact data or raises an RkvError, never crashes.

A small store holds sequences in every tier. For each LMDB file of it (the three tiers and the
index) and a sample of its 4 KiB pages (always pages 0 and 1, LMDB's meta pages), the store is
restored from a pristine backup (``shutil.copytree``, at the path where it was made, so the
engine does not take it for a copy) and gets that page overwritten (random bytes or zeros,
alternately); then it is opened and every sequence is looked up and read, and ``stats()`` and
``verify()`` run. Each call must either return exact data for what it returns (a prefix of the
sequence, byte for byte) or raise an :class:`rkv.errors.RkvError`; anything else (another
exception, a crash, a hang) fails. Afterwards, in the tiers whose file was *not* damaged, every
record that was there before is still there with the same bytes (read with the lmdb package:
damage elsewhere never makes the engine delete intact data).

Trials run in a subprocess (one per file, looping over pages and printing a JSON line per
trial), so a segfault or an LMDB assertion is reported with its file and page; the file's
remaining pages then run in a new subprocess. ``-m slow`` sweeps every page of every file in
both modes.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import subprocess
import sys
import threading
import traceback
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rkvtest import SMALL, local_config

from rkv import Engine, EngineConfig
from rkv.errors import RkvError
from rkv.eval.demo import synthetic_kv

ROOT = Path(__file__).resolve().parents[1]
PAGE = 4096
CHUNK = 16
CAPS = (16 << 10, 48 << 10, 64 << 20)    # about 6 chunks in dram, 18 in cxl, the rest nvme
FILES = ("t/dram/data.mdb", "t/cxl/data.mdb", "t/nvme/data.mdb", "index/data.mdb")
TIER_OF = {"t/dram/data.mdb": "t/dram", "t/cxl/data.mdb": "t/cxl", "t/nvme/data.mdb": "t/nvme"}
PAGES_PER_FILE = 48
TRIAL_TIMEOUT_S = 30.0
STATUSES = ("ok", "corrected", "uncorrectable", "missing")


def sequences() -> list[np.ndarray]:
    """A dozen sequences sharing prefixes (two bases, branches of several lengths)."""
    rng = np.random.default_rng(77)
    bases = [rng.integers(0, 5000, 48), rng.integers(0, 5000, 32)]
    out = []
    for i in range(12):
        base = bases[i % 2][: CHUNK * (i % 4)]
        out.append(np.concatenate([base, rng.integers(0, 5000, 20 + 9 * i)]).astype(np.int64))
    return out


def config() -> EngineConfig:
    # No read promotions: the check below wants intact tiers untouched by background moves.
    return local_config(CHUNK, caps=CAPS, promote="never")


def build_store(path: Path) -> dict[str, int]:
    """The pristine store; returns the record count of each tier."""
    with Engine.open(path, config()) as e:
        for s in sequences():
            e.put(s, synthetic_kv(SMALL, s), model=SMALL)
        for s in sequences():
            got = e.get(s, model=SMALL)
            assert got.n_tokens == len(s), "the pristine store must be complete"
        return {name: t["records"] for name, t in e.stats()["tiers"].items()}


def tier_records(tier_dir: Path) -> dict[bytes, bytes]:
    """Every record of a tier, read with the lmdb package directly (no rkv code)."""
    import lmdb

    env = lmdb.open(str(tier_dir), max_dbs=8, readonly=True, lock=False, subdir=True)
    try:
        db = env.open_db(b"blocks", create=False)
        with env.begin(db=db) as txn:
            return {bytes(k): bytes(v) for k, v in txn.cursor()}
    finally:
        env.close()


#: Whole-file damage (``page`` gives the cut or the growth in pages where it matters):
#: ``truncate`` cuts the file to ``page`` pages (0: empty), ``cut`` to one byte short of its
#: length, ``extend`` appends ``page`` pages of random bytes, ``vanish`` deletes it. A
#: ``live-`` prefix damages the file while the engine has it open (then every call runs).
FILE_MODES = ("truncate", "cut", "extend", "vanish")
LIVE_TRIALS = (("live-truncate", 2), ("live-truncate", 0), ("live-cut", 0), ("live-random", 0),
               ("live-zero", 1), ("live-random", 3), ("live-vanish", 0))


def damage(path: Path, page: int, mode: str, seed: int) -> None:
    mode = mode.removeprefix("live-")
    if mode == "vanish":
        path.unlink()
        return
    if mode in ("truncate", "cut"):
        os.truncate(path, page * PAGE if mode == "truncate" else path.stat().st_size - 1)
        return
    if mode == "extend":
        with open(path, "ab") as f:
            f.write(np.random.default_rng(seed).bytes(page * PAGE))
        return
    data = (np.random.default_rng(seed).bytes(PAGE) if mode == "random" else bytes(PAGE))
    with open(path, "r+b") as f:
        f.seek(page * PAGE)
        f.write(data)


def plan(pristine: Path, sweep: bool) -> dict[str, list[tuple[int, str]]]:
    """(page, mode) trials per file: pages 0 and 1 in both modes plus a fixed sample (or, with
    ``sweep``, every page in both modes)."""
    trials: dict[str, list[tuple[int, str]]] = {}
    for fi, rel in enumerate(FILES):
        n = (pristine / rel).stat().st_size // PAGE
        if sweep:
            pages = list(range(n))
            trials[rel] = [(p, m) for p in pages for m in ("random", "zero")]
            continue
        rng = np.random.default_rng(fi)
        rest = rng.choice(np.arange(2, n), size=min(PAGES_PER_FILE - 2, max(0, n - 2)),
                          replace=False) if n > 2 else np.empty(0, dtype=np.int64)
        trials[rel] = [(p, m) for p in (0, 1) if p < n for m in ("random", "zero")]
        trials[rel] += [(int(p), ("random", "zero")[k % 2]) for k, p in enumerate(sorted(rest))]
        trials[rel] += file_trials(n)
    return trials


def file_trials(n: int) -> list[tuple[int, str]]:
    """Cuts (empty, one page, two pages, half, one page short, one byte short), growth,
    deletion, and the same kinds of damage while the engine is open."""
    cuts = sorted({0, 1, 2, n // 2, n - 1} - {n})
    return ([(c, "truncate") for c in cuts] + [(0, "cut"), (3, "extend"), (0, "vanish")]
            + [(min(p, n - 1), m) for m, p in LIVE_TRIALS])


# -- the subprocess ---------------------------------------------------------------------------
def run_trial(pristine: Path, dest: Path, rel: str, page: int, mode: str, seed: int
              ) -> tuple[list[str], dict[str, int]]:
    """Restore the store at ``dest`` (its home) from the pristine backup, damage it and use
    it; returns (problems, outcome counts)."""
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(pristine, dest)
    hurt = partial(damage, dest / rel, page, mode, seed)
    if not mode.startswith("live-"):
        hurt()
    problems, outcome = use_store(dest, hurt if mode.startswith("live-") else None)
    leaked = leaked_envs(dest)
    if leaked:
        # A handle left open would serve the next trial at this path stale pages: the worker
        # stops and the parent starts a fresh one.
        problems.append(f"the closed engine left LMDB environments open: {leaked}")
        outcome["leaked"] = 1
        return problems, outcome
    problems += check_intact(pristine, dest, rel)
    problems += put_after(dest, outcome)
    return problems, outcome


def put_after(dest: Path, outcome: dict[str, int]) -> list[str]:
    """A put into the damaged store, once its other checks are done (it may evict records of
    intact tiers): acknowledged, it reads back whole and exact, in this open and the next."""
    extra = np.arange(90_000, 90_000 + 3 * CHUNK)
    want = synthetic_kv(SMALL, extra)
    problems: list[str] = []
    for attempt in ("put", "reopened"):
        try:
            with Engine.open(dest, config()) as e:
                if attempt == "put":
                    e.put(extra, want, model=SMALL)
                got = e.get(extra, model=SMALL)
        except RkvError as exc:
            outcome[f"put after damage raised {type(exc).__name__}"] = 1
            if attempt == "put":
                return problems
            problems.append(f"the store acknowledged a put, then failed to reopen: {exc!r}")
            return problems
        except Exception as exc:
            return [f"put after damage raised {type(exc).__module__}.{type(exc).__name__}: "
                    f"{exc}\n{traceback.format_exc(limit=-4)}"]
        if got.n_tokens != len(extra) or not np.array_equal(got.kv, want):
            problems.append(f"an acknowledged put read back {got.n_tokens} of {len(extra)} "
                            f"tokens ({attempt}): {got.counts}")
    outcome["put after damage kept"] = 1
    return problems


def leaked_envs(store: Path) -> list[str]:
    """The store's LMDB environments still open in this process (every engine is closed)."""
    import lmdb

    out = []
    for sub in (*TIER_OF.values(), "index"):
        try:
            lmdb.open(str(store / sub), max_dbs=8, readonly=True, lock=False).close()
        except lmdb.Error as exc:
            if "already open" in str(exc):
                out.append(sub)
    return out


def use_store(dest: Path, hurt: Callable[[], None] | None = None
              ) -> tuple[list[str], dict[str, int]]:
    """Open the store and call everything; every call returns exact data or raises an
    RkvError. ``hurt`` (when given) damages a file after the store is open and read once."""
    problems: list[str] = []
    outcome: Counter[str] = Counter()

    def call(name: str, fn: Callable[[], Any]) -> Any:
        try:
            value = fn()
        except RkvError as exc:
            outcome[f"{name.split('[')[0]} raised {type(exc).__name__}"] += 1
            return None
        except Exception as exc:
            problems.append(f"{name.split('[')[0]} raised {type(exc).__module__}."
                            f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=-4)}")
            return None
        outcome[f"{name.split('[')[0]} returned"] += 1
        return value

    opened: Engine | None = call("open", lambda: Engine.open(dest, config()))
    if opened is None:
        return problems, dict(outcome)
    e = opened
    try:
        if hurt is not None:
            for s in sequences():          # everything mapped and read once, then damaged
                call("get", partial(e.get, s, model=SMALL))
            hurt()
        for i, s in enumerate(sequences()):
            n = call(f"lookup[{i}]", partial(e.lookup, s, model=SMALL))
            if n is not None and not (isinstance(n, int) and 0 <= n <= len(s)):
                problems.append(f"lookup of seq {i} ({len(s)} tokens) returned {n!r}")
            got = call(f"get[{i}]", partial(e.get, s, model=SMALL))
            if got is None:
                continue
            if not 0 <= got.n_tokens <= len(s) or got.kv.shape[2] != got.n_tokens:
                problems.append(f"get of seq {i}: n_tokens {got.n_tokens}, kv shape "
                                f"{got.kv.shape}")
            elif not np.array_equal(got.kv, synthetic_kv(SMALL, s[: got.n_tokens])):
                problems.append(f"get of seq {i} returned wrong KV for {got.n_tokens} tokens")
            if any(b.status not in STATUSES for b in got.blocks):
                problems.append(f"get of seq {i}: unknown block status")
            outcome[f"get {'full' if got.n_tokens == len(s) else 'short'}"] += 1
        call("stats", e.stats)
        rep = call("verify", e.verify)
        if rep is not None:
            outcome["verify clean" if rep.clean else "verify not clean"] += 1
    finally:
        call("close", e.close)
    return problems, dict(outcome)


def worker_main(spec: dict[str, Any]) -> None:
    import faulthandler

    faulthandler.enable()
    pristine, home, rel = Path(spec["pristine"]), Path(spec["home"]), spec["file"]
    for k, page, mode, seed in spec["trials"]:
        print(json.dumps({"start": k}), flush=True)
        print(f"trial {k}: {rel} page {page} {mode}", file=sys.stderr, flush=True)
        problems, outcome = run_trial(pristine, home, rel, page, mode, seed)
        print(json.dumps({"done": k, "problems": problems, "outcome": outcome}), flush=True)
        if outcome.get("leaked"):
            return


# -- the parent -------------------------------------------------------------------------------
def _lines(proc: subprocess.Popen[str], out: queue.Queue[str | None]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        out.put(line)
    out.put(None)


def run_file(pristine: Path, home: Path, fi: int, rel: str, trials: list[tuple[int, str]]
             ) -> tuple[list[str], Counter[str], int]:
    """Run the trials of one file in subprocesses; returns (problems, outcomes, crashes)."""
    jobs = [(k, page, mode, 1000 * fi + page) for k, (page, mode) in enumerate(trials)]
    problems: list[str] = []
    outcomes: Counter[str] = Counter()
    crashes = 0
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), str(ROOT / "tests"), *filter(None, [env.get("PYTHONPATH")])])
    done: set[int] = set()
    while len(done) < len(jobs):
        todo = [j for j in jobs if j[0] not in done]
        before = len(done)
        spec = {"pristine": str(pristine), "home": str(home), "file": rel, "trials": todo}
        err_path = home.parent / f"stderr-{fi}-{todo[0][0]}.txt"
        with open(err_path, "w") as err:
            proc = subprocess.Popen([sys.executable, __file__, json.dumps(spec)], cwd=ROOT,
                                    env=env, stdout=subprocess.PIPE, stderr=err, text=True)
            lines: queue.Queue[str | None] = queue.Queue()
            threading.Thread(target=_lines, args=(proc, lines), daemon=True).start()
            current: int | None = None
            hung = False
            while True:
                try:
                    line = lines.get(timeout=TRIAL_TIMEOUT_S)
                except queue.Empty:
                    proc.kill()
                    hung = True
                    break
                if line is None:
                    break
                msg = json.loads(line)
                if "start" in msg:
                    current = msg["start"]
                    continue
                done.add(msg["done"])
                current = None
                outcomes.update(msg["outcome"])
                page, mode = trials[msg["done"]]
                problems += [f"{rel} page {page} ({mode}): {p}" for p in msg["problems"]]
            rc = proc.wait()
        if current is None:
            if rc != 0:
                problems.append(f"{rel}: worker exited with {rc} between trials: "
                                f"{err_path.read_text()[-2000:]}")
            if len(done) == before:
                break   # no progress: do not loop forever
            continue
        crashes += 1
        done.add(current)
        page, mode = trials[current]
        what = "hung" if hung else f"died (exit status {rc})"
        tail = err_path.read_text()[-3000:]
        problems.append(f"{rel} page {page} ({mode}): the process {what}: {crash_cause(tail)}"
                        f"\nstderr tail:\n{tail[-1500:]}")
    return problems, outcomes, crashes


def crash_cause(stderr: str) -> str:
    """The fatal message (an LMDB assertion, a signal) and the innermost rkv frame."""
    lines = stderr.splitlines()
    fatal = [ln.strip() for ln in lines if "Assertion" in ln or "Fatal Python error" in ln]
    frames = [ln.strip() for ln in lines if ln.strip().startswith("File ") and "/rkv/" in ln]
    cause = fatal[0] if fatal else "no fatal message"
    cause = re.sub(r"^\S*/(mdb\.c:)", r"\1", cause)
    return f"{cause} in {frames[0]}" if frames else cause


_PRISTINE_RECORDS: dict[str, dict[bytes, bytes]] = {}


def check_intact(pristine: Path, trial: Path, rel: str) -> list[str]:
    """Records of the tiers that were not damaged are all still there, byte for byte (read
    with the lmdb package once the engine is closed)."""
    out = []
    for tier in TIER_OF.values():
        if TIER_OF.get(rel) == tier:
            continue
        key = f"{pristine}:{tier}"
        if key not in _PRISTINE_RECORDS:
            _PRISTINE_RECORDS[key] = tier_records(pristine / tier)
        before = _PRISTINE_RECORDS[key]
        try:
            after = tier_records(trial / tier)
        except Exception as exc:
            out.append(f"intact tier {tier} unreadable afterwards: {exc!r}")
            continue
        lost = [k for k in before if k not in after]
        changed = [k for k in before if k in after and after[k] != before[k]]
        if lost or changed:
            out.append(f"intact tier {tier} lost {len(lost)} and changed {len(changed)} of its "
                       f"{len(before)} records")
    return out


def fuzz(tmp_path: Path, sweep: bool) -> None:
    # Trials damage the store where it was made (a copy elsewhere would be opened as a copy,
    # another code path); ``pristine`` is a backup each trial restores it from.
    home = tmp_path / "work" / "store"
    records = build_store(home)
    assert all(records[name] > 0 for name in ("dram", "cxl", "nvme")), records
    pristine = tmp_path / "pristine"
    shutil.copytree(home, pristine)
    problems: list[str] = []
    outcomes: Counter[str] = Counter()
    crashes = 0
    trials = plan(pristine, sweep)
    for fi, rel in enumerate(FILES):
        p, o, c = run_file(pristine, home, fi, rel, trials[rel])
        problems += p
        outcomes.update(o)
        crashes += c
    n = sum(len(t) for t in trials.values())
    summary = (f"{n} trials, {crashes} crashed or hung, {len(problems)} problems; "
               f"outcomes {dict(sorted(outcomes.items()))}")
    print(summary)
    assert not problems, f"{summary}\n{digest(problems)}"


def digest(problems: list[str]) -> str:
    """Problems grouped by file, call and first line (paths and numbers elided), with one full
    example of each group."""
    groups: dict[str, list[str]] = {}
    for p in problems:
        rel, _, rest = p.partition(" page ")
        what = rest.split(": ", 1)[-1].splitlines()[0] if ": " in rest else rest
        what = re.sub(r'"?/\S+/(rkv|tests)/', r"\1/", what)
        what = re.sub(r"(?<![\w.])/\S+", "<path>", what)
        what = re.sub(r"(status|line) -?\d+", r"\1 N", what)[:200]
        groups.setdefault(f"{rel}: {what}", []).append(p)
    lines = [f"{len(v):4d} x {k}" for k, v in sorted(groups.items())]
    examples = [f"--- e.g. {v[0][:1500]}" for v in groups.values()]
    return "\n".join(lines + examples[:12])


def test_damaged_pages(tmp_path: Path) -> None:
    fuzz(tmp_path, sweep=False)


@pytest.mark.slow
def test_damaged_pages_sweep(tmp_path: Path) -> None:
    fuzz(tmp_path, sweep=True)


if __name__ == "__main__":
    worker_main(json.loads(sys.argv[1]))
