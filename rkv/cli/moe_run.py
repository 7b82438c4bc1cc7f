"""``rkv moe run``: generate text with the MoE model's experts streamed from an rkv store.

The MoE model (:mod:`rkv.moe.model`, built or loaded from its fit cache) gets its experts
from :class:`rkv.adapters.moe.RkvExperts`: every expert written once as a verified record
(``--bits`` 16, 8 or 4; optionally a ``--low-bit-copy``) into a store that is reused while
it matches the model, read through a device cache of ``--budget`` run by ``--policy``, with
speculative routing hints (``--prefetch hints``) offered to the prefetcher. Generation is
greedy with a KV cache (:func:`greedy`); the command prints the text, tokens/s and the
provider's counters (docs/moe.md, "End to end: ``rkv moe run``").

Stored experts are float16 (``--dtype``) whatever the model computes in: 16 bits is the
float16 copy, exact against :class:`ResidentExperts` of the same float16 experts.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import click
import numpy as np

from rkv.cli.moe import SUBCOMMANDS, model_options
from rkv.errors import ConfigError, InputError, RecordMismatchError, StoreError
from rkv.extras import require_torch
from rkv.moe.experts import ExpertWeights

logger = logging.getLogger(__name__)
DEFAULT_PROMPT = "Explain in three sentences why computers use a cache."
# --prefetch NAME -> (prefetch policy, prefetch_mode, model hints, lookahead)
PREFETCH: dict[str, tuple[str | None, str, bool, bool]] = {
    "none": (None, "off", False, False),
    "hints": ("queue", "background", True, False),
    "hints-sync": ("queue", "sync", True, False),
    "cooccur": ("cooccur", "background", False, True),
}
DTYPES = {"float16": np.float16, "float32": np.float32}


# -- experts and their store ---------------------------------------------------------------------
def cast_experts(layers: Sequence[Sequence[ExpertWeights]], dtype: str
                 ) -> list[list[ExpertWeights]]:
    """The experts as ``dtype`` (C-contiguous copies; unchanged arrays are shared)."""
    dt = DTYPES[dtype]

    def c(a: np.ndarray) -> np.ndarray:
        return a if a.dtype == dt else np.ascontiguousarray(a, dtype=dt)

    return [[ExpertWeights(c(w.gate), c(w.up), c(w.down)) for w in layer] for layer in layers]


def expert_bytes(layers: Sequence[Sequence[ExpertWeights]]) -> int:
    return sum(w.nbytes for layer in layers for w in layer)


def budget_bytes(text: str, total: int) -> int:
    """``--budget``: ``25%`` or ``0.25`` of all experts' (decoded) bytes, or bytes
    (``64MiB``); ``0`` caches nothing."""
    if str(text).strip() in ("0", "0%", "0B"):
        return 0
    from rkv.eval.replay.simulate import parse_capacity

    try:
        cap = parse_capacity(text)
    except ConfigError as exc:
        raise ConfigError(f"--budget: {exc}") from None
    if cap.fraction is not None:
        return round(cap.fraction * total)
    assert cap.nbytes is not None
    return int(cap.nbytes)


def store_fingerprint(model_fingerprint: str, dtype: str) -> str:
    """What a store of this model's experts is keyed by: the MoE model (weights, E, routers)
    and the stored dtype."""
    return hashlib.sha256(f"{model_fingerprint}|{dtype}".encode()).hexdigest()


def default_store(cache_dir: str | None, fingerprint: str, bits: int | str,
                  low_bit_copy: int | None) -> Path:
    from rkv.moe.fit import default_cache_dir

    base = Path(cache_dir) if cache_dir else default_cache_dir()
    return base / f"store-{fingerprint[:16]}-b{bits}-low{low_bit_copy or 0}"


@dataclass(frozen=True)
class StoreSpec:
    """How a store is written (the open options are given to :func:`open_store`)."""

    path: Path
    fingerprint: str
    bits: int = 16
    low_bit_copy: int | None = None
    tiers: tuple[Any, ...] | None = None          # TierConfig; None: the engine's defaults
    create: bool = True
    placement: dict[str, Any] | None = None       # a [placement] table: plan every expert
    profile: Any = None                           # () -> ExpertProfile, for a plan


def open_store(spec: StoreSpec, experts: Callable[[], Sequence[Sequence[ExpertWeights]]],
               *, log: Callable[[str], None] = lambda _m: None, **open_kw: Any) -> Any:
    """An :class:`RkvExperts` over ``spec.path``: opened when it holds this model's experts
    at these bits (and low-bit copy), else created (``experts()`` is called only then). A
    store of another model or other bits is a :class:`StoreError` (never overwritten)."""
    from rkv.adapters.moe import RkvExperts

    if (spec.path / "moe.json").exists():
        try:
            p = RkvExperts.open(spec.path, fingerprint=spec.fingerprint, **open_kw)
        except RecordMismatchError:
            raise StoreError(f"{spec.path} holds the experts of another model, E or dtype; "
                             "use another --store or delete it") from None
        bits = {i.bits for layer in p.infos for i in layer}
        if (not spec.placement and bits != {spec.bits}) or (spec.low_bit_copy is not None
                                   and p.low_bit_copy != spec.low_bit_copy):
            p.close()
            raise StoreError(f"{spec.path} holds experts at {sorted(bits)} bits with low-bit "
                             f"copy {p.low_bit_copy}, not {spec.bits} bits with "
                             f"{spec.low_bit_copy}; use another --store or delete it")
        log(f"opened expert store {spec.path}")
        return p
    if not spec.create:
        raise StoreError(f"no rkv expert store at {spec.path}")
    if spec.path.exists() and any(spec.path.iterdir()):
        raise StoreError(f"{spec.path} exists and is not an expert store")
    layers = experts()
    log(f"writing {sum(len(la) for la in layers)} experts ({expert_bytes(layers) / 2**20:.0f} "
        f"MiB, {spec.bits} bits{f', {spec.low_bit_copy}-bit copy' if spec.low_bit_copy else ''})"
        f" to {spec.path} ...")
    t0 = time.perf_counter()
    plan_kw: dict[str, Any] = ({"placement": spec.placement,
                                "profile": spec.profile() if spec.profile else None}
                               if spec.placement else {})
    p = RkvExperts.create(spec.path, layers, fingerprint=spec.fingerprint, tiers=spec.tiers,
                          bits=spec.bits, low_bit_copy=spec.low_bit_copy, **plan_kw, **open_kw)
    log(f"store written in {time.perf_counter() - t0:.1f} s")
    return p


def open_options(budget: int, policy: str, per_layer: bool, prefetch: str,
                 low_bit_on_miss: bool = False) -> dict[str, Any]:
    """RkvExperts open options for a ``--prefetch`` name."""
    if prefetch not in PREFETCH:
        raise ConfigError(f"--prefetch must be one of {', '.join(PREFETCH)}, got {prefetch!r}")
    pf, mode, _, lookahead = PREFETCH[prefetch]
    return {"device_budget_bytes": budget, "eviction": policy, "per_layer": per_layer,
            "prefetch": pf, "prefetch_mode": mode, "lookahead": lookahead,
            "low_bit_on_miss": low_bit_on_miss}


# -- generation ----------------------------------------------------------------------------------
@dataclass
class Generation:
    """Greedy tokens and their timing; ``stats``: the provider's counters after the prompt
    and at the end (None for a provider without ``stats()``)."""

    tokens: list[int]
    prefill_s: float
    decode_s: float
    stats_prefill: dict[str, Any] | None = None
    stats_end: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def decode_tps(self) -> float:
        n = len(self.tokens) - 1
        return n / self.decode_s if n > 0 and self.decode_s > 0 else float("nan")

    @property
    def tps(self) -> float:
        t = self.prefill_s + self.decode_s
        return len(self.tokens) / t if t > 0 else float("nan")


def _stats(provider: Any) -> dict[str, Any] | None:
    fn = getattr(provider, "stats", None)
    return fn() if callable(fn) else None


def greedy(model: Any, prompt: Sequence[int], n: int, *, provider: Any = None,
           eos: int | None = None) -> Generation:
    """``n`` greedy tokens after ``prompt`` (stopping after ``eos`` when given), one forward
    per token with a KV cache; ``provider``: whose ``stats()`` to snapshot."""
    torch = require_torch("rkv moe run")

    if n < 1 or not prompt:
        raise InputError("need a non-empty prompt and at least one token")
    tokens: list[int] = []
    hf = getattr(model, "model", model)              # a MoEModel wraps the HF model
    cache_kw = ("cache" if "cache" in inspect.signature(hf.forward).parameters
                else "past_key_values")              # transformers >= 5.x: cache
    with torch.no_grad():
        t0 = time.perf_counter()
        out = model(torch.tensor([list(prompt)]), use_cache=True)
        tokens.append(int(out.logits[0, -1].argmax()))
        prefill = time.perf_counter() - t0
        s0 = _stats(provider)
        t1 = time.perf_counter()
        while len(tokens) < n and tokens[-1] != eos:
            out = model(torch.tensor([[tokens[-1]]]), use_cache=True,
                        **{cache_kw: getattr(out, "cache", None) or out.past_key_values})
            tokens.append(int(out.logits[0, -1].argmax()))
        t2 = time.perf_counter()
    return Generation(tokens, prefill, t2 - t1, s0, _stats(provider))


def summary(g: Generation) -> dict[str, Any]:
    """Tokens/s and, for a streamed run, the decode phase's counters per generated token."""
    out: dict[str, Any] = {"tokens": len(g.tokens), "prefill_s": g.prefill_s,
                           "decode_s": g.decode_s, "decode_tokens_per_s": g.decode_tps,
                           "tokens_per_s": g.tps}
    a, b = g.stats_prefill, g.stats_end
    if a is None or b is None:
        return out
    n = max(1, len(g.tokens) - 1)
    hits, misses = b["hits"] - a["hits"], b["misses"] - a["misses"]
    moved = sum(t["bytes_read"] for t in b["tiers"].values()) - sum(
        t["bytes_read"] for t in a["tiers"].values())
    out.update({
        "hit_ratio": hits / (hits + misses) if hits + misses else float("nan"),
        "hit_ratio_all": b["hit_rate"],
        "bytes_per_token": moved / n,
        "prefill_bytes": sum(t["bytes_read"] for t in a["tiers"].values()),
        "prefetch_issued": b["prefetch"]["issued"], "prefetch_used": b["prefetch"]["used"],
        "prefetch_late": b["prefetch"]["late"], "prefetch_wasted": b["prefetch"]["wasted"],
        "corrected": b["corrected"], "approximate": b["approximate"],
        "uncorrectable": b["uncorrectable"], "errors": b["errors"],
        "reloaded_from_copy": b["reloaded_from_copy"]})
    return out


def prompt_ids(tok: Any, text: str, chat: bool = True) -> list[int]:
    """The prompt's token ids (through the chat template when the tokenizer has one)."""
    if chat and getattr(tok, "chat_template", None):
        text = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                       add_generation_prompt=True)
        return [int(i) for i in tok(text, add_special_tokens=False).input_ids]
    return [int(i) for i in tok(text).input_ids]


# -- the command ---------------------------------------------------------------------------------
@click.command("run", short_help=SUBCOMMANDS["run"][1])
@model_options(threads=1)
@click.option("--prompt", default=DEFAULT_PROMPT)
@click.option("--no-chat", is_flag=True, help="do not apply the chat template")
@click.option("--tokens", type=click.IntRange(min=1), default=48,
              help="tokens to generate (greedy)")
@click.option("--ignore-eos", is_flag=True, help="generate --tokens even past EOS")
@click.option("--store", type=click.Path(file_okay=False), default=None,
              help="expert store directory, created when absent  [default: under the fit "
                   "cache, one per model, bits and low-bit copy]")
@click.option("--existing", is_flag=True, help="the store must exist already")
@click.option("--config", type=click.Path(exists=True, dir_okay=False), default=None,
              help="engine TOML whose tiers hold the store (with a [placement] table, each "
                   "expert's tier, bits and code are planned; docs/moe.md)  [default: the "
                   "engine's dram, cxl, nvme]")
@click.option("--bits", type=click.Choice(["16", "8", "4"]), default="16",
              help="bits of the stored experts (8, 4: rowq)")
@click.option("--dtype", type=click.Choice(sorted(DTYPES)), default="float16",
              help="dtype of the stored experts")
@click.option("--low-bit-copy", type=click.Choice(["4", "8"]), default=None,
              help="also store a low-bit copy (served, flagged, when a record is lost)")
@click.option("--low-bit-on-miss", is_flag=True,
              help="serve every miss from the low-bit copy (approximate) while the exact "
                   "expert loads")
@click.option("--budget", default="25%",
              help="device cache: share of all experts' bytes (25%, 0.25), bytes (64MiB) or 0")
@click.option("--policy", default="lru",
              help="eviction policy spec (lru, lfu, activation, ...)")
@click.option("--per-layer", is_flag=True, help="one cache per layer, budget split evenly")
@click.option("--prefetch", type=click.Choice(list(PREFETCH)), default="hints",
              help="hints: speculative routing hints loaded by a worker thread; hints-sync: "
                   "loaded inline; cooccur: co-occurrence lookahead")
@click.option("--resident", is_flag=True, help="also generate with every expert resident; "
              "report the speed ratio and whether the tokens are identical")
@click.option("--replan", is_flag=True, help="afterwards, move the experts' records by the "
              "loads seen (the [placement] table of --config, else bits kept)")
@click.option("--json", "json", type=click.Path(dir_okay=False), default=None, metavar="OUT",
              help="write the results as JSON")
def run_cmd(**kw: Any) -> int:
    """Generate text with the MoE model's experts streamed from an rkv store: tokens/s,
    expert hits, bytes moved (docs/moe.md). One compute thread by default: with the prefetch
    worker, two OpenMP threads on two busy cores stall at every barrier."""
    kw["bits"] = int(kw["bits"])
    kw["low_bit_copy"] = None if kw["low_bit_copy"] is None else int(kw["low_bit_copy"])
    return cmd_run(SimpleNamespace(**kw))


def check_args(args: Any) -> None:
    """The checks that need no model (a bad option fails in a second)."""
    if not 1 <= args.top_k <= args.experts:
        raise InputError(f"--top-k must be in 1..{args.experts}, got {args.top_k}")
    if args.tokens < 1:
        raise InputError(f"--tokens must be at least 1, got {args.tokens}")
    if not args.prompt.strip():
        raise InputError("--prompt is empty")
    budget_bytes(args.budget, 1)                           # syntax only, before the model
    from policies.registry import make_policy

    try:
        make_policy(args.policy, 1)
    except (ValueError, KeyError) as exc:
        raise ConfigError(f"--policy: {exc}") from None
    if args.low_bit_on_miss and args.low_bit_copy is None:
        raise ConfigError("--low-bit-on-miss needs --low-bit-copy")
    if args.existing and args.store and not (Path(args.store) / "moe.json").exists():
        raise StoreError(f"no rkv expert store at {args.store}")


def load_model(args: Any, log: Callable[[str], None]) -> tuple[Any, Any]:
    """(MoEModel, tokenizer): SmolLM2-135M-Instruct MoEfied (tests replace this)."""
    from rkv.moe.model import load_moe_smollm2

    return load_moe_smollm2(args.experts, args.top_k, cache_dir=args.cache_dir,
                            threads=args.threads, log=log)


def _tiers(path: str | None) -> tuple[tuple[Any, ...] | None, dict[str, Any]]:
    """(tiers, [placement] table) of an engine config (None, {}: the defaults)."""
    if path is None:
        return None, {}
    from rkv.cli.common import load_engine_config

    cfg = load_engine_config(path)
    return cfg.tiers, dict(cfg.placement)


def cmd_run(args: Any) -> int:
    from rkv.cli.moe import _log
    from rkv.moe.experts import ResidentExperts

    log = _log(args.quiet)
    check_args(args)
    tiers, placement = _tiers(args.config)
    log("loading the MoE model ...")
    moe, tok = load_model(args, log)
    moe.set_top_k(args.top_k)
    fp = store_fingerprint(moe.fingerprint, args.dtype)
    path = Path(args.store) if args.store else default_store(
        args.cache_dir, fp, "plan" if placement else args.bits, args.low_bit_copy)
    layers = cast_experts(moe.experts, args.dtype)
    total = expert_bytes(layers)
    budget = budget_bytes(args.budget, total)

    def profile() -> Any:
        from rkv.moe.profile import profile_for

        return profile_for(moe, tok, args.cache_dir, log)

    spec = StoreSpec(path, fp, args.bits, args.low_bit_copy, tiers, not args.existing,
                     placement or None, profile)
    kw = open_options(budget, args.policy, args.per_layer, args.prefetch, args.low_bit_on_miss)
    ids = prompt_ids(tok, args.prompt, not args.no_chat)
    eos = None if args.ignore_eos else getattr(tok, "eos_token_id", None)
    provider = open_store(spec, lambda: layers, log=log, **kw)
    replanned: dict[str, Any] | None = None
    try:
        moe.set_provider(provider)
        moe.set_hint(PREFETCH[args.prefetch][2])
        log(f"generating {args.tokens} tokens ...")
        g = greedy(moe, ids, args.tokens, provider=provider, eos=eos)
        provider.settle()
        g.stats_end = provider.stats()
        if args.replan:
            log("re-placing the experts by the loads seen ...")
            replanned = provider.replan(placement or {"bits": [16]},
                                        profile() if placement else None).to_dict()
    finally:
        moe.set_provider(None)
        provider.close()
    res: dict[str, Any] = {
        "model": moe.name, "experts": moe.n_experts, "top_k": moe.top_k, "store": str(path),
        "bits": args.bits, "dtype": args.dtype, "low_bit_copy": args.low_bit_copy,
        "budget": args.budget, "budget_bytes": budget, "expert_bytes_total": total,
        "policy": args.policy, "per_layer": args.per_layer, "prefetch": args.prefetch,
        "prompt_tokens": len(ids), "text": tok.decode(g.tokens, skip_special_tokens=True),
        "streamed": summary(g), "placement": placement or None,
        "replan": replanned}
    if args.resident:
        moe.set_provider(ResidentExperts(layers))
        r = greedy(moe, ids, args.tokens, eos=eos)
        res["resident"] = summary(r)
        res["identical"] = r.tokens == g.tokens
        res["ratio"] = g.decode_tps / r.decode_tps
    logger.info("moe run: %d tokens, decode %.2f tokens/s, store %s", len(g.tokens),
                g.decode_tps, path)
    print_report(res)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1, default=float) + "\n")
    return 0


def print_report(res: dict[str, Any]) -> None:
    s = res["streamed"]
    w = sys.stdout.write
    w(res["text"].strip() + "\n\n")
    bits = "planned" if res.get("placement") else f"{res['bits']}-bit"
    w(f"E={res['experts']} k={res['top_k']}, {bits} {res['dtype']} experts, "
      f"budget {res['budget']} ({res['budget_bytes'] / 2**20:.1f} of "
      f"{res['expert_bytes_total'] / 2**20:.1f} MiB), {res['policy']}"
      f"{' per layer' if res['per_layer'] else ''}, prefetch {res['prefetch']}\n")
    w(f"tokens: {s['tokens']} (prompt {res['prompt_tokens']}); prefill {s['prefill_s']:.2f} s; "
      f"decode {s['decode_tokens_per_s']:.2f} tokens/s\n")
    w(f"expert hit ratio (decode): {s['hit_ratio']:.3f}; bytes moved per token: "
      f"{s['bytes_per_token'] / 2**20:.2f} MiB; prefetch used/issued: {s['prefetch_used']}/"
      f"{s['prefetch_issued']} (late {s['prefetch_late']}, wasted {s['prefetch_wasted']})\n")
    w(f"corrected: {s['corrected']}; approximate: {s['approximate']}; errors: "
      f"{sum(s['errors'].values())} {s['errors'] or ''}\n".replace(" \n", "\n"))
    if s["approximate"]:
        w(f"WARNING: {s['approximate']} expert loads came from the low-bit copy: the output "
          "is approximate\n")
    if "resident" in res:
        w(f"resident: {res['resident']['decode_tokens_per_s']:.2f} tokens/s; streamed/resident "
          f"{res['ratio']:.2f}; tokens identical: {'yes' if res['identical'] else 'NO'}\n")
    if res.get("replan"):
        r = res["replan"]
        w(f"replan ({r['steps']} steps): promoted {r['promoted']}, demoted {r['demoted']}, "
          f"recoded {r['recoded']}, unreadable {r['unreadable']}; "
          f"{r['bytes_written'] / 2**20:.1f} MiB written in {r['seconds']:.1f} s\n")
