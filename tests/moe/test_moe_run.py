"""``rkv moe run`` (rkv.cli.moe_run) on a tiny random Llama-style model: experts streamed from an
rkv store generate exactly the tokens resident experts do (any budget, 16 bits); CLI errors
exit 2 with a message; a damaged expert record is corrected, or served from the low-bit copy
and flagged, never silently wrong."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from moe_adapter_helpers import tiers  # noqa: E402
from test_moe_model import VOCAB, calib, tiny_model  # noqa: E402

from faultmodels import ErrorPattern  # noqa: E402
from rkv.cli import main  # noqa: E402
from rkv.cli import moe_run as runmod  # noqa: E402
from rkv.errors import ConfigError, StoreError  # noqa: E402
from rkv.moe.experts import ResidentExperts  # noqa: E402
from rkv.moe.model import MoEModel  # noqa: E402
from rkv.store.config import TierConfig  # noqa: E402
from rkv.tiers.faulty import FaultyTier  # noqa: E402

PROMPT = [5, 17, 3, 88, 42, 42, 7, 0, 63, 11]
N = 12


@pytest.fixture(scope="module")
def moe(tmp_path_factory: pytest.TempPathFactory) -> MoEModel:
    return MoEModel.build(tiny_model(), 4, 2, cache_dir=tmp_path_factory.mktemp("fit"),
                          calibration=calib())


def fp16(moe: MoEModel) -> list[list[Any]]:
    return runmod.cast_experts(moe.experts, "float16")


def resident_tokens(moe: MoEModel) -> list[int]:
    moe.set_provider(ResidentExperts(fp16(moe)))
    try:
        return runmod.greedy(moe, PROMPT, N).tokens
    finally:
        moe.set_provider(None)


def streamed(moe: MoEModel, path: Path, *, budget: float, policy: str = "lru",
             per_layer: bool = False, prefetch: str = "none", bits: int = 16,
             low_bit_copy: int | None = None, tier_cfgs: Any = None,
             damage: Callable[[Any], None] | None = None) -> tuple[list[int], dict[str, Any]]:
    layers = fp16(moe)
    spec = runmod.StoreSpec(path, runmod.store_fingerprint(moe.fingerprint, "float16"), bits,
                            low_bit_copy, tier_cfgs or tiers())
    kw = runmod.open_options(int(budget * runmod.expert_bytes(layers)), policy, per_layer,
                             prefetch)
    with runmod.open_store(spec, lambda: layers, **kw) as p:
        if damage is not None:
            damage(p)
        moe.set_provider(p)
        moe.set_hint(runmod.PREFETCH[prefetch][2])
        try:
            g = runmod.greedy(moe, PROMPT, N, provider=p)
        finally:
            moe.set_provider(None)
        p.settle()
        g.stats_end = p.stats()
    return g.tokens, runmod.summary(g)


def test_full_budget_streamed_equals_resident(moe: MoEModel, tmp_path: Path) -> None:
    want = resident_tokens(moe)
    assert len(want) == N
    got, s = streamed(moe, tmp_path / "s", budget=1.0)
    assert got == want
    assert s["hit_ratio"] == 1.0 and s["bytes_per_token"] == 0 and s["approximate"] == 0
    got, s = streamed(moe, tmp_path / "s", budget=1.0, prefetch="hints")   # reopened
    assert got == want


@pytest.mark.parametrize("budget", [0.0, 0.1, 0.25, 0.5])
@pytest.mark.parametrize("policy,per_layer,prefetch", [
    ("lru", True, "none"), ("lru", True, "hints"), ("activation", False, "hints-sync"),
    ("lfu", False, "cooccur")])
def test_small_budgets_give_the_same_tokens(moe: MoEModel, tmp_path: Path, budget: float,
                                            policy: str, per_layer: bool,
                                            prefetch: str) -> None:
    got, s = streamed(moe, tmp_path / "s", budget=budget, policy=policy,
                      per_layer=per_layer, prefetch=prefetch)
    assert got == resident_tokens(moe)
    assert s["approximate"] == 0 and s["uncorrectable"] == 0
    if budget == 0.0:
        assert s["hit_ratio"] == 0.0 and s["bytes_per_token"] > 0


def test_low_bits_are_served_as_stored(moe: MoEModel, tmp_path: Path) -> None:
    got, s = streamed(moe, tmp_path / "s4", budget=1.0, bits=4)
    assert len(got) == N and s["approximate"] == 0       # 4-bit by choice, not flagged
    with pytest.raises(StoreError, match="bits"):        # same path, other bits
        streamed(moe, tmp_path / "s4", budget=1.0, bits=16)


def test_correctable_damage_is_corrected_exactly(moe: MoEModel, tmp_path: Path) -> None:
    cfgs = (TierConfig("cxl", medium="memory", capacity_bytes=1 << 30, ecc="rs(255,239)"),)

    def damage(p: Any) -> None:
        t = p.wrap_tier("cxl", lambda inner: FaultyTier(inner, seed=1))
        for layer in range(len(p.infos)):
            key = p.record_key(layer, 0)
            n = len(t.get(key) or b"")
            t.inject(key, ErrorPattern(n, flips=np.array([8 * 200 + 3, 8 * 900 + 5])))

    got, s = streamed(moe, tmp_path / "s", budget=0.0, tier_cfgs=cfgs, damage=damage)
    assert got == resident_tokens(moe)
    assert s["corrected"] >= 1 and s["uncorrectable"] == 0 and s["approximate"] == 0


def test_lost_record_is_served_low_bit_and_flagged(moe: MoEModel, tmp_path: Path) -> None:
    lost: list[tuple[int, int]] = []

    def damage(p: Any) -> None:
        t = p.wrap_tier("dram", lambda inner: FaultyTier(inner, seed=1))
        for layer in range(len(p.infos)):
            for e in range(len(p.infos[layer])):
                if p.info(layer, e).tier == "dram":
                    t.inject(p.record_key(layer, e), ErrorPattern(8, lost=True))
                    lost.append((layer, e))

    got, s = streamed(moe, tmp_path / "s", budget=0.0, low_bit_copy=8, damage=damage)
    assert lost and len(got) == N
    assert s["approximate"] > 0 and s["errors"] == {"MissingRecordError": s["uncorrectable"]}


def test_lost_record_without_copy_is_a_typed_error(moe: MoEModel, tmp_path: Path) -> None:
    from rkv.adapters.moe import ExpertLoadError

    def damage(p: Any) -> None:
        t = p.wrap_tier("dram", lambda inner: FaultyTier(inner, seed=1))
        t.inject(p.record_key(0, 0), ErrorPattern(8, lost=True))
        t.inject(p.record_key(0, 1), ErrorPattern(8, lost=True))

    with pytest.raises(ExpertLoadError):
        streamed(moe, tmp_path / "s", budget=0.0, damage=damage)


# -- the command line ----------------------------------------------------------------------------
class Tok:
    """A tokenizer stub: characters to ids."""

    eos_token_id = None
    chat_template = None

    def __call__(self, text: str, add_special_tokens: bool = True) -> Any:
        return SimpleNamespace(input_ids=[ord(c) % VOCAB for c in text][:24])

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return " ".join(str(i) for i in ids)


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Callable[..., int]:
    seeds = {"seed": 0}

    def load(args: argparse.Namespace, log: Callable[[str], None]) -> tuple[Any, Any]:
        m = MoEModel.build(tiny_model(seeds["seed"]), args.experts, args.top_k,
                           cache_dir=tmp_path / "fit", calibration=calib())
        return m, Tok()

    monkeypatch.setattr(runmod, "load_model", load)

    def run(*argv: str, seed: int = 0) -> int:
        seeds["seed"] = seed
        return main(["moe", "run", "--experts", "4", "--quiet", *argv])

    return run


def test_cli_runs_and_compares(cli: Callable[..., int], tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    store, out = str(tmp_path / "st"), tmp_path / "r.json"
    assert cli("--store", store, "--tokens", "6", "--resident", "--json", str(out)) == 0
    text = capsys.readouterr().out
    assert "tokens/s" in text and "tokens identical: yes" in text and "hit ratio" in text
    res = json.loads(out.read_text())
    assert res["identical"] and res["streamed"]["tokens"] == 6
    assert cli("--store", store, "--existing", "--tokens", "3", "--budget", "0",
               "--prefetch", "none", "--policy", "activation", "--per-layer") == 0


@pytest.mark.parametrize("argv,msg", [
    (["--budget", "lots"], "--budget"),
    (["--budget", "150%"], "--budget"),
    (["--top-k", "5"], "--top-k"),
    (["--tokens", "0"], "--tokens"),
    (["--policy", "nosuch"], "--policy"),
    (["--low-bit-on-miss"], "--low-bit-copy"),
    (["--existing", "--store", "/nonexistent/rkv-store"], "no rkv expert store"),
])
def test_cli_errors_exit_2(cli: Callable[..., int], capsys: pytest.CaptureFixture[str],
                           argv: list[str], msg: str) -> None:
    assert cli(*argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("rkv: error:") and msg in err and "Traceback" not in err


def test_cli_incompatible_store_exits_2(cli: Callable[..., int], tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    store = str(tmp_path / "st")
    assert cli("--store", store, "--tokens", "2") == 0
    capsys.readouterr()
    assert cli("--store", store, "--tokens", "2", seed=1) == 2          # another model
    assert "another model" in capsys.readouterr().err
    assert cli("--store", store, "--tokens", "2", "--bits", "8") == 2   # other bits
    assert "bits" in capsys.readouterr().err
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "f").write_text("x")
    assert cli("--store", str(junk), "--tokens", "2") == 2
    assert "not an expert store" in capsys.readouterr().err


def test_budget_parsing() -> None:
    assert runmod.budget_bytes("25%", 1000) == 250
    assert runmod.budget_bytes("0.5", 1000) == 500
    assert runmod.budget_bytes("1KiB", 10) == 1024
    assert runmod.budget_bytes("0", 10) == 0
    with pytest.raises(ConfigError):
        runmod.budget_bytes("-3", 10)


def test_cli_plans_experts_from_the_placement_table(
        cli: Callable[..., int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A [placement] table in --config plans every expert (with a profile measured on the
    tiny model), --replan re-places them after generating, and the store reopens."""
    import rkv.moe.profile as profmod

    measured: list[int] = []

    def profile_for(moe: MoEModel, tok: Any, cache_dir: Any = None, log: Any = None) -> Any:
        measured.append(1)
        return profmod.measure_expert_profile(moe, calib(2, 24))

    monkeypatch.setattr(profmod, "profile_for", profile_for)
    cfg = tmp_path / "engine.toml"
    # Two codes, not the default seven: each (tier, bits, code) the planner weighs costs a
    # few seconds of judged fault patterns, and what is tested here is the CLI's plumbing.
    cfg.write_text('[placement]\nquality_budget_kl = 0.5\nmax_p_due = 0.01\n'
                   'codes = ["none", "rs(255,239)"]\n')
    store, out = tmp_path / "st", tmp_path / "r.json"
    assert cli("--store", str(store), "--tokens", "4", "--config", str(cfg), "--replan",
               "--json", str(out)) == 0
    res = json.loads(out.read_text())
    assert measured and res["placement"]["quality_budget_kl"] == 0.5
    assert res["replan"]["steps"] > 0 and res["replan"]["unreadable"] == 0
    body = json.loads(json.loads((store / "moe.json").read_text())["body"])
    assert body["plan"]["kl"] <= 0.5 and body["plan"]["kl_budget"] == 0.5
    assert {x["ecc"] for layer in body["layers"] for x in layer} <= {"none", "rs(255,239)"}
    assert cli("--store", str(store), "--existing", "--tokens", "2", "--config",
               str(cfg)) == 0
