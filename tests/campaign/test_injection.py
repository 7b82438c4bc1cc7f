"""The fault-injecting tier: persistent and transient corruption with ground truth."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from rkvtest import SMALL, local_config, random_kv

import faultmodels
from faultmodels import ErrorPattern
from rkv import Engine
from rkv.format.keys import as_token_array, block_key, chunk_keys
from rkv.tiers.faulty import FaultyTier


def setup(path: Path) -> tuple[Engine, FaultyTier, list[int], np.ndarray, bytes]:
    e = Engine.open(path, local_config(16, repair=False))
    t = list(range(16))
    kv = random_kv(SMALL, 16)
    e.put(t, kv, model=SMALL)
    tier = e.wrap_tier("dram", lambda inner: FaultyTier(inner, seed=3))
    assert isinstance(tier, FaultyTier)
    key = block_key(chunk_keys(as_token_array(t), SMALL.fingerprint(), 16)[0], 1)
    return e, tier, t, kv, key


def test_persistent_injection_changes_the_store(tmp_path: Path) -> None:
    e, tier, t, _, key = setup(tmp_path / "s")
    before = tier.inner.get(key) or b""
    flips = np.array([8 * 300 + 2, 8 * 301], dtype=np.int64)
    inj = tier.inject(key, ErrorPattern(nbytes=len(before), flips=flips))
    after = tier.inner.get(key) or b""
    diff = np.flatnonzero(np.frombuffer(before, np.uint8) != np.frombuffer(after, np.uint8))
    assert diff.tolist() == [300, 301] and tier.log == [inj]
    got = e.get(t, model=SMALL)
    assert got.counts["uncorrectable"] == 1 and got.n_tokens == 0      # no ECC on this tier
    assert e.get(t, model=SMALL).counts["uncorrectable"] == 1          # it stays broken
    e.close()


def test_transient_injection_corrupts_one_read(tmp_path: Path) -> None:
    e, tier, t, kv, key = setup(tmp_path / "s")
    stored = tier.inner.get(key)
    n = len(stored or b"")
    tier.inject_transient(key, ErrorPattern(nbytes=n, flips=np.array([8 * 300]),
                                            transient=True))
    assert e.get(t, model=SMALL).counts["uncorrectable"] == 1
    assert tier.inner.get(key) == stored                               # the store is intact
    again = e.get(t, model=SMALL)
    assert again.ok and np.array_equal(again.kv, kv)
    assert [i.transient for i in tier.log] == [True]
    e.close()


def test_transient_hook_from_a_model_is_reproducible(tmp_path: Path) -> None:
    def run(path: Path) -> list[int]:
        model = faultmodels.get_model({"model": "raw-ber", "ber": 1e-3})
        rng = np.random.default_rng(42)
        e = Engine.open(path, local_config(16, repair=False))
        t = list(range(16))
        e.put(t, random_kv(SMALL, 16), model=SMALL)
        tier = e.wrap_tier("dram", lambda inner: FaultyTier(
            inner, seed=1, transient=lambda key, n: model.sample(n, 1.0, rng)))
        assert isinstance(tier, FaultyTier)
        outcomes = [e.get(t, model=SMALL).counts["uncorrectable"] for _ in range(5)]
        flips = [int(i.flips.size) for i in tier.log]
        e.close()
        return outcomes + flips

    assert run(tmp_path / "a") == run(tmp_path / "b")


def test_lost_record_reads_as_missing(tmp_path: Path) -> None:
    e, tier, t, _, key = setup(tmp_path / "s")
    n = len(tier.inner.get(key) or b"")
    tier.inject(key, ErrorPattern(nbytes=n, lost=True))
    got = e.get(t, model=SMALL)
    assert got.n_tokens == 0 and got.counts["missing"] == 1
    e.put(list(range(16, 32)), random_kv(SMALL, 16), model=SMALL)  # other writes still work
    e.close()
