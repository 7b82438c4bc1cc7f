"""The engine driven by the policies: same decisions as the store-less replay, protection of
pins, prefixes and reads, consistency across reopen and processes, admission, prefetch and
promotion, and the format-2 migration."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rkvtest import SMALL, HeldTier, chunk_bytes, local_config, random_kv

from policies import make_policy
from policies.base import EvictionPolicy
from rkv import Engine, EngineConfig, TierConfig
from rkv.errors import ConfigError, TierFullError
from rkv.eval.replay.simulate import CostModel, prepare, simulate
from rkv.eval.replay.store import block_tokens, chunk_record_bytes, replay_on_store
from rkv.format.keys import as_token_array, chunk_keys
from rkv.format.traces import Request, read_trace
from rkv.store.decisions import RECOMPUTE_TPS

SHARED_TRACE = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces" / \
    "mooncake_synthetic_trace.jsonl"
UNIT = CostModel(block_bytes=1)


def toks(n: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(0, 50000, n).tolist()


def chain_requests(seed: int, n: int, roots: int = 4, depth: int = 6) -> list[Request]:
    """Random prefix-chained requests: block ids are tuples of choices (a trie), so equal ids
    always have equal prefixes, as in Mooncake's hash ids."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        length = int(rng.integers(1, depth + 1))
        path: tuple[int, ...] = ()
        blocks = []
        for j in range(length):
            path = (*path, int(rng.integers(0, roots if j == 0 else 2)))
            blocks.append(path)
        out.append(Request(0.0, 16 * length, tuple(blocks), block_tokens=16))
    return out


def both(requests: list[Request], policy: str, blocks: int, tmp: Path, lookahead: int = 0
         ) -> tuple[Any, Any, EvictionPolicy, EvictionPolicy]:
    from policies import make_admission, split_spec

    # Items must be the same to the bit: block bytes and miss cost as the engine sees them.
    cost = CostModel(block_bytes=chunk_record_bytes(), recompute_tps=RECOMPUTE_TPS)
    trace = prepare(requests, cost)
    evict, admit = split_spec(policy)
    cap = blocks * cost.block_bytes
    plain = make_policy(evict, cap)
    adm = None if admit == "all" else make_admission(admit)
    free = simulate(trace, plain, cap, cost, admission=adm, lookahead=lookahead)
    kept: list[EvictionPolicy] = []
    stored = replay_on_store(trace, tmp, policy, cap, cost, keep=kept, lookahead=lookahead)
    return free, stored, plain, kept[0]


def chunk_key_of(block_path: list[Any]) -> bytes:
    from rkv.eval.replay.store import REPLAY_MODEL

    t = np.concatenate([block_tokens(b) for b in block_path])
    return chunk_keys(as_token_array(t), REPLAY_MODEL.fingerprint(), 16)[-1]


@pytest.mark.parametrize("policy", ["lru", "prefix", "prefix+after(n=2)", "s3fifo"])
@pytest.mark.parametrize("blocks", [3, 8])
def test_engine_makes_the_same_decisions_as_the_storeless_replay(
        tmp_path: Path, policy: str, blocks: int) -> None:
    """The engine (real records in LMDB, the policy as its tier's policy) driven by get +
    put per request hits exactly where `rkv replay` without a store hits, and ends holding
    exactly the blocks the replay's policy holds."""
    reqs = chain_requests(seed=blocks, n=120)
    free, stored, plain, engine_policy = both(reqs, policy, blocks, tmp_path / "s")
    assert (stored.hits, stored.prefix_hit_tokens, stored.evictions) == \
        (free.hits, free.prefix_hit_tokens, free.evictions)
    assert free.hits > 0 and free.evictions > 0
    by_id = {b: r.blocks[: r.blocks.index(b) + 1] for r in reqs for b in r.blocks}
    assert {chunk_key_of(list(by_id[k])) for k in plain} == set(engine_policy)


@pytest.mark.parametrize("policy", ["lru", "prefix+after(n=2)"])
@pytest.mark.parametrize("lookahead", [1, 4])
def test_prefetch_holds_match_the_replay_look_ahead(tmp_path: Path, policy: str,
                                                    lookahead: int) -> None:
    """Announcing each request with Engine.prefetch when it joins a queue of N holds its
    chunks until its get: the same decisions as the store-less replay's look-ahead."""
    reqs = chain_requests(seed=lookahead, n=100)
    free, stored, plain, engine_policy = both(reqs, policy, 6, tmp_path / "s", lookahead)
    blind = simulate(prepare(reqs, UNIT), make_policy("lru", 6), 6, UNIT)
    assert (stored.hits, stored.prefix_hit_tokens, stored.evictions) == \
        (free.hits, free.prefix_hit_tokens, free.evictions)
    assert free.evictions > 0 and free.hits != blind.hits   # the holds changed something
    by_id = {b: r.blocks[: r.blocks.index(b) + 1] for r in reqs for b in r.blocks}
    assert {chunk_key_of(list(by_id[k])) for k in plain} == set(engine_policy)


@pytest.mark.skipif(not SHARED_TRACE.exists(), reason="shared Mooncake trace not present")
@pytest.mark.parametrize("policy", ["lru", "prefix"])
def test_engine_matches_replay_on_a_slice_of_the_mooncake_trace(tmp_path: Path,
                                                                  policy: str) -> None:
    reqs = list(read_trace(SHARED_TRACE, "mooncake", limit=150))
    blocks = max(4, prepare(reqs, UNIT).unique // 10)
    free, stored, _, _ = both(reqs, policy, blocks, tmp_path / "s")
    assert (stored.hits, stored.prefix_hit_tokens) == (free.hits, free.prefix_hit_tokens)
    assert free.hits > 0


def test_store_replay_refuses_a_used_directory(tmp_path: Path) -> None:
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "x").write_text("")
    with pytest.raises(ConfigError, match="not empty"):
        replay_on_store(prepare(chain_requests(0, 3), UNIT), tmp_path / "s", "lru", 2, UNIT)


# -- reopen, other processes --------------------------------------------------------------------
def one_tier(cap_chunks: int, policy: str = "lru", **kw: Any) -> EngineConfig:
    size = chunk_bytes()
    return EngineConfig(chunk_tokens=16, promote="never", tiers=(
        TierConfig("dram", medium="memory", path="t/dram", capacity_bytes=cap_chunks * size,
                   policy=policy),), **kw)


def order(e: Engine, tier: str = "dram") -> list[bytes]:
    """The policy's full eviction order (a side-effect-free query)."""
    pol = e.core.decisions.policies[tier]
    return list(pol.victims(pol.used, ()) or [])


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(0, 9), min_size=1, max_size=40))
def test_reopen_keeps_the_lru_order(tmp_path: Path, ops: list[int]) -> None:
    """Policy state is rebuilt from the index's access times at open: an LRU order after any
    sequence of puts and gets comes back exactly."""
    import shutil

    path = tmp_path / "s"
    shutil.rmtree(path, ignore_errors=True)
    seqs = [toks(16, seed=i) for i in range(10)]
    with Engine.open(path, one_tier(6)) as e:
        for op in ops:
            if op % 3 == 0:
                e.get(seqs[op], model=SMALL)
            else:
                e.put(seqs[op], random_kv(SMALL, 16, seed=op), model=SMALL)
        e.pin(seqs[0], model=SMALL)          # a mutation: applies the reads' hits
        e.unpin(seqs[0], model=SMALL)
        before = order(e)
    with Engine.open(path) as e:
        e.pin(seqs[0], model=SMALL)
        e.unpin(seqs[0], model=SMALL)
        assert order(e) == before


def test_a_write_by_another_engine_rebuilds_the_policies(tmp_path: Path) -> None:
    cfg = one_tier(3)
    a, b = Engine.open(tmp_path / "s", cfg), None
    try:
        b = Engine.open(tmp_path / "s", cfg)
        seqs = [toks(16, seed=i) for i in range(5)]
        a.put(seqs[0], random_kv(SMALL, 16, seed=0), model=SMALL)
        b.put(seqs[1], random_kv(SMALL, 16, seed=1), model=SMALL)
        a.put(seqs[2], random_kv(SMALL, 16, seed=2), model=SMALL)
        rebuilt = a.core.decisions.rebuilds
        b.put(seqs[3], random_kv(SMALL, 16, seed=3), model=SMALL)   # b evicts a's oldest
        a.put(seqs[4], random_kv(SMALL, 16, seed=4), model=SMALL)   # a sees b's write
        assert a.core.decisions.rebuilds == rebuilt + 1
        assert [a.lookup(s, model=SMALL) for s in seqs] == [0, 0, 16, 16, 16]
        assert len(a.core.decisions.policies["dram"]) == 3
    finally:
        a.close()
        if b is not None:
            b.close()


# -- what the policies must never take -----------------------------------------------------------
@pytest.mark.timeout(60)
def test_a_chunk_being_read_is_never_evicted(tmp_path: Path) -> None:
    """A get holds its chunks in flight: a put that needs room meanwhile evicts others
    (the window is held open deterministically, inside the read)."""
    from rkv.format.keys import block_key
    from rkv.format.model import as_model_spec

    with Engine.open(tmp_path / "s", one_tier(2)) as e:
        old, new = toks(16, seed=1), toks(16, seed=2)
        e.put(old, random_kv(SMALL, 16, seed=1), model=SMALL)
        e.put(new, random_kv(SMALL, 16, seed=2), model=SMALL)
        held = e.wrap_tier("dram", HeldTier)
        assert isinstance(held, HeldTier)
        key = chunk_keys(as_token_array(old), as_model_spec(SMALL).fingerprint(), 16)[0]
        held.armed = {block_key(key, 1)}
        out: dict[str, Any] = {}
        reader = threading.Thread(target=lambda: out.update(r=e.get(old, model=SMALL)))
        reader.start()
        assert held.reading.wait(30)
        third = toks(16, seed=3)
        put = e.put(third, random_kv(SMALL, 16, seed=3), model=SMALL)   # LRU victim: old
        assert put.evicted_chunks == 1
        held.release.set()
        reader.join(30)
        assert out["r"].n_tokens == 16
        assert np.array_equal(out["r"].kv, random_kv(SMALL, 16, seed=1))
        assert e.lookup(old, model=SMALL) == 16 and e.lookup(new, model=SMALL) == 0


def test_pins_and_the_put_in_progress_are_never_victims(tmp_path: Path) -> None:
    with Engine.open(tmp_path / "s", one_tier(3)) as e:
        a, b = toks(32, seed=1), toks(16, seed=2)
        e.put(a, random_kv(SMALL, 32, seed=1), model=SMALL)
        e.pin(a, model=SMALL)
        e.put(b, random_kv(SMALL, 16, seed=2), model=SMALL)
        long = toks(48, seed=3)     # 3 chunks: only b can go, so the tail does not fit
        res = e.put(long, random_kv(SMALL, 48, seed=3), model=SMALL)
        assert (res.chunks_written, res.chunks_refused, res.evicted_chunks) == (1, 2, 1)
        assert e.lookup(a, model=SMALL) == 32 and e.lookup(long, model=SMALL) == 16
        e.unpin(a, model=SMALL)
        res = e.put(long, random_kv(SMALL, 48, seed=3), model=SMALL)
        assert (res.chunks_written, res.chunks_deduped, res.chunks_refused) == (2, 1, 0)
        assert e.lookup(long, model=SMALL) == 48 and e.lookup(a, model=SMALL) == 0
        got = e.get(long, model=SMALL)
        assert np.array_equal(got.kv, random_kv(SMALL, 48, seed=3))
        assert e.verify().clean
    tiny = EngineConfig(chunk_tokens=16,
                        tiers=(TierConfig("d", path="t/d", capacity_bytes=100),))
    with Engine.open(tmp_path / "tiny", tiny) as e, \
            pytest.raises(TierFullError, match="larger than every"):
        e.put(toks(16, seed=4), random_kv(SMALL, 16, seed=4), model=SMALL)


def test_admission_refuses_a_first_sighting_when_full(tmp_path: Path) -> None:
    with Engine.open(tmp_path / "s", one_tier(2, "lru+after(n=2)")) as e:
        seqs = [toks(16, seed=i) for i in range(3)]
        for i in range(2):
            assert e.put(seqs[i], random_kv(SMALL, 16, seed=i), model=SMALL).chunks_written == 1
        first = e.put(seqs[2], random_kv(SMALL, 16, seed=2), model=SMALL)
        assert (first.chunks_written, first.chunks_refused) == (0, 1)
        assert e.lookup(seqs[2], model=SMALL) == 0
        second = e.put(seqs[2], random_kv(SMALL, 16, seed=2), model=SMALL)
        assert (second.chunks_written, second.evicted_chunks) == (1, 1)
        assert e.lookup(seqs[2], model=SMALL) == 16
        assert e.stats()["session"]["chunks_refused"] == 1


def test_admission_sends_a_refused_chunk_to_the_next_tier(tmp_path: Path) -> None:
    size = chunk_bytes()
    cfg = local_config(16, caps=(size, 4 * size, 4 * size), policy="lru+after(n=2)",
                       promote="never")
    with Engine.open(tmp_path / "s", cfg) as e:
        a, b = toks(16, seed=1), toks(16, seed=2)
        assert e.put(a, random_kv(SMALL, 16, seed=1), model=SMALL).tiers == {"dram": 1}
        assert e.put(b, random_kv(SMALL, 16, seed=2), model=SMALL).tiers == {"cxl": 1}


def test_bad_policy_specs_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="policy"):
        TierConfig("x", policy="nope")
    with pytest.raises(ConfigError, match="policy"):
        TierConfig("x", policy="lru(size=3)")
    with pytest.raises(ConfigError, match="promote"):
        EngineConfig(promote="sometimes")
    cfg = EngineConfig.from_toml('[[tiers]]\nname = "a"\npolicy = "s3fifo(small=0.2)"\n')
    assert cfg.tiers[0].policy == "s3fifo(small=0.2)"


# -- prefetch and promotion ----------------------------------------------------------------------
def three_tiers(tmp_path: Path, promote: str = "never") -> Engine:
    size = chunk_bytes()
    return Engine.open(tmp_path / "s", local_config(16, caps=(2 * size, 2 * size, 8 * size),
                                                    policy="lru", promote=promote))


def where(e: Engine, seq: list[int]) -> set[str]:
    from rkv.format.model import as_model_spec

    keys = chunk_keys(as_token_array(seq), as_model_spec(SMALL).fingerprint(), 16)
    with e.core.index.env.read() as txn:
        return {t for k in keys for t in (e.core.index.read_chunk(txn, k) or _none()).tiers()}


def _none() -> Any:
    class N:
        def tiers(self) -> set[str]:
            return set()
    return N()


def test_prefetch_promotes_a_prefix_to_the_top_tier(tmp_path: Path) -> None:
    with three_tiers(tmp_path) as e:
        seqs = [toks(16, seed=i) for i in range(5)]
        for i, s in enumerate(seqs):
            e.put(s, random_kv(SMALL, 16, seed=i), model=SMALL)
        assert where(e, seqs[0]) == {"nvme"}
        res = e.prefetch(seqs[0], model=SMALL).result(30)
        assert (res.tier, res.chunks, res.promoted, res.already, res.failed) == \
            ("dram", 1, 1, 0, 0)
        assert res.demoted_chunks >= 1
        assert where(e, seqs[0]) == {"dram"}
        again = e.prefetch(seqs[0], model=SMALL).result(30)
        assert (again.promoted, again.already) == (0, 1)
        got = e.get(seqs[0], model=SMALL)
        assert got.n_tokens == 16 and np.array_equal(got.kv, random_kv(SMALL, 16, seed=0))
        assert e.verify().clean
        mid = e.prefetch(seqs[1], model=SMALL, tier="cxl").result(30)
        assert mid.promoted == 1 and where(e, seqs[1]) == {"cxl"}
        with pytest.raises(ConfigError, match="no tier"):
            e.prefetch(seqs[0], model=SMALL, tier="hbm")


def test_reads_promote_on_the_second_hit(tmp_path: Path) -> None:
    with three_tiers(tmp_path, promote="after(n=2)") as e:
        seqs = [toks(16, seed=i) for i in range(5)]
        for i, s in enumerate(seqs):
            e.put(s, random_kv(SMALL, 16, seed=i), model=SMALL)

        def settle() -> None:
            e.settle(30)

        e.get(seqs[0], model=SMALL)
        settle()
        assert where(e, seqs[0]) == {"nvme"}
        e.get(seqs[0], model=SMALL)
        settle()
        assert where(e, seqs[0]) == {"dram"}
        assert e.stats()["session"]["promoted_chunks"] == 1
        assert all(e.get(s, model=SMALL).n_tokens == 16 for s in seqs)


# -- the format-2 store --------------------------------------------------------------------------
def test_format_2_store_is_migrated(tmp_path: Path) -> None:
    """A store written before the policies (index format 2, with LRU rows): read as it is
    when read-only; upgraded at the first writable open, its LRU rows gone, its chunks read
    back, its pin kept, and evictions chosen by the new policies."""
    import tarfile

    from rkv.cli import main

    with tarfile.open(Path(__file__).parent / "golden" / "store_v2.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    path = tmp_path / "store"
    seqs = [np.random.default_rng(s).integers(0, 30000, 40).tolist() for s in range(5)]
    with Engine.open(path, readonly=True) as e:
        assert e.core.index.format == 2
        assert [e.lookup(s, model=SMALL) for s in seqs] == [40] * 5
    assert main(["migrate", str(path)]) == 0
    with Engine.open(path) as e:
        assert e.core.index.format == 3 and e.migrated_from is None
        with e.core.index.env.read() as txn:
            assert txn.stat(e.core.index._lru)["entries"] == 0
        for i, s in enumerate(seqs):
            want = np.random.default_rng(i).standard_normal((3, 2, 40, 2, 4)).astype(np.float16)
            got = e.get(s, model=SMALL)
            assert got.n_tokens == 40 and np.array_equal(got.kv, want)
        assert e.stats()["pinned_chunks"] == 3
        for i in range(5, 40):
            t = toks(40, seed=i)
            e.put(t, random_kv(SMALL, 40, seed=i), model=SMALL)
        assert e.lookup(seqs[0], model=SMALL) == 40      # pinned
        assert e.verify().clean


def test_a_prefetch_hold_protects_until_the_get_or_expiry(tmp_path: Path) -> None:
    with Engine.open(tmp_path / "s", one_tier(2)) as e:
        a, b, c, d = (toks(16, seed=i) for i in range(4))
        e.put(a, random_kv(SMALL, 16, seed=0), model=SMALL)
        e.put(b, random_kv(SMALL, 16, seed=1), model=SMALL)
        e.prefetch(a, model=SMALL).result(30)           # a is queued: held
        e.put(c, random_kv(SMALL, 16, seed=2), model=SMALL)   # LRU would take a; takes b
        assert e.lookup(a, model=SMALL) == 16 and e.lookup(b, model=SMALL) == 0
        e.get(a, model=SMALL)                           # the request ran: hold released
        e.prefetch(c, model=SMALL, hold=5.0).result(30)
        e.core.decisions._expire(time.time() + 10)             # ... and this hold ran out
        e.put(d, random_kv(SMALL, 16, seed=3), model=SMALL)   # LRU order: c, a
        assert e.lookup(c, model=SMALL) == 0 and e.lookup(a, model=SMALL) == 16
        assert not e.core.decisions.queued


def test_cli_replay_through_a_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from rkv.cli import main

    trace = tmp_path / "t.jsonl"
    lines = [{"timestamp": i, "input_length": 512 * len(r.blocks), "output_length": 1,
              "hash_ids": [hash(b) % 10**6 for b in r.blocks]}
             for i, r in enumerate(chain_requests(3, 60))]
    trace.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / "r.json"
    assert main(["replay", str(trace), "--policy", "lru", "--capacity", "20%", "--lookahead",
                 "2", "--store", str(tmp_path / "runs"), "--json", str(out), "--quiet"]) == 0
    rows = {r["policy"]: r for r in json.loads(out.read_text())["results"]}
    assert rows["lru [store] +queue 2"]["hits"] == rows["lru +queue 2"]["hits"] > 0
    assert list((tmp_path / "runs").iterdir()) == []       # each run's store is destroyed
    capsys.readouterr()
    assert main(["replay", str(trace), "--store", str(tmp_path / "runs2"), "--tiers",
                 "dram=10%,nvme=50%"]) == 2
    assert "--store replays one tier" in capsys.readouterr().err


def test_prefetch_budget_moves_what_the_prefetch_policy_picks(tmp_path: Path) -> None:
    size = chunk_bytes()
    cfg = local_config(16, caps=(4 * size, 4 * size, 16 * size), policy="lru",
                       promote="never")
    with Engine.open(tmp_path / "s", cfg) as e:
        long = toks(64, seed=1)
        e.put(long, random_kv(SMALL, 64, seed=1), model=SMALL)
        for i in range(4):                          # push the 4 chunks of `long` to nvme
            e.put(toks(32, seed=10 + i), random_kv(SMALL, 32, seed=i), model=SMALL)
        assert where(e, long) == {"nvme"}
        res = e.prefetch(long, model=SMALL, budget=2 * size + size // 2).result(30)
        assert (res.chunks, res.promoted, res.skipped, res.already) == (4, 2, 2, 0)
        assert where(e, long[:32]) == {"dram"}      # queue order: the first two chunks
        assert e.get(long, model=SMALL).n_tokens == 64
    with pytest.raises(ConfigError, match="prefetch"):
        EngineConfig(prefetch="sideways")


def test_hits_waiting_for_a_mutation_stay_bounded(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Reads of one hot chunk, no writes: the hits the policies have not seen yet are
    applied by a mutation (the background worker's) once enough wait, not queued forever;
    the reads queue one such mutation at a time, not one each."""
    from rkv.store import decisions

    monkeypatch.setattr(decisions, "_REPORTED", 50)
    with Engine.open(tmp_path / "s", one_tier(4)) as e:
        t = toks(16, seed=1)
        e.put(t, random_kv(SMALL, 16, seed=1), model=SMALL)
        for _ in range(200):
            assert e.get(t, model=SMALL).n_tokens == 16
            e.settle(30)
            assert len(e.core.decisions._events) < 50


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 3), st.integers(0, 2)),
                min_size=1, max_size=12))
def test_reopen_keeps_the_lru_order_of_shared_prefixes(tmp_path: Path,
                                                       ops: list[tuple[int, int, int]]) -> None:
    """Puts stamp the entries they write with access times in key order and touch the
    stored chunks they reuse with the same sequence of times: after puts of sequences sharing
    prefixes (one at a time and batched) and gets, the LRU order comes back exactly."""
    import shutil

    path = tmp_path / "s"
    shutil.rmtree(path, ignore_errors=True)
    base = toks(48, seed=99)

    def seq(branch: int, chunks: int) -> list[int]:   # a shared prefix, then a branch
        return [*base[: 16 * (chunks - 1)], *toks(16, seed=branch)]

    with Engine.open(path, one_tier(7)) as e:
        for branch, chunks, kind in ops:
            t = seq(branch, chunks)
            if kind == 0:
                e.get(t, model=SMALL)
            elif kind == 1:
                e.put(t, random_kv(SMALL, len(t), seed=branch), model=SMALL)
            else:
                other = seq((branch + 1) % 4, 3)
                e.put_many([(t, random_kv(SMALL, len(t), seed=branch)),
                            (other, random_kv(SMALL, len(other), seed=branch + 1))],
                           model=SMALL)
        e.pin(base[:16], model=SMALL)        # a mutation: applies the reads' hits
        e.unpin(base[:16], model=SMALL)
        before = order(e)
    with Engine.open(path) as e:
        e.pin(base[:16], model=SMALL)
        e.unpin(base[:16], model=SMALL)
        assert order(e) == before
