"""Quality profiles (``rkv.profiles``): the forms a profile is made from, the measured
profile's file (schema, loader, the additive estimate), the shipped SmolLM2-135M profile
(weights 4-bit Q4_1), and the store loading it without the measurement code."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rkv.errors import ConfigError
from rkv.eval.calibrate import smollm2_spec
from rkv.profiles import (
    BITS,
    KINDS,
    MAX_PROFILE_BYTES,
    QualityProfile,
    load_profile,
    parse_profile,
    read_profile,
    validate_profile,
    write_profile,
)

SHIPPED = Path(__file__).resolve().parent.parent / "rkv" / "profiles" / "smollm2-135m.json"


def small_profile(n_layers: int = 2) -> dict[str, Any]:
    keys = [f"{i}:{k}:{b}" for i in range(n_layers) for k in KINDS for b in BITS]
    return {"model": "toy", "fingerprint": "0" * 32, "weights": "Q4_1", "windows": 3,
            "text": ["toy text"],
            "kl": {k: float(i + 1) / 100 for i, k in enumerate(keys)},
            "kl_se": {k: 0.001 for k in keys}, "ppl": {k: 20.0 for k in keys}}


@pytest.fixture(scope="module")
def shipped() -> QualityProfile:
    return load_profile("smollm2-135m")


# -- the forms a profile is made from --------------------------------------------------------
def test_profile_forms(tmp_path: Path) -> None:
    doc = {"model": "abc", "kl": {"3:k:4": 0.01, "3:v:4": 0.02}}
    path = tmp_path / "kl.json"
    path.write_text(json.dumps(doc))
    for prof in (QualityProfile.load(path), QualityProfile(doc),
                 QualityProfile({(3, "k", 4): 0.01, (3, "v", 4): 0.02}),
                 QualityProfile(lambda layer, kind, bits: 0.01 if kind == "k" else 0.02)):
        assert prof.kl(3, "k", 4) == 0.01 and prof.kl(3, "v", 16) == 0.0
        assert prof.kl(3, "kv", 4) == pytest.approx(0.03)
    assert QualityProfile.load(path).model == "abc"
    with pytest.raises(ConfigError, match="layer 5 K at 4 bits"):
        QualityProfile(doc).kl(5, "k", 4)
    with pytest.raises(ConfigError, match="bad key"):
        QualityProfile({"3:x:4": 0.1})
    with pytest.raises(ConfigError, match="finite number"):
        QualityProfile({"3:k:4": -0.1})



# -- the shipped profile ---------------------------------------------------------------------
def test_shipped_profile_covers_every_block(shipped: QualityProfile) -> None:
    raw = json.loads(SHIPPED.read_text())
    want = {f"{i}:{k}:{b}" for i in range(30) for k in ("k", "v") for b in (8, 4, 2)}
    assert set(raw["kl"]) == set(raw["kl_se"]) == set(raw["ppl"]) == want
    assert shipped.n_layers == 30 and shipped.weights == "Q4_1" and shipped.windows >= 8
    assert raw["fingerprint"] == smollm2_spec().fingerprint().hex() == shipped.fingerprint
    assert shipped.text and all(isinstance(t, str) for t in shipped.text)


def test_load_profile_by_name_fingerprint_spec_and_path(shipped: QualityProfile) -> None:
    spec = smollm2_spec()
    assert load_profile(spec.fingerprint().hex()) == shipped
    assert load_profile(spec.fingerprint()) == shipped
    assert load_profile(spec) == shipped
    assert load_profile(shipped.model) == shipped
    assert load_profile(SHIPPED) == shipped and load_profile(str(SHIPPED)) == shipped
    with pytest.raises(ConfigError, match="no quality profile"):
        load_profile("llama-70b")
    with pytest.raises(ConfigError, match="no quality profile"):
        load_profile(spec.__class__("other/model", n_layers=2, n_kv_heads=1, head_dim=8))
    with pytest.raises(ConfigError):
        load_profile(3)  # type: ignore[arg-type]


def test_shipped_profile_monotone_in_bits(shipped: QualityProfile) -> None:
    for kind in KINDS:
        m8, m4, m2 = (shipped.mean_kl(kind, b) for b in (8, 4, 2))
        assert 0 < m8 < m4 < m2, (kind, m8, m4, m2)
        # and by a margin, not by noise: each halving of the bits costs at least 4x
        assert m4 > 4 * m8 and m2 > 4 * m4
    assert shipped.meta["kl_floor"] < 1e-3 * shipped.mean_kl("v", 8)
    assert all(p > 1 for p in shipped.ppl.values())


# -- QualityProfile.kl and additive ----------------------------------------------------------
def test_kl_lookup_and_additive() -> None:
    p = validate_profile(small_profile())
    assert p.kl(0, "k", 8) == pytest.approx(0.01) and p.kl(1, "v", 2) == pytest.approx(0.12)
    assert p.kl(1, "k", 16) == 0.0 and p.se(1, "k", 16) == 0.0
    plan = {(0, "k"): 8, (0, "v"): 4, (1, "k"): 16, (1, "v"): 2}
    assert p.additive(plan) == pytest.approx(0.01 + 0.05 + 0.12)
    assert p.additive({}) == 0.0
    assert p.mean_kl("k", 8) == pytest.approx((0.01 + 0.07) / 2)
    assert p.ranked("k", 8)[0] == (1, pytest.approx(0.07))
    for bad in ({(2, "k"): 8}, {(0, "q"): 8}, {(0, "k"): 3}, {(0, "k"): True},
                {(-1, "k"): 8}, {0: 8}, {("0", "k"): 8}):
        with pytest.raises(ConfigError):
            p.additive(bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        p.additive([((0, "k"), 8)])  # type: ignore[arg-type]


def test_write_read_round_trip(tmp_path: Path) -> None:
    p = validate_profile({**small_profile(3), "ppl_ref": 20.0, "kl_floor": 0.0,
                          "prefix": 512, "quant": "kivi"})
    write_profile(p, tmp_path / "p.json")
    q = read_profile(tmp_path / "p.json")
    assert q == p and q.n_layers == 3 and q.meta["prefix"] == 512


# -- malformed and hostile profiles ----------------------------------------------------------
def _mut(f: Any) -> bytes:
    d = small_profile()
    f(d)
    return json.dumps(d).encode()


BAD: list[tuple[str, bytes, str]] = [
    ("not json", b"{'model': 1}", "not valid JSON"),
    ("pickle", pickle.dumps(small_profile()), "not valid JSON"),
    ("binary", b"\xff\xfe\x00garbage", "not valid JSON"),
    ("empty", b"", "not valid JSON"),
    ("list", b"[1, 2]", "JSON object"),
    ("nan", _mut(lambda d: d["kl"].__setitem__("0:k:8", "NAN")).replace(b'"NAN"', b"NaN"),
     "finite"),
    ("infinity", _mut(lambda d: d["ppl"].__setitem__("0:k:8", "INF")).replace(b'"INF"',
                                                                              b"Infinity"),
     "finite"),
    ("duplicate key", b'{"model": "a", "model": "b"}', "repeats"),
    ("missing field", _mut(lambda d: d.pop("kl_se")), "missing"),
    ("unknown field", _mut(lambda d: d.__setitem__("__reduce__", 1)), "unknown"),
    ("bool windows", _mut(lambda d: d.__setitem__("windows", True)), "windows"),
    ("zero windows", _mut(lambda d: d.__setitem__("windows", 0)), "windows"),
    ("string kl", _mut(lambda d: d["kl"].__setitem__("0:k:8", "0.1")), "number"),
    ("negative kl", _mut(lambda d: d["kl"].__setitem__("0:k:8", -0.5)), ">= 0"),
    ("zero ppl", _mut(lambda d: d["ppl"].__setitem__("0:k:8", 0)), "> 0"),
    ("bad key", _mut(lambda d: d["kl"].__setitem__("0:q:8", 0.1)), "is not"),
    ("bits 16 key", _mut(lambda d: d["kl"].__setitem__("0:k:16", 0.1)), "is not"),
    ("leading zero", _mut(lambda d: d["kl"].__setitem__("01:k:8", 0.1)), "is not"),
    ("missing block", _mut(lambda d: d["kl"].pop("1:v:2")), "every layer"),
    ("se keys differ", _mut(lambda d: d["kl_se"].pop("0:k:8")), "every layer"),
    ("layer gap", _mut(lambda d: [d[f].__setitem__("5:k:8", 1.0) for f in
                                  ("kl", "kl_se", "ppl")]), "every layer"),
    ("empty kl", _mut(lambda d: [d.__setitem__(f, {}) for f in ("kl", "kl_se", "ppl")]),
     "empty"),
    ("fingerprint", _mut(lambda d: d.__setitem__("fingerprint", "XYZ")), "hex"),
    ("fingerprint type", _mut(lambda d: d.__setitem__("fingerprint", 12)), "type"),
    ("text type", _mut(lambda d: d.__setitem__("text", [1])), "text"),
    ("empty model", _mut(lambda d: d.__setitem__("model", "")), "model"),
    ("nested", b"[" * 100_000 + b"]" * 100_000, "not valid JSON|JSON object"),
    ("huge", b" " * (MAX_PROFILE_BYTES + 1), "larger"),
    ("meta type", _mut(lambda d: d.__setitem__("prefix", "512")), "prefix"),
]


@pytest.mark.parametrize(("data", "msg"), [(d, m) for _, d, m in BAD],
                         ids=[n for n, _, _ in BAD])
def test_malformed_profile_is_a_config_error(data: bytes, msg: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=msg):
        parse_profile(data)
    path = tmp_path / "bad.json"
    path.write_bytes(data)
    with pytest.raises(ConfigError, match=r"bad\.json"):
        load_profile(path)


def test_unreadable_profile_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_profile(tmp_path / "absent.json")
    with pytest.raises(ConfigError, match="cannot read"):
        read_profile(tmp_path)




# -- one type for the planner and the file ---------------------------------------------------
def test_the_shipped_profile_as_the_planner_reads_it(shipped: QualityProfile) -> None:
    """QualityProfile.load reads only the KL table of the same file: every answer, of K, V
    and K+V blocks and of a degraded read, is the measured profile's."""
    table = QualityProfile.load(SHIPPED)
    assert table.model == shipped.model and table.n_layers == shipped.n_layers == 30
    assert not table.fingerprint and table.kl_mean == shipped.kl_mean
    for layer in range(30):
        for kind in ("k", "v", "kv"):
            for bits in (16, *BITS):
                assert table.kl(layer, kind, bits) == shipped.kl(layer, kind, bits)
            assert table.degraded_kl(layer, kind) == shipped.degraded_kl(layer, kind)
    assert shipped.kl(3, "kv", 4) == shipped.kl(3, "k", 4) + shipped.kl(3, "v", 4)
    assert QualityProfile(shipped) == shipped and QualityProfile(shipped).se(3, "k", 2) > 0
    with pytest.raises(ConfigError, match="no standard error"):
        table.se(3, "k", 2)


def test_the_shipped_profile_writes_back_byte_identical(shipped: QualityProfile,
                                                        tmp_path: Path) -> None:
    write_profile(shipped, tmp_path / "p.json")
    assert (tmp_path / "p.json").read_bytes() == SHIPPED.read_bytes()


def test_kl_arguments_are_checked() -> None:
    p = validate_profile(small_profile())
    assert p.kl(np.int64(1), "v", np.int64(2)) == pytest.approx(0.12)  # type: ignore[arg-type]
    for args in ((True, "k", 8), ("0", "k", 8), (-1, "k", 8), (0, "q", 8), (0, "k", 3),
                 (0, "k", True), (0, "k", "8"), (0, "k", 32)):
        with pytest.raises(ConfigError):
            p.kl(*args)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="kind"):
        p.se(0, "kv", 8)
    fn = QualityProfile(lambda layer, kind, bits: 0.5)
    assert fn.kl(0, "kv", 2) == 1.0 and fn.n_layers == 0
    with pytest.raises(ConfigError, match="no table of layers"):
        fn.mean_kl("k", 2)
    with pytest.raises(ConfigError, match="callable"):
        fn.to_dict()
    with pytest.raises(ConfigError, match="finite number"):
        QualityProfile(lambda layer, kind, bits: float("nan")).kl(0, "k", 2)


def test_a_table_profile_round_trips_its_document() -> None:
    doc = {"model": "abc", "kl": {"3:k:4": 0.01, "3:v:4": 0.02}}
    p = QualityProfile(doc)
    assert p.to_dict() == doc and QualityProfile(p.to_dict()) == p and p.n_layers == 4
    assert QualityProfile({(0, "K", 8): 0.1}).to_dict() == {"kl": {"0:k:8": 0.1}}
    with pytest.raises(ConfigError, match="fingerprint"):
        validate_profile(doc)


def test_the_store_loads_profiles_without_the_measurement_code() -> None:
    """The engine's placement finds a shipped profile (by name and by fingerprint) through
    rkv.profiles: nothing of rkv.eval is imported."""
    code = ("import sys\n"
            "from rkv.format.model import ModelSpec\n"
            "from rkv.placement.config import PlacementConfig\n"
            "from rkv.store.plans import load_profile\n"
            "named = load_profile(PlacementConfig.from_dict({'profile': 'smollm2-135m'}), None)\n"
            "spec = ModelSpec('HuggingFaceTB/SmolLM2-135M-Instruct@Q4_1', n_layers=30,\n"
            "                 n_kv_heads=3, head_dim=64, dtype='float32',\n"
            "                 layout='hf-dynamic-cache')\n"
            "found = load_profile(PlacementConfig(), spec)\n"
            "assert named is not None and named == found and named.fingerprint\n"
            "print(','.join(m for m in sys.modules if m.startswith('rkv.eval')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60).stdout.strip()
    assert out == "", f"the store's profile loader imported {out}"
    assert smollm2_spec().fingerprint().hex() == load_profile("smollm2-135m").fingerprint
