"""The pipeline computes its own sizes: they match the records the encoder writes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rkv.codec.blockcodec import encode_block
from rkv.codec.pipeline import Pipeline
from rkv.ecc import get_codec
from rkv.format.dtypes import numpy_dtype
from rkv.format.record import RecordHeader, decode_record

QUANTS = ["none", "fp16", "16", "kivi(bits=8)", "kivi(bits=4)", "kivi(bits=2)"]
ECCS = ["none", "rs(255,239)", "rs(255,223,interleave=8)", "bch(m=13,t=8)",
        "shardrs(k=8,m=2)", "xxh3"]


@settings(max_examples=60, deadline=None)
@given(quant=st.sampled_from(QUANTS), ecc=st.sampled_from(ECCS),
       tokens=st.integers(1, 80), heads=st.integers(1, 3), dim=st.sampled_from([8, 32, 64]),
       dtype=st.sampled_from(["float16", "float32", "bfloat16"]))
def test_sizes_match_the_encoded_record(quant: str, ecc: str, tokens: int, heads: int,
                                        dim: int, dtype: str) -> None:
    shape = (2, tokens, heads, dim)
    p = Pipeline.parse(quant, ecc).for_block(shape, dtype)
    rng = np.random.default_rng(tokens)
    data = rng.standard_normal(shape).astype(numpy_dtype(dtype))
    header = RecordHeader(key=bytes(32), layer=3, fingerprint=bytes(16), shape=shape,
                          dtype=dtype, data_len=0, payload_len=0)
    rec = bytes(encode_block(header, data, p.codec, quant=p.quant))
    assert p.record_bytes(shape, dtype) == len(rec)
    dec = decode_record(rec)
    assert p.framing(dec.header.data_len)[0] == dec.header_bytes
    assert p.spread(dec.header.data_len) == dec.header.spread
    assert p.record_bytes_for(dec.header.data_len) == len(rec)
    assert p.data_bytes(shape, dtype) == dec.header.data_len
    assert p.payload_bytes(shape, dtype) == dec.header.payload_len
    assert p.configs() == dec.header.codecs


def test_one_spelling_of_no_stage() -> None:
    plain = Pipeline()
    for q in ("none", "fp16", "16", " NONE "):
        for e in ("none", "None"):
            assert Pipeline.parse(q, e) == plain
    assert Pipeline(None, get_codec("none")) == plain
    assert plain.bits == 16 and plain.spec == "none + none" and plain.configs() == ()
    p = Pipeline.parse("kivi(bits=4)", "rs(255,239)")
    assert p.bits == 4 and "rs" in p.spec and len(p.configs()) == 2
    assert hash(p) == hash(Pipeline.parse("kivi(bits=4)", "rs(255,239)"))


def test_quantizer_dropped_when_it_would_not_shrink() -> None:
    p = Pipeline.parse("kivi(bits=4)", "none")
    assert p.for_block((2, 1, 1, 8), "float16").quant is None      # one-token tail
    assert p.for_block((2, 256, 3, 64), "float16").quant is not None


def test_bad_specs_are_config_errors() -> None:
    from rkv import ConfigError

    with pytest.raises(ConfigError):
        Pipeline.parse("kivi(bits=3)", "none")
    with pytest.raises(ConfigError):
        Pipeline.parse("none", "rs(255,300)")


def test_campaign_predicts_the_record_it_stores() -> None:
    """A quantized campaign's prediction is for the record the engine really writes (the
    header lists the quantizer too)."""
    from rkv.eval.faults.bench import _Bench
    from rkv.eval.faults.campaign import CampaignConfig
    from rkv.reliability.analytic import predict

    cfg = CampaignConfig(protection="rs(255,239)", bits=4, trials=1, blocks=2,
                         chunk_tokens=64, kv_heads=1)
    pred = predict(cfg.protection_pipeline(), cfg.data_bytes, cfg.model(), cfg.hours)
    import tempfile
    from pathlib import Path

    bench = _Bench(cfg, Path(tempfile.mkdtemp()))
    try:
        row = bench.run(0, 1, conditional=True)
    finally:
        bench.close()
    assert {f["bytes"] for f in row.faults} == {pred.record_bytes}
