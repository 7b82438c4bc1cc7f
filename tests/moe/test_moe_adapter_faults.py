"""rkv.adapters.moe under damage: corrected within the code's capability (exact weights),
beyond it a copy, the low-bit copy (flagged, counted) or a typed error; never wrong weights."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from moe_adapter_helpers import assert_same, low_bit, make_layers, tiers

from faultmodels import ErrorPattern
from rkv.adapters.moe import ApproximateExpert, ExpertLoadError, RkvExperts
from rkv.errors import ChecksumError, MissingRecordError
from rkv.format.record import framing_sizes
from rkv.store.config import TierConfig
from rkv.tiers.faulty import FaultyTier
from rkv.tiers.wrapper import unwrap

LAYERS = make_layers(2, 3, 5, 8, np.float16, seed=7)


def flips(nbytes: int, bits: list[int]) -> ErrorPattern:
    return ErrorPattern(nbytes, flips=np.array(sorted(set(bits)), dtype=np.int64))


def payload_start(p: RkvExperts, tier: str, key: bytes) -> int:
    from rkv.format.record import decode_record

    rec = p.tiers[tier].get(key)
    assert rec is not None
    return framing_sizes(decode_record(rec).header)[0]


def faulty(p: RkvExperts, *names: str) -> dict[str, FaultyTier]:
    out = {}
    for n in names:
        t = p.wrap_tier(n, lambda inner: FaultyTier(inner, seed=1))
        assert isinstance(t, FaultyTier)
        out[n] = t
    return out


@pytest.fixture
def store(tmp_path: Path) -> Iterator[RkvExperts]:
    """Primaries in cxl (rs(255,239): 8 bad bytes per codeword), backups in nvme, a 4-bit
    copy in cxl; no device cache, so every call reads the tiers."""
    cfgs = (TierConfig("cxl", medium="memory", capacity_bytes=1 << 30, ecc="rs(255,239)"),
            TierConfig("nvme", capacity_bytes=1 << 30, ecc="shardrs(k=4,m=2)"))
    with RkvExperts.create(tmp_path / "s", LAYERS, fingerprint="m", tiers=cfgs,
                           device_budget_bytes=0, backup_tier="nvme", low_bit_copy=4) as p:
        yield p


def test_flips_within_capability_are_corrected_and_repaired(store: RkvExperts) -> None:
    t = faulty(store, "cxl")["cxl"]
    key = store.record_key(0, 1)
    start = payload_start(store, "cxl", key)
    n = len(store.tiers["cxl"].get(key) or b"")
    t.inject(key, flips(n, [8 * (start + i) + i % 8 for i in range(0, 40, 5)]))  # 8 bytes
    assert_same(store.experts(0, [1])[1], LAYERS[0][1])
    s = store.stats()
    assert s["corrected"] == 1 and s["repaired"] == 1 and s["uncorrectable"] == 0
    assert_same(store.experts(0, [1])[1], LAYERS[0][1])      # the rewritten record is clean
    assert store.stats()["corrected"] == 1


def test_header_copy_damage_is_outvoted(store: RkvExperts) -> None:
    t = faulty(store, "cxl")["cxl"]
    key = store.record_key(1, 2)
    n = len(store.tiers["cxl"].get(key) or b"")
    t.inject(key, flips(n, list(range(16 * 8, 40 * 8, 3))))   # inside header copy 0
    assert_same(store.experts(1, [2])[2], LAYERS[1][2])
    assert store.stats()["uncorrectable"] == 0


def test_beyond_capability_reloads_from_the_copy_and_heals(
        store: RkvExperts, caplog: pytest.LogCaptureFixture) -> None:
    t = faulty(store, "cxl")["cxl"]
    key = store.record_key(0, 2)
    n = len(store.tiers["cxl"].get(key) or b"")
    start = payload_start(store, "cxl", key)
    t.inject(key, flips(n, [8 * (start + i) for i in range(40)]))   # 40 bytes in a row
    with caplog.at_level(logging.WARNING, logger="rkv.moe"):
        assert_same(store.experts(0, [2])[2], LAYERS[0][2])
    assert "unreadable" in caplog.text
    s = store.stats()
    assert s["uncorrectable"] == 1 and s["reloaded_from_copy"] == 1 and s["repaired"] == 1
    assert sum(s["errors"].values()) == 1 and s["approximate"] == 0
    assert_same(store.experts(0, [2])[2], LAYERS[0][2])     # healed: read from cxl again
    assert store.stats()["uncorrectable"] == 1
    assert store.stats()["tiers"]["nvme"]["reads"] == 1


def test_low_bit_copy_when_every_exact_copy_is_lost(store: RkvExperts) -> None:
    ts = faulty(store, "cxl", "nvme")
    for name in ("cxl", "nvme"):
        ts[name].inject(store.record_key(1, 0), ErrorPattern(8, lost=True))
    w = store.experts(1, [0])[0]
    assert isinstance(w, ApproximateExpert) and w.bits == 4 and w.reason == "loss"
    assert_same(w, low_bit(LAYERS[1][0], 4))
    s = store.stats()
    assert s["approximate"] == 1 and s["errors"] == {"MissingRecordError": 2}
    ts["cxl"].inject(store.record_key(1, 0, low=True), ErrorPattern(8, lost=True))
    with pytest.raises(ExpertLoadError) as exc:
        store.experts(1, [0])
    assert exc.value.layer == 1 and exc.value.expert == 0
    assert [type(e) for _, e in exc.value.errors] == [MissingRecordError] * 3


def test_no_copy_no_low_bit_is_a_typed_error(tmp_path: Path) -> None:
    with RkvExperts.create(tmp_path / "s", LAYERS, fingerprint="m", tiers=tiers(),
                           device_budget_bytes=1 << 20) as p:
        t = faulty(p, "dram")["dram"]
        key = p.record_key(0, 0)
        n = len(p.tiers["dram"].get(key) or b"")
        t.inject(key, flips(n, [8 * payload_start(p, "dram", key) + 3]))   # no ECC: 1 flip
        with pytest.raises(ExpertLoadError) as exc:
            p.experts(0, [0, 1])
        assert isinstance(exc.value.errors[0][1], ChecksumError)
        assert p.stats()["errors"] == {"ChecksumError": 1}
        assert (0, 0) not in p.cache.entries
        p.hint(0, [0])                                   # a failing prefetch is counted
        assert p.stats()["prefetch"]["failed"] == 1


def test_erasures_reported_by_the_medium_are_decoded(store: RkvExperts) -> None:
    t = faulty(store, "cxl")["cxl"]
    key = store.record_key(1, 1)
    n = len(store.tiers["cxl"].get(key) or b"")
    start = payload_start(store, "cxl", key)
    t.inject(key, ErrorPattern(n, erasures=((start + 4, 14, "sector"),)))
    assert_same(store.experts(1, [1])[1], LAYERS[1][1])
    assert store.stats()["corrected"] == 1 and store.stats()["uncorrectable"] == 0


def test_low_bit_on_miss_serves_approximate_then_exact(tmp_path: Path) -> None:
    with RkvExperts.create(tmp_path / "s", LAYERS, fingerprint="m", tiers=tiers(),
                           device_budget_bytes=1 << 20, low_bit_copy=8,
                           low_bit_on_miss=True) as p:
        w = p.experts(0, [2])[2]
        assert isinstance(w, ApproximateExpert) and w.reason == "miss" and w.bits == 8
        assert_same(w, low_bit(LAYERS[0][2], 8))
        p.settle()
        assert_same(p.experts(0, [2])[2], LAYERS[0][2])
        s = p.stats()
        assert s["approximate"] == 1 and s["hits"] == 1 and s["prefetch"]["used"] == 1


# -- random damage: exact, flagged low-bit, or a typed error; never wrong weights -------------
damage = st.one_of(st.none(), st.just("lost"),
                   st.lists(st.integers(0, 1 << 20), min_size=1, max_size=60))


@settings(max_examples=60)
@given(layer=st.integers(0, 1), expert=st.integers(0, 2), primary=damage, backup=damage,
       low=damage)
def test_random_damage_never_returns_wrong_weights(tmp_path_factory: pytest.TempPathFactory,
                                                   layer: int, expert: int, primary: object,
                                                   backup: object, low: object) -> None:
    p = _shared(tmp_path_factory)
    inner = {n: unwrap(t) for n, t in p.tiers.items()}
    for name, t in inner.items():
        p.tiers[name] = FaultyTier(t, seed=3)
    targets = [("cxl", p.record_key(layer, expert), primary),
               ("nvme", p.record_key(layer, expert), backup),
               ("cxl", p.record_key(layer, expert, low=True), low)]
    for tier, key, dmg in targets:
        ft = p.tiers[tier]
        assert isinstance(ft, FaultyTier)
        n = len(inner[tier].get(key) or b"")
        if dmg == "lost":
            ft.inject_transient(key, ErrorPattern(n, lost=True))
        elif isinstance(dmg, list):
            ft.inject_transient(key, flips(n, [b % (8 * n) for b in dmg]))
    try:
        w = p.experts(layer, [expert])[expert]
    except ExpertLoadError:
        assert primary is not None and backup is not None and low is not None
        return
    if isinstance(w, ApproximateExpert):
        assert primary is not None and backup is not None
        assert_same(w, low_bit(LAYERS[layer][expert], 4))
    else:
        assert_same(w, LAYERS[layer][expert])
    if primary is None:
        assert not isinstance(w, ApproximateExpert)


_STORES: dict[str, RkvExperts] = {}


def _shared(factory: pytest.TempPathFactory) -> RkvExperts:
    if "s" not in _STORES:
        cfgs = (TierConfig("cxl", medium="memory", capacity_bytes=1 << 30, ecc="rs(255,239)"),
                TierConfig("nvme", capacity_bytes=1 << 30, ecc="shardrs(k=4,m=2)"))
        _STORES["s"] = RkvExperts.create(factory.mktemp("moe") / "s", LAYERS, fingerprint="m",
                                         tiers=cfgs, device_budget_bytes=0,
                                         backup_tier="nvme", low_bit_copy=4, repair=False)
    return _STORES["s"]


@settings(max_examples=40)
@given(layer=st.integers(0, 1), expert=st.integers(0, 2),
       hits=st.lists(st.tuples(st.integers(0, 254), st.integers(1, 255)), min_size=1,
                     max_size=8, unique_by=lambda t: t[0]))
def test_random_damage_within_capability_is_exact(tmp_path_factory: pytest.TempPathFactory,
                                                  layer: int, expert: int,
                                                  hits: list[tuple[int, int]]) -> None:
    """Up to 8 damaged bytes in one RS(255,239) codeword: always corrected, exactly."""
    p = _shared(tmp_path_factory)
    inner = {n: unwrap(t) for n, t in p.tiers.items()}
    ft = FaultyTier(inner["cxl"], seed=5)
    p.tiers["cxl"] = ft
    key = p.record_key(layer, expert)
    n = len(inner["cxl"].get(key) or b"")
    start = payload_start(p, "cxl", key)
    bits = [8 * (start + off) + b for off, mask in hits for b in range(8) if mask >> b & 1]
    before = p.stats()
    ft.inject_transient(key, flips(n, bits))
    assert_same(p.experts(layer, [expert])[expert], LAYERS[layer][expert])
    after = p.stats()
    assert after["corrected"] == before["corrected"] + 1
    assert after["uncorrectable"] == before["uncorrectable"]


def test_readonly_open_reads_but_never_writes(tmp_path: Path) -> None:
    cfgs = (TierConfig("cxl", medium="memory", capacity_bytes=1 << 30, ecc="rs(255,239)"),)
    RkvExperts.create(tmp_path / "s", LAYERS, fingerprint="m", tiers=cfgs,
                      device_budget_bytes=0).close()
    with RkvExperts.open(tmp_path / "s", device_budget_bytes=0, readonly=True) as p:
        t = p.wrap_tier("cxl", lambda inner: FaultyTier(inner))
        assert isinstance(t, FaultyTier)
        key = p.record_key(0, 0)
        n = len(p.tiers["cxl"].get(key) or b"")
        t.inject_transient(key, flips(n, [8 * payload_start(p, "cxl", key) + 1]))
        assert_same(p.experts(0, [0])[0], LAYERS[0][0])
        s = p.stats()
        assert s["corrected"] == 1 and s["repaired"] == 0 and s["repairs_failed"] == 0
