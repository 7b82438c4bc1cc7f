"""A closed store copied (``cp -r``) or moved (``mv``) to another path.

Two layouts: every tier inside the store directory (``local_config``), and the default tiers,
whose ``dram`` and ``cxl`` live in ``/dev/shm`` (skipped where /dev/shm is not writable).

* Inside the store directory a copy or a move carries everything: every sequence reads back
  whole and exact.
* With memory tiers in /dev/shm a copy may find its memory-tier chunks gone (it must not share
  them with the original), but it never drops data that lives inside the store directory: the
  leading run of chunks of each sequence that lived in ``nvme`` still reads back, exactly. A
  moved store leaves no original behind and reads everything back.
* The original stays whole after its copy was opened, written to and closed.
* ``Engine.destroy`` of every store involved leaves no ``/dev/shm/rkv-*`` directory of theirs.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rkvtest import SMALL, local_config

from rkv import Engine, EngineConfig
from rkv.eval.demo import synthetic_kv

CHUNK = 16
SHM = Path("/dev/shm")
VARIANTS = ("local", "shm")


def shm_writable() -> bool:
    return SHM.is_dir() and os.access(SHM, os.W_OK | os.X_OK)


def config(variant: str) -> EngineConfig:
    """Small upper tiers, so every layout holds chunks in each of its three tiers."""
    if variant == "local":
        return local_config(CHUNK, caps=(16 << 10, 48 << 10, 1 << 30))
    if not shm_writable():
        pytest.skip("/dev/shm is not writable")
    return (EngineConfig(chunk_tokens=CHUNK)
            .with_tier("dram", capacity_bytes=16 << 10)
            .with_tier("cxl", capacity_bytes=48 << 10))


def sequences(seed: int = 5, n: int = 14) -> list[np.ndarray]:
    """Sequences with shared prefixes; the first ones are put first and end up in nvme."""
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 5000, 64)
    return [np.concatenate([base[: CHUNK * (i % 3)] if i >= 4 else base[:0],
                            rng.integers(0, 5000, 24 + 7 * i)]).astype(np.int64)
            for i in range(n)]


def shm_listing() -> set[str]:
    return {p.name for p in SHM.glob("rkv-*")} if SHM.is_dir() else set()


class Tracker:
    """The memory-tier directories of every engine a test opened (to check destroy)."""

    def __init__(self) -> None:
        self.dirs: set[Path] = set()
        self.before = shm_listing()
        self.roots: list[Path] = []

    def open(self, path: Path, cfg: EngineConfig | None = None) -> Engine:
        e = Engine.open(path, cfg)
        self.roots.append(path)
        for t in e.stats()["tiers"].values():
            p = Path(t["path"])
            if SHM in p.parents:
                self.dirs.add(p)
        return e

    def leftovers(self) -> list[str]:
        """Memory-tier directories of these stores still in /dev/shm (listed, then removed so
        that a failing run does not fill /dev/shm)."""
        ours = {f"rkv-{_path_tag(r)}" for r in self.roots}
        ours |= {d.parent.name for d in self.dirs if d.parent.parent == SHM}
        new = shm_listing() - self.before
        out = [str(d) for d in sorted(self.dirs) if d.exists()]
        out += [f"{SHM / n} (new since the test started)" for n in sorted(new & ours)]
        out += [str(SHM / n) for n in sorted((shm_listing() & ours) - new)]
        for d in self.dirs:
            shutil.rmtree(d, ignore_errors=True)
        for n in new & ours:
            shutil.rmtree(SHM / n, ignore_errors=True)
        return sorted(set(out))


def _path_tag(root: Path) -> str:
    """The /dev/shm directory name derived from the store path (the original scheme; the tier
    paths every engine reported are checked as well)."""
    return hashlib.blake2b(str(root.resolve()).encode(), digest_size=8).hexdigest()


def fill(e: Engine, seqs: list[np.ndarray]) -> dict[int, int]:
    """Put every sequence; returns, per sequence, the tokens of its leading run of chunks
    that live in nvme (data inside the store directory that no copy may lose)."""
    for s in seqs:
        e.put(s, synthetic_kv(SMALL, s), model=SMALL)
    in_nvme: dict[int, int] = {}
    for i, s in enumerate(seqs):
        got = e.get(s, model=SMALL)
        assert got.n_tokens == len(s)
        tiers: dict[int, set[str]] = {}
        for b in got.blocks:
            tiers.setdefault(b.chunk, set()).add(b.tier)
        n = 0
        for c in sorted(tiers):
            if tiers[c] != {"nvme"}:
                break
            n = min(len(s), (c + 1) * CHUNK)
        in_nvme[i] = n
    return in_nvme


def check_all(e: Engine, seqs: list[np.ndarray], what: str) -> list[str]:
    """Every sequence whole and exact, and the store clean."""
    return check_at_least(e, seqs, {i: len(s) for i, s in enumerate(seqs)}, what)


def check_at_least(e: Engine, seqs: list[np.ndarray], need: dict[int, int], what: str,
                   lossy: bool = False) -> list[str]:
    """Whatever a read returns is exact; sequence i reads back at least need[i] tokens.

    The store must verify clean with no orphans; where it may have lost chunks (``lossy``: its
    memory tiers are new), after ``verify(repair=True)`` has run (a fresh memory tier may be
    reported until a repair acknowledges it), and nothing may be uncorrectable even before.
    """
    problems = []
    for i, s in enumerate(seqs):
        got = e.get(s, model=SMALL)
        bad = [b.status for b in got.blocks if b.status == "uncorrectable"]
        if bad:
            problems.append(f"{what}: seq {i} has {len(bad)} uncorrectable blocks")
        if not np.array_equal(got.kv, synthetic_kv(SMALL, s[: got.n_tokens])):
            problems.append(f"{what}: seq {i} reads back wrong KV")
        if got.n_tokens < need.get(i, 0):
            problems.append(f"{what}: seq {i} reads back {got.n_tokens} of {len(s)} tokens, "
                            f"expected at least {need[i]} (blocks {got.counts})")
    if lossy:
        rep = e.verify(repair=True)
        if rep.uncorrectable:
            problems.append(f"{what}: verify found uncorrectable blocks: {rep!r:.600}")
    rep = e.verify()
    if not rep.clean or rep.orphans:
        problems.append(f"{what}: verify{' after a repair' if lossy else ''} is not clean: "
                        f"{rep!r:.600}")
    for name, t in e.stats()["tiers"].items():
        if t["records"] != t["blocks"]:
            problems.append(f"{what}: tier {name} holds {t['records']} records, the index "
                            f"counts {t['blocks']} blocks")
    return problems


def destroy_all(track: Tracker, *paths: Path) -> list[str]:
    problems = []
    for p in paths:
        Engine.destroy(p)
        if p.exists():
            problems.append(f"destroy left {p}")
    problems += [f"left in /dev/shm: {d}" for d in track.leftovers()]
    return problems


def _describe(placement: dict[int, int], seqs: list[np.ndarray]) -> dict[str, Any]:
    return {"nvme-only sequences": sum(placement[i] == len(s) for i, s in enumerate(seqs)),
            "partly elsewhere": sum(placement[i] < len(s) for i, s in enumerate(seqs))}


@pytest.mark.parametrize("variant", VARIANTS)
def test_copied_store(tmp_path: Path, variant: str) -> None:
    cfg = config(variant)
    track = Tracker()
    seqs = sequences()
    orig, copy = tmp_path / "orig", tmp_path / "copy"
    problems: list[str] = []
    try:
        with track.open(orig, cfg) as e:
            placement = fill(e, seqs)
            counts = {n: t["blocks"] for n, t in e.stats()["tiers"].items()}
        assert all(counts.values()), counts
        desc = _describe(placement, seqs)
        assert all(desc.values()), desc      # the test needs both kinds of sequences
        subprocess.run(["cp", "-r", str(orig), str(copy)], check=True)
        need = ({i: len(s) for i, s in enumerate(seqs)} if variant == "local" else placement)
        extra = sequences(seed=99, n=4)
        with track.open(copy) as c:
            problems += check_at_least(c, seqs, need, "the copy", lossy=variant == "shm")
            # Write to the copy: new sequences, a re-put, a delete.
            for s in [*extra, seqs[-1]]:
                c.put(s, synthetic_kv(SMALL, s), model=SMALL)
            c.delete(seqs[0], model=SMALL)
            c.delete(seqs[5], model=SMALL)
        with track.open(copy) as c:
            problems += check_all(c, extra, "the copy, reopened")
        with track.open(orig) as e:
            problems += check_all(e, seqs, "the original after its copy was used")
    finally:
        problems += destroy_all(track, orig, copy)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("variant", VARIANTS)
def test_moved_store(tmp_path: Path, variant: str) -> None:
    cfg = config(variant)
    track = Tracker()
    seqs = sequences()
    orig, moved = tmp_path / "orig", tmp_path / "moved"
    problems: list[str] = []
    try:
        with track.open(orig, cfg) as e:
            fill(e, seqs)
        subprocess.run(["mv", str(orig), str(moved)], check=True)
        with track.open(moved) as m:
            # A move leaves no original behind: the store keeps its memory tiers too.
            problems += check_all(m, seqs, "the moved store")
            s = seqs[3]
            m.put(s, synthetic_kv(SMALL, s), model=SMALL)
        with track.open(moved) as m:
            problems += check_all(m, [seqs[3]], "the moved store, reopened")
    finally:
        problems += destroy_all(track, orig, moved)
    assert not problems, "\n".join(problems)


def test_destroy_removes_a_memory_tier_a_later_config_moved(tmp_path: Path) -> None:
    """The store's whole rkv-<id> memory directory goes, also a tier environment that a
    reopen with another path for that tier left behind."""
    from rkv.store.paths import memory_dir

    shm = memory_dir()
    if shm is None:
        pytest.skip("no memory-backed directory on this machine")
    path = tmp_path / "kv"
    with Engine.open(path) as e:                 # default: dram and cxl in /dev/shm
        sid = e.identity.id
    assert (shm / f"rkv-{sid}" / "cxl").is_dir()
    with Engine.open(path, EngineConfig().with_tier("cxl", path="cxl")):
        pass
    Engine.destroy(path)
    assert not path.exists() and not (shm / f"rkv-{sid}").exists()
