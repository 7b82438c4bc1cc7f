"""Quantized tiers through the engine: bounded error, ECC on top, never silently wrong."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from rkvtest import local_config, random_kv

from rkv import ConfigError, Engine, EngineConfig, ModelSpec
from rkv.codec.stages import header_stages
from rkv.format.keys import as_token_array, block_key, chunk_keys
from rkv.format.record import decode_record

SPEC = ModelSpec("test/quant", n_layers=2, n_kv_heads=2, head_dim=64, dtype="float16")


def quant_config(quant: str, ecc: str = "none", **kw: object) -> EngineConfig:
    cfg = local_config(16, **kw)
    return replace(cfg, tiers=tuple(replace(t, quant=quant, ecc=ecc) for t in cfg.tiers))


@pytest.mark.parametrize("bits", [8, 4, 2])
@pytest.mark.parametrize("ecc", ["none", "rs(255,239)"])
def test_quantized_round_trip(store_path: Path, bits: int, ecc: str) -> None:
    with Engine.open(store_path, quant_config(f"kivi(bits={bits})", ecc)) as e:
        t = list(range(40))
        kv = random_kv(SPEC, 40)
        put = e.put(t, kv, model=SPEC)
        assert put.bytes_written < kv.nbytes  # 16-token chunks: metadata is a large share
        got = e.get(t, model=SPEC)
        assert got.ok and got.kv.dtype == kv.dtype and got.kv.shape == kv.shape
        err = np.abs(got.kv.astype(np.float32) - kv.astype(np.float32))
        spread = float(kv.max() - kv.min())
        assert err.max() <= spread / (2**bits - 1) * 0.51 + 2e-3
        again = e.get(t, model=SPEC)                    # deterministic: same values back
        assert np.array_equal(again.kv, got.kv)
        key = block_key(chunk_keys(as_token_array(t), SPEC.fingerprint(), 16)[0], 0)
        quant, codec = header_stages(decode_record(e.tiers["dram"].get(key) or b"").header)
        assert quant is not None and quant.bits == bits
        assert (codec is None) == (ecc == "none")
        assert e.verify().clean


def test_quantized_block_with_ecc_corrects_damage(store_path: Path) -> None:
    with Engine.open(store_path, quant_config("kivi(bits=4)", "rs(255,223)")) as e:
        t = list(range(16))
        kv = random_kv(SPEC, 16)
        e.put(t, kv, model=SPEC)
        first = e.get(t, model=SPEC).kv.copy()
        key = block_key(chunk_keys(as_token_array(t), SPEC.fingerprint(), 16)[0], 1)
        rec = bytearray(e.tiers["dram"].get(key) or b"")
        start = decode_record(rec).header_bytes
        for off in (3, 200, 400):                    # metadata and codes alike
            rec[start + off] ^= 0xA5
        e.tiers["dram"].put(key, rec)
        got = e.get(t, model=SPEC)
        assert got.ok and got.counts["corrected"] == 1 and np.array_equal(got.kv, first)
        assert e.get(t, model=SPEC).counts["corrected"] == 0        # repaired in place


@pytest.mark.parametrize("ecc", ["none", "rs(255,251)"])
def test_quantized_damage_is_never_silently_wrong(store_path: Path, ecc: str) -> None:
    with Engine.open(store_path, quant_config("kivi(bits=2)", ecc, repair=False)) as e:
        t = list(range(16))
        kv = random_kv(SPEC, 16)
        e.put(t, kv, model=SPEC)
        clean = e.get(t, model=SPEC).kv.copy()
        key = block_key(chunk_keys(as_token_array(t), SPEC.fingerprint(), 16)[0], 0)
        orig = e.tiers["dram"].get(key) or b""
        rng = np.random.default_rng(0)
        for _ in range(40):
            rec = bytearray(orig)
            for pos in rng.integers(0, len(rec), int(rng.integers(1, 30))):
                rec[int(pos)] ^= int(rng.integers(1, 256))
            e.tiers["dram"].put(key, rec)
            got = e.get(t, model=SPEC)
            if got.n_tokens:
                assert np.array_equal(got.kv, clean)
            else:
                assert got.counts["uncorrectable"] == 1


def test_demotion_keeps_quantized_values(store_path: Path) -> None:
    base = quant_config("kivi(bits=4)")
    with Engine.open(store_path, base) as e0:
        one = e0.put(list(range(16)), random_kv(SPEC, 16), model=SPEC).bytes_written
        e0.clear()
    tiers = (replace(base.tiers[0], capacity_bytes=one),
             replace(base.tiers[1], ecc="rs(255,239)"), base.tiers[2])
    with Engine.open(store_path, replace(base, tiers=tiers)) as e:
        a, b = list(range(16)), list(range(100, 116))
        e.put(a, random_kv(SPEC, 16, 1), model=SPEC)
        before = e.get(a, model=SPEC).kv.copy()
        e.put(b, random_kv(SPEC, 16, 2), model=SPEC)       # demotes a to cxl (re-encoded)
        assert e.stats()["tiers"]["cxl"]["blocks"] == 2
        after = e.get(a, model=SPEC)
        assert after.ok and np.array_equal(after.kv, before)


@pytest.mark.parametrize("quant", ["kivi(bits=3)", "kivi(bits=4,group=0)", "turbo(bits=4)", ""])
def test_bad_quant_config(quant: str) -> None:
    with pytest.raises(ConfigError):
        quant_config(quant)


def test_short_tail_chunks_stay_unquantized(store_path: Path) -> None:
    with Engine.open(store_path, quant_config("kivi(bits=4)")) as e:
        t = list(range(17))                                  # one full chunk and a 1-token tail
        kv = random_kv(SPEC, 17)
        e.put(t, kv, model=SPEC)
        keys = chunk_keys(as_token_array(t), SPEC.fingerprint(), 16)
        full = decode_record(e.tiers["dram"].get(block_key(keys[0], 0)) or b"").header
        tail = decode_record(e.tiers["dram"].get(block_key(keys[1], 0)) or b"").header
        assert header_stages(full)[0] is not None and header_stages(tail)[0] is None
        got = e.get(t, model=SPEC)
        assert got.ok and np.array_equal(got.kv[:, :, 16:], kv[:, :, 16:])   # tail exact
