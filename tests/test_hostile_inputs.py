"""Hostile input gets a typed error within bounded time and memory (never a hang, never exit 70).

Covered: endless or blocking files (``/dev/zero``, ``/dev/urandom``, a FIFO, a directory) as a
config, ``RKV_CONFIG``, a sweep file, a trace, a profile; oversized files; TOML and JSON
nested a hundred thousand levels deep (dotted keys included); sizes that overflow (an
environment variable, ``--capacity``) and digits that float rounding would change; a MoE
trace header declaring 10^12 experts; a Mooncake request of 200,000 hash ids (the replays
must be linear: asserted on the number of keys a policy is asked to step over, not on
timings); ``rkv scrub --once`` on an empty store computing no schedule; a sweep whose axes
expand to millions of cells.

Commands that read an endless device or block on a FIFO run in a subprocess with a timeout
and a memory limit, so that a regression fails the test instead of hanging or exhausting
the machine.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Container, Hashable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rkvtest import SMALL, local_config, one_line_error, random_kv

from faultmodels import FaultModelError
from faultmodels import files as ffiles
from rkv import ConfigError, Engine, InputError
from rkv.cli import main
from rkv.inputs import MAX_NESTING, read_json, read_text
from rkv.specs import strict_json

RKV = [sys.executable, "-m", "rkv.cli"]
#: Generous: each command here finishes in about a second (start-up included).
TIMEOUT_S = 60
#: Heap a command may use (RLIMIT_DATA; LMDB's file maps do not count): far above what
#: these commands need, far below what an endless read would take.
DATA_LIMIT = 3 << 30


def _limit() -> None:  # pragma: no cover - runs in the child
    resource.setrlimit(resource.RLIMIT_DATA, (DATA_LIMIT, DATA_LIMIT))


def rkv(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None
        ) -> subprocess.CompletedProcess[str]:
    """``rkv ARGS`` in a child process (bounded in time and heap)."""
    full = {**os.environ, **(env or {})}
    try:
        return subprocess.run([*RKV, *args], capture_output=True, text=True, env=full,
                              timeout=TIMEOUT_S, preexec_fn=_limit, cwd=cwd, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail(f"rkv {' '.join(args)} still running after {TIMEOUT_S} s")


def python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -c CODE ARGS`` in a child process (bounded in time and heap)."""
    try:
        return subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                              text=True, timeout=TIMEOUT_S, preexec_fn=_limit, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail(f"python -c {code!r} still running after {TIMEOUT_S} s")


def assert_usage_error(p: subprocess.CompletedProcess[str], *needles: str) -> None:
    """Exit 2 and one ``rkv: error:`` line naming each of ``needles``."""
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2, p.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("rkv: error: "), p.stderr[-2000:]
    for n in needles:
        assert n in lines[0], lines[0]



@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    p = tmp_path / "fifo.toml"
    os.mkfifo(p)
    return p


# -- endless and blocking files --------------------------------------------------------------
@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_a_device_as_a_config(tmp_path: Path, device: str) -> None:
    assert_usage_error(rkv("init", str(tmp_path / "s"), "--config", device),
                       device, "character device")
    assert not (tmp_path / "s").exists()
    assert_usage_error(rkv("init", str(tmp_path / "s"), env={"RKV_CONFIG": device}),
                       device)
    assert_usage_error(rkv("plan", "--config", device), device)
    assert not (tmp_path / "s").exists()


def test_a_fifo_as_a_config_sweep_or_trace(tmp_path: Path, fifo: Path) -> None:
    # Nobody writes to the FIFO: a plain open() would block forever.
    assert_usage_error(rkv("init", str(tmp_path / "s"), "--config", str(fifo)), "FIFO")
    assert_usage_error(rkv("sweep", str(fifo), "--list"), "FIFO")
    assert_usage_error(rkv("replay", str(fifo)), "FIFO")
    assert_usage_error(rkv("replay", "--moe", str(fifo)), "FIFO")
    assert not (tmp_path / "s").exists()


def test_a_device_as_a_sweep_or_a_trace(tmp_path: Path) -> None:
    assert_usage_error(rkv("sweep", "/dev/zero", "--list"), "/dev/zero")
    assert_usage_error(rkv("report", "/dev/zero"), "/dev/zero")
    assert_usage_error(rkv("replay", "/dev/zero"), "/dev/zero")
    assert_usage_error(rkv("replay", "--moe", "/dev/zero"), "/dev/zero")
    assert_usage_error(rkv("replay", "--moe", "/dev/urandom"), "/dev/urandom")


def test_the_shared_reader_refuses_special_and_oversized_files(tmp_path: Path,
                                                                fifo: Path) -> None:
    for p, kind in ((Path("/dev/zero"), "character device"), (fifo, "FIFO"),
                    (tmp_path, "directory")):
        with pytest.raises(ConfigError, match=kind):
            read_text(p, "config")
        with pytest.raises(InputError, match=kind):
            read_text(p, "text", error=InputError)
    big = tmp_path / "big.toml"
    big.write_bytes(b"# " + b"x" * (1 << 20) + b"\n")
    with pytest.raises(ConfigError, match="larger than 1 MiB"):
        read_text(big, "config")
    bad = tmp_path / "bad.toml"
    bad.write_bytes(b"a = 1\n\xff\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        read_text(bad, "config")
    with pytest.raises(ConfigError, match="cannot open"):
        read_text(tmp_path / "missing", "config")


def test_a_fault_model_file_that_is_a_device(tmp_path: Path) -> None:
    import faultmodels

    link = tmp_path / "zero.toml"
    link.symlink_to("/dev/zero")
    # In a child: a regression would read /dev/zero until memory runs out.
    p = python("import sys, faultmodels\ntry:\n    faultmodels.load(sys.argv[1])\n"
               "except faultmodels.FaultModelError as e:\n    print(e)\n", str(link))
    assert p.returncode == 0 and "character device" in p.stdout, p.stderr[-2000:]
    cfg = tmp_path / "tier.toml"                   # a tier whose fault model is that file
    cfg.write_text(f'[[tiers]]\nname = "a"\nfault_model = "{link}"\n')
    assert_usage_error(rkv("init", str(tmp_path / "s"), "--config", str(cfg)),
                       "character device")
    deep = tmp_path / "deep.toml"
    deep.write_text("x = " + "[" * 50_000 + "]" * 50_000 + "\n")
    with pytest.raises(FaultModelError, match="nested deeper"):
        faultmodels.load(deep)


# -- nesting ---------------------------------------------------------------------------------
def _deep_configs(tmp_path: Path) -> dict[str, Path]:
    out = {}
    for name, text in (("array", "x = " + "[" * 100_000 + "]" * 100_000),
                       ("inline", "x = " + "{a = " * 50_000 + "1" + "}" * 50_000),
                       ("dotted", ".".join(["a"] * 20_000) + " = 1"),
                       ("header", "[" + ".".join(["a"] * 100_000) + "]")):
        p = out[name] = tmp_path / f"{name}.toml"
        p.write_text(text + "\n")
    return out


@pytest.mark.parametrize("kind", ["array", "inline", "dotted", "header"])
def test_deeply_nested_toml_config(tmp_path: Path, kind: str,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _deep_configs(tmp_path)[kind]
    t0 = time.perf_counter()
    assert main(["init", str(tmp_path / "s"), "--config", str(cfg)]) == 2
    assert "nested deeper than 64" in one_line_error(capsys)
    assert main(["plan", "--config", str(cfg)]) == 2
    assert "nested deeper" in one_line_error(capsys)
    assert time.perf_counter() - t0 < 20            # tomllib: quadratic in dotted keys
    assert not (tmp_path / "s").exists()


def test_deeply_nested_sweep_and_env_table(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    sweep = _deep_configs(tmp_path)["array"]
    assert main(["sweep", str(sweep), "--list"]) == 2
    assert "nested deeper" in one_line_error(capsys)
    monkeypatch.setenv("RKV_SCRUB", "{a = " * 5000 + "1" + "}" * 5000)
    assert main(["init", str(tmp_path / "s")]) == 2
    assert "RKV_SCRUB" in one_line_error(capsys)
    assert not (tmp_path / "s").exists()


def test_deeply_nested_profile_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                    ) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    cfg = tmp_path / "p.toml"
    cfg.write_text(f'[placement]\nprofile = "{deep}"\n')
    assert main(["plan", "--config", str(cfg)]) == 2      # was an internal error (70)
    assert "nested deeper" in one_line_error(capsys)
    with pytest.raises(ConfigError, match="nested deeper"):
        read_json(deep, "profile")
    with pytest.raises(ValueError, match="nested deeper"):
        strict_json('{"a": ' * 1000 + "1" + "}" * 1000)


def _nested(depth: int, inner: object) -> object:
    for i in range(depth):
        inner = [inner] if i % 2 else {"k": inner}
    return inner


@given(st.integers(0, 200), st.text(alphabet="[]{}.\"'\\#=,\n ab1", max_size=30))
def test_nesting_bounds_the_real_depth(depth: int, noise: str) -> None:
    """The scanner's depth is never below the document's (it stops counting once past the
    limit); brackets in strings do not count."""
    doc = json.dumps(_nested(depth, noise))
    assert ffiles.nesting(doc, "json") >= min(depth, MAX_NESTING + 1)
    if depth <= MAX_NESTING:
        assert strict_json(doc) == _nested(depth, noise)
    else:
        with pytest.raises(ValueError, match="nested deeper"):
            strict_json(doc)


def test_real_documents_are_not_refused() -> None:
    from rkv.eval.sweep.spec import builtin_path, load_sweep

    root = Path(__file__).resolve().parent.parent
    for p in [*(root / "rkv" / "profiles").rglob("*.json"), *(root / "docs").rglob("*.json")]:
        strict_json(p.read_text(encoding="utf-8"))
    load_sweep(builtin_path("default"))
    toml = local_config(16).to_toml()
    assert ffiles.nesting(toml, "toml") <= MAX_NESTING
    floats = "x = [" + ", ".join(f"{i}.5" for i in range(10_000)) + "]\n"
    assert ffiles.nesting(floats, "toml") <= 2     # one dot per float, not a deep key


# -- numbers ---------------------------------------------------------------------------------
def test_an_overflowing_size_in_the_environment(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RKV_TIER_DRAM_CAPACITY_BYTES", "99999999999999999999999999GiB")
    assert main(["init", str(tmp_path / "s")]) == 2       # was an internal error (70)
    assert "RKV_TIER_DRAM_CAPACITY_BYTES" in one_line_error(capsys)
    assert not (tmp_path / "s").exists()
    monkeypatch.setenv("RKV_TIER_DRAM_CAPACITY_BYTES", "1" * 100_000)
    assert main(["init", str(tmp_path / "s")]) == 2
    assert "characters" in one_line_error(capsys)


def test_sizes_in_the_environment_are_exact() -> None:
    from rkv.store.envconfig import apply_env

    cfg = apply_env(None, {"RKV_TIER_NVME_MAP_BYTES": "4503599627370495"})  # 2^52 - 1
    assert cfg is not None and cfg.tier("nvme").map_bytes == 4503599627370495
    cfg = apply_env(None, {"RKV_TIER_DRAM_CAPACITY_BYTES": "0.5KiB"})
    assert cfg is not None and cfg.tier("dram").capacity_bytes == 512
    with pytest.raises(ConfigError, match="not a whole number"):  # float: 1024 exactly
        apply_env(None, {"RKV_TIER_DRAM_CAPACITY_BYTES": "1.0000000000000000001KiB"})
    with pytest.raises(ConfigError, match="map_bytes"):
        apply_env(None, {"RKV_TIER_NVME_MAP_BYTES": "9999TiB"})


def test_config_sizes_have_maxima() -> None:
    from rkv.store.config import MAX_TIER_BYTES, TierConfig

    TierConfig("t", capacity_bytes=MAX_TIER_BYTES)
    with pytest.raises(ConfigError, match="capacity_bytes"):
        TierConfig("t", capacity_bytes=MAX_TIER_BYTES + 1)
    with pytest.raises(ConfigError, match="capacity_bytes"):
        TierConfig("t", capacity_bytes=10**30)


@pytest.mark.parametrize("cap", ["1e400", "1e400GiB", "99999999999999999999TiB", "1e999%"])
def test_an_overflowing_replay_capacity(tmp_path: Path, cap: str,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"timestamp": 0, "input_length": 1024,
                                 "hash_ids": [1, 2]}) + "\n")
    assert main(["replay", str(trace), "--policy", "lru", "--capacity", cap]) == 2
    assert "capacity" in one_line_error(capsys)


# -- traces ----------------------------------------------------------------------------------
def _moe_trace(path: Path, layers: int, experts: int, tokens: int = 2) -> Path:
    head = {"format": "rkv-moe-trace", "version": 1, "model": "m", "fingerprint": "ab",
            "layers": layers, "experts": experts, "top_k": 1, "expert_bytes": 100}
    lines = [json.dumps(head)] + [json.dumps({"t": t, "layers": [[(t + j) % 3]
                                                                  for j in range(layers)]})
                                  for t in range(tokens)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_moe_header_declaring_absurd_counts(tmp_path: Path) -> None:
    from rkv.moe.trace import read_moe_trace

    for field, value in (("experts", 10**12), ("layers", 10**9), ("expert_bytes", 10**18)):
        p = _moe_trace(tmp_path / "t.jsonl", 2, 8)
        head, *rest = p.read_text().splitlines()
        h = json.loads(head)
        h[field] = value
        p.write_text("\n".join([json.dumps(h), *rest]) + "\n")
        with pytest.raises(InputError, match=field):
            read_moe_trace(p)
    assert_usage_error(rkv("replay", "--moe", str(_big_header(tmp_path))), "experts")


def _big_header(tmp_path: Path) -> Path:
    p = _moe_trace(tmp_path / "big.jsonl", 2, 8)
    head, *rest = p.read_text().splitlines()
    h = json.loads(head)
    h["experts"] = 10**12
    p.write_text("\n".join([json.dumps(h), *rest]) + "\n")
    return p


def test_the_moe_replay_does_not_allocate_per_declared_expert(tmp_path: Path) -> None:
    """A short trace under a header of 16 layers x 65536 experts: memory follows the
    experts the trace uses, not the 10^6 it declares."""
    import tracemalloc

    from rkv.moe.replay import read_trace, simulate

    trace = read_trace(_moe_trace(tmp_path / "t.jsonl", 16, 1 << 16, tokens=20))
    tracemalloc.start()
    try:
        for prefetch in ("none", "cooccur", "queue"):
            simulate(trace, "lru", 8, prefetch=prefetch)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 30 << 20, f"peak {peak >> 20} MiB"


class _Counting:
    """Wraps ``protected``: counts the keys a policy steps over."""

    steps = 0

    def __init__(self, inner: Container[Hashable]) -> None:
        self.inner = inner

    def __contains__(self, key: object) -> bool:
        _Counting.steps += 1
        return key in self.inner


def _counting_lru(capacity: int) -> object:
    from policies.lru import LRU

    class CountingLRU(LRU):
        def victims(self, need: int, protected: Container[Hashable] = ()
                    ) -> list[Hashable] | None:
            return super().victims(need, _Counting(protected))

    return CountingLRU(capacity)


def _one_request(n: int) -> object:
    from rkv.eval.replay.simulate import prepare
    from rkv.format.traces import Request

    return prepare([Request(0.0, 512 * n, tuple(range(n)))])


@pytest.mark.parametrize("tiers", [False, True])
def test_a_long_request_replays_in_linear_time(tiers: bool) -> None:
    """One request of n blocks into a cache of n/2 (or tiers of n/4 and n/4): every block
    past the cache's size finds everything protected. Asking the policy again for each of
    them walked the whole cache: n^2 / 4 steps."""
    from rkv.eval.replay.simulate import CostModel, simulate
    from rkv.eval.replay.tiers import Tier, simulate_tiers

    bb = CostModel().block_bytes
    steps = {}
    for n in (2000, 8000):
        trace = _one_request(n)
        _Counting.steps = 0
        if tiers:
            ts = [Tier(name, _counting_lru(n // 4 * bb), n // 4 * bb)  # type: ignore[arg-type]
                  for name in ("a", "b")]
            r = simulate_tiers(trace, ts)  # type: ignore[arg-type]
        else:
            r = simulate(trace, _counting_lru(n // 2 * bb), n // 2 * bb)  # type: ignore[arg-type]
        assert r.hits == 0
        steps[n] = _Counting.steps
        assert steps[n] <= 4 * n, steps
    assert steps[8000] <= 8 * steps[2000], steps       # linear: 4x the blocks, ~4x steps


def test_a_request_of_200k_hash_ids_through_the_cli(tmp_path: Path) -> None:
    n = 200_000
    trace = tmp_path / "long.jsonl"
    trace.write_text(json.dumps({"timestamp": 0, "input_length": 512 * n,
                                 "hash_ids": list(range(n))}) + "\n")
    for extra in ([], ["--tiers", "dram=10%,cxl=20%"]):
        p = rkv("replay", str(trace), "--policy", "lru", "--capacity", "0.5", "-q", *extra)
        assert p.returncode == 0, p.stderr[-2000:]


def test_an_endless_moe_trace_line(tmp_path: Path) -> None:
    from rkv.inputs import MAX_LINE_BYTES
    from rkv.moe.trace import read_moe_trace

    p = tmp_path / "long.jsonl"
    p.write_bytes(b" " * (MAX_LINE_BYTES + 10))
    with pytest.raises(InputError, match="line longer than 16 MiB"):
        read_moe_trace(p)


# -- scrub -----------------------------------------------------------------------------------
def test_scrub_once_on_an_empty_store_computes_no_schedule(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import rkv.store.scrub

    asked: list[object] = []

    def counting(engine: object, tiers: object = None) -> dict[str, dict[str, object]]:
        asked.append(tiers)
        return {}

    monkeypatch.setattr(rkv.store.scrub, "tier_schedules", counting)
    path = tmp_path / "s"
    with Engine.open(path, local_config(16)):
        pass
    assert main(["scrub", str(path), "--once", "-q"]) == 0, capsys.readouterr().err
    assert asked == []
    with Engine.open(path, local_config(16)) as e:     # blocks in one tier: only its schedule
        e.put(list(range(40)), random_kv(SMALL, 40), model=SMALL)
        tiers_used = {b.tier for b in e.block_ages()}
    assert main(["scrub", str(path), "--once", "-q"]) == 0, capsys.readouterr().err
    assert sorted(t for ts in asked for t in ts) == sorted(tiers_used)  # type: ignore[attr-defined]


# -- sweeps ----------------------------------------------------------------------------------
def test_a_sweep_of_millions_of_cells_is_refused(tmp_path: Path) -> None:
    from rkv.eval.sweep.spec import MAX_CELLS, load_sweep

    p = tmp_path / "huge.toml"
    p.write_text("[sweep]\nname = 'huge'\nseeds = [" + ", ".join(map(str, range(300)))
                 + "]\n[axes]\nhours = [" + ", ".join(f"{h}.0" for h in range(1, 401))
                 + "]\n")
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match=f"at most {MAX_CELLS}"):
        load_sweep(p)
    assert time.perf_counter() - t0 < 20


def test_plan_tokens_have_a_maximum(capsys: pytest.CaptureFixture[str]) -> None:
    t0 = time.perf_counter()
    assert main(["plan", "--tokens", str(10**12)]) == 2     # was minutes per 10^6 tokens
    assert "--tokens" in one_line_error(capsys)
    assert time.perf_counter() - t0 < 20


def test_a_secret_file_is_bounded_and_never_blocks(tmp_path: Path) -> None:
    """A remote tier's password or MAC key file: /dev/zero, a FIFO with no writer, a large
    file are one-line ConfigErrors at once, and the message never shows the content."""
    import os

    from rkv.errors import ConfigError
    from rkv.tiers.remote_config import read_secret

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    big = tmp_path / "big"
    big.write_text("s3cret" * 20_000)
    for path in ("/dev/zero", str(fifo), str(big), str(tmp_path)):
        with pytest.raises(ConfigError) as info:
            read_secret(f"file:{path}", "tier shared password")
        assert "s3cret" not in str(info.value)
    ok = tmp_path / "ok"
    ok.write_text("  hunter2\n")
    assert read_secret(f"file:{ok}", "tier shared password") == "hunter2"
