"""rkv.adapters.moe: experts as rkv records behind a policy-run device cache (equivalence with
the resident provider, the record layout, policies, prefetch, placement, bits)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from moe_adapter_helpers import assert_same, make_layers, tiers

import rkv.store.decisions
from policies import make_admission, make_policy, make_prefetch
from rkv.adapters.moe import ApproximateExpert, RkvExperts
from rkv.errors import (
    ConfigError,
    CorruptStoreError,
    InputError,
    RecordMismatchError,
    StoreError,
    TierFullError,
)
from rkv.format.record import decode_record
from rkv.moe import cache as moe_cache
from rkv.moe.experts import ExpertProvider, ResidentExperts
from rkv.moe.store import expert_key, model_fingerprint, pack
from rkv.quant import RowQuantizer


@pytest.mark.parametrize(("n", "d", "dtype"), [(5, 8, np.float16), (6, 7, np.float32),
                                               (1, 3, np.float16), (4, 16, np.float32)])
def test_all_cached_equals_resident_bitwise(tmp_path: Path, n: int, d: int,
                                            dtype: type) -> None:
    layers = make_layers(3, 4, n, d, dtype, seed=n * d)
    ref = ResidentExperts(layers)
    with RkvExperts.create(tmp_path / "s", layers, fingerprint="m", tiers=tiers(),
                           device_budget_bytes=10**9) as p:
        assert isinstance(p, ExpertProvider)
        for _ in range(2):                        # misses, then hits
            for layer in range(3):
                ids = [3, 0, 2]
                got = p.experts(layer, ids)
                assert list(got) == ids
                for e in ids:
                    assert_same(got[e], ref.experts(layer, [e])[e])
        s = p.stats()
        assert (s["misses"], s["hits"], s["loads"]) == (9, 9, 9)
        assert s["cache"]["entries"] == 9 and s["approximate"] == 0
    with RkvExperts.open(tmp_path / "s", device_budget_bytes=0, fingerprint="m") as p:
        for layer in range(3):
            got = p.experts(layer, range(4))
            for e in range(4):
                assert_same(got[e], layers[layer][e])
        assert p.stats()["cache"]["entries"] == 0 and p.stats()["cache"]["refused"] == 12


def test_record_layout(tmp_path: Path) -> None:
    layers = make_layers(2, 2, 5, 8, np.float16)
    fp = model_fingerprint("m")
    with RkvExperts.create(tmp_path / "s", layers, fingerprint="m", tiers=tiers(),
                           device_budget_bytes=0) as p:
        rec = p.tiers["dram"].get(p.record_key(1, 1))
        assert rec is not None
        dec = decode_record(rec, expect_key=expert_key(fp, 1, 1), expect_layer=1,
                            expect_fingerprint=fp)
        h = dec.header
        assert h.shape == (2, 8, 1, 8) and h.dtype == "float16" and h.codecs == ()
        rows = np.frombuffer(dec.payload, np.float16).reshape(16, 8)
        w = layers[1][1]
        assert np.array_equal(rows[:5], w.gate) and np.array_equal(rows[5:10], w.up)
        assert np.array_equal(rows[10:15], w.down.T) and not rows[15].any()
        assert np.array_equal(pack(w).reshape(16, 8), rows)
        assert p.record_key(1, 1) == expert_key(fp, 1, 1) + (1).to_bytes(2, "big")
        assert expert_key(fp, 1, 1) != expert_key(fp, 1, 1, 1) != expert_key(fp, 0, 1)


def test_same_policy_classes_as_the_engine(tmp_path: Path) -> None:
    assert moe_cache.make_policy is rkv.store.decisions.make_policy
    assert moe_cache.make_admission is rkv.store.decisions.make_admission
    layers = make_layers(2, 3, 4, 8, np.float16)
    with RkvExperts.create(tmp_path / "s", layers, fingerprint="m", tiers=tiers(),
                           device_budget_bytes=10**6, eviction="s3fifo(small=0.2)",
                           per_layer=True, admission="after(n=2)", prefetch="shallow") as p:
        for layer in (0, 1):
            assert type(p.cache.policy(layer)) is type(make_policy("s3fifo", 10))
        assert p.cache.policy(0) is not p.cache.policy(1)
        assert type(p.cache.admission) is type(make_admission("after(n=2)"))
        assert type(p.prefetcher) is type(make_prefetch("shallow"))


def test_eviction_within_the_budget(tmp_path: Path) -> None:
    layers = make_layers(1, 4, 4, 8, np.float16)
    size = layers[0][0].nbytes
    with RkvExperts.create(tmp_path / "s", layers, fingerprint="m", tiers=tiers(),
                           device_budget_bytes=2 * size) as p:
        for ids in ([0], [1], [0], [2], [1], [0]):
            got = p.experts(0, ids)
            assert_same(got[ids[0]], layers[0][ids[0]])
            assert p.cache.used <= 2 * size
        s = p.stats()
        # LRU with room for 2: 0 1 0(hit) 2(evicts 1) 1(evicts 0) 0(evicts 2)
        assert (s["hits"], s["misses"], s["cache"]["evictions"]) == (1, 5, 3)
        # Experts of one call are protected: three at once in a cache of two.
        got = p.experts(0, [1, 2, 3])
        assert all(np.array_equal(got[e].gate, layers[0][e].gate) for e in (1, 2, 3))
        assert p.cache.used <= 2 * size


def test_admission_after_two_sightings(tmp_path: Path) -> None:
    layers = make_layers(1, 3, 4, 8, np.float16)
    size = layers[0][0].nbytes
    with RkvExperts.create(tmp_path / "s", layers, fingerprint="m", tiers=tiers(),
                           device_budget_bytes=size, admission="after(n=2)") as p:
        p.experts(0, [0])                  # room: admitted
        p.experts(0, [1])                  # full, first sighting: refused
        assert (0, 0) in p.cache.entries and (0, 1) not in p.cache.entries
        p.experts(0, [1])                  # second sighting: admitted, 0 evicted
        assert (0, 1) in p.cache.entries and (0, 0) not in p.cache.entries
        assert p.stats()["cache"]["refused"] == 1


@pytest.mark.parametrize("mode", ["sync", "background"])
def test_prefetch_hints(tmp_path: Path, mode: str) -> None:
    layers = make_layers(2, 4, 4, 8, np.float16)
    with RkvExperts.create(tmp_path / "s", layers, fingerprint="m", tiers=tiers(),
                           device_budget_bytes=10**6, prefetch="queue",
                           prefetch_mode=mode) as p:
        p.experts(0, [0, 1])
        p.hint(1, [2, 3])
        p.settle()
        got = p.experts(1, [2, 3])
        assert_same(got[2], layers[1][2])
        s = p.stats()
        assert s["prefetch"]["issued"] == 2 and s["prefetch"]["used"] == 2
        assert s["hits"] == 2
        p.hint(1, [2, 3, 99, -1])          # cached or unknown: nothing to do
        p.hint(7, [0])                     # no such layer: ignored
        assert p.stats()["prefetch"]["issued"] == 2


def test_background_prefetch_never_blocks_correctness(tmp_path: Path) -> None:
    layers = make_layers(2, 6, 8, 16, np.float32)
    with RkvExperts.create(tmp_path / "s", layers, fingerprint="m", tiers=tiers(),
                           device_budget_bytes=10**6, prefetch_mode="background") as p:
        for _ in range(20):
            p.hint(1, range(6))
            got = p.experts(1, [5, 0, 3])          # races the worker: waits or loads
            for e in (5, 0, 3):
                assert_same(got[e], layers[1][e])
            p.settle()
            p.cache.clear()                        # (the worker is idle now)
        s = p.stats()["prefetch"]
        assert s["issued"] >= 6 and s["failed"] == 0 and s["in_flight"] == 0


def test_lookahead_offers_the_next_layer(tmp_path: Path) -> None:
    layers = make_layers(3, 4, 4, 8, np.float16)
    with RkvExperts.create(tmp_path / "s", layers, fingerprint="m", tiers=tiers(),
                           device_budget_bytes=10**6, lookahead=True) as p:
        p.experts(0, [0])
        assert all((1, e) in p.cache.entries for e in range(4))
        p.experts(1, [2])
        assert p.stats()["prefetch"]["used"] == 1


def test_placement_by_capacity_and_usage(tmp_path: Path) -> None:
    layers = make_layers(2, 4, 4, 8, np.float16)
    rec = tiers()[0]
    probe = RkvExperts.create(tmp_path / "probe", layers, fingerprint="m", tiers=tiers(),
                              device_budget_bytes=0)
    size = probe.info(0, 0).record_bytes
    probe.close()
    small = (
        type(rec)("dram", capacity_bytes=3 * size),
        type(rec)("cxl", capacity_bytes=2 * size + 10, ecc="rs(255,239)"),
        type(rec)("nvme", capacity_bytes=1 << 30, ecc="shardrs(k=4,m=2)"),
    )
    usage = {(1, 3): 9.0, (0, 2): 8.0, (1, 0): 7.0, (0, 0): 6.0}
    with RkvExperts.create(tmp_path / "s", layers, fingerprint="m", tiers=small,
                           device_budget_bytes=0, usage=usage) as p:
        where = {(li, e): p.info(li, e).tier for li in range(2) for e in range(4)}
        assert [k for k, t in where.items() if t == "dram"] == [(0, 2), (1, 0), (1, 3)]
        assert sum(t == "cxl" for t in where.values()) <= 1   # rs records are larger
        for li in range(2):
            got = p.experts(li, range(4))
            for e in range(4):
                assert_same(got[e], layers[li][e])
        assert sum(v.get("reads", 0) for v in p.stats()["tiers"].values()) == 8
        assert p.stats()["tiers"]["nvme"]["bytes_read"] > 0
    tiny = tuple(type(rec)(t.name, capacity_bytes=size) for t in small)
    with pytest.raises(TierFullError):
        RkvExperts.create(tmp_path / "t", layers, fingerprint="m", tiers=tiny,
                          device_budget_bytes=0)


def test_fewer_bits_per_expert(tmp_path: Path) -> None:
    layers = make_layers(1, 3, 6, 16, np.float16)
    bits = {(0, 1): 8, (0, 2): 4}
    with RkvExperts.create(tmp_path / "s", layers, fingerprint="m", tiers=tiers(),
                           device_budget_bytes=10**6, bits=bits) as p:
        got = p.experts(0, [0, 1, 2])
        assert_same(got[0], layers[0][0])
        assert p.info(0, 2).record_bytes < p.info(0, 1).record_bytes < p.info(0, 0).record_bytes
        for e, b in bits.items():
            q = RowQuantizer(b)
            block = pack(layers[0][e[1]])
            want = q.decode(q.encode(block), block.shape, "float16").reshape(-1, 16)
            w = got[e[1]]
            assert not isinstance(w, ApproximateExpert)    # the configured precision
            assert np.array_equal(w.gate, want[:6]) and np.array_equal(w.down, want[12:18].T)
    with pytest.raises(ConfigError):
        RkvExperts.create(tmp_path / "b", layers, fingerprint="m", tiers=tiers(),
                          device_budget_bytes=0, bits=3)


def test_errors_are_typed(tmp_path: Path) -> None:
    layers = make_layers(2, 2, 4, 8, np.float16)
    with pytest.raises(StoreError):
        RkvExperts.open(tmp_path / "none", device_budget_bytes=0)
    with RkvExperts.create(tmp_path / "s", layers, fingerprint="m", tiers=tiers(),
                           device_budget_bytes=0) as p:
        with pytest.raises(InputError):
            p.experts(2, [0])
        with pytest.raises(InputError):
            p.experts(0, [2])
    with pytest.raises(StoreError):
        RkvExperts.create(tmp_path / "s", layers, fingerprint="m", tiers=tiers(),
                          device_budget_bytes=0)
    with pytest.raises(RecordMismatchError):
        RkvExperts.open(tmp_path / "s", device_budget_bytes=0, fingerprint="other")
    for bad in ({"backup_tier": "tape"}, {"low_bit_copy": 2}, {"ecc": {"tape": "none"}},
                {"prefetch_mode": "eager"}):
        with pytest.raises(ConfigError):
            RkvExperts.create(tmp_path / f"x{time.monotonic_ns()}", layers, fingerprint="m",
                              tiers=tiers(), device_budget_bytes=0, **bad)  # type: ignore[arg-type]
    (tmp_path / "s" / "moe.json").write_text('{"body": "{}", "seal": "0"}')
    with pytest.raises(CorruptStoreError):
        RkvExperts.open(tmp_path / "s", device_budget_bytes=0)
