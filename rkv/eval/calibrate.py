"""Quality profiles: how much each layer's K and V lose at 8, 4 and 2 bits, per model.

``rkv calibrate`` measures, on text windows, the KL divergence of the next-token
distributions (nats per scored token) and the perplexity when only one layer's prefix K (or
V) goes through rkv's KIVI quantizer and everything else stays exact
(:mod:`rkv.eval.calibrate_measure`). The result is a JSON profile keyed by the model fingerprint::

    {"model": "...", "fingerprint": "<32 hex>", "weights": "Q4_1", "windows": 24,
     "text": ["..."], "kl": {"<layer>:<k|v>:<bits>": mean KL, ...},
     "kl_se": {same keys: standard error over windows}, "ppl": {same keys: perplexity}}

plus optional metadata (``prefix``, ``scored``, ``quant``, ``ppl_ref``, ``kl_floor``,
``seconds``, ``threads``). The SmolLM2-135M-Instruct profile (weights 4-bit Q4_1) ships as
``rkv/profiles/smollm2-135m.json``::

    p = load_profile("smollm2-135m")          # or the fingerprint hex, the model name, a path
    p.kl(3, "k", 2)                           # mean KL of layer 3's keys at 2 bits
    p.additive({(0, "k"): 8, (0, "v"): 4})    # the additive estimate of a mixed plan

Profiles are JSON only, size-limited and validated field by field: anything malformed is a
:class:`rkv.errors.ConfigError` that says what and where.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from rkv.errors import ConfigError
from rkv.format.model import ModelSpec
from rkv.specs import strict_json
from rkv.ui.progress import Progress

log = logging.getLogger(__name__)

KINDS = ("k", "v")
BITS = (8, 4, 2)
MAX_PROFILE_BYTES = 4 << 20
MAX_LAYERS = 65535
_KEY = re.compile(r"^(0|[1-9][0-9]{0,4}):([kv]):([248])$")
_HEX = re.compile(r"^[0-9a-f]{32}$")
_REQUIRED: dict[str, type | tuple[type, ...]] = {
    "model": str, "fingerprint": str, "weights": str, "windows": int, "text": list,
    "kl": dict, "kl_se": dict, "ppl": dict}
_OPTIONAL: dict[str, type | tuple[type, ...]] = {
    "prefix": int, "scored": int, "quant": str, "ppl_ref": (int, float),
    "kl_floor": (int, float), "seconds": (int, float), "threads": int, "version": int}


def smollm2_spec() -> ModelSpec:
    """The rkv model spec of SmolLM2-135M-Instruct (Q4_1) as ``rkv.adapters.hf.model_spec``
    gives it: fp32 KV, 30 layers, 3 KV heads of 64."""
    from rkv.eval.quality import SMOLLM2_ID

    return ModelSpec(SMOLLM2_ID, n_layers=30, n_kv_heads=3, head_dim=64, dtype="float32",
                     layout="hf-dynamic-cache")


def block_key(layer: int, kind: str, bits: int) -> str:
    return f"{layer}:{kind}:{bits}"


@dataclass(frozen=True)
class Profile:
    """A validated quality profile (see the module docstring)."""

    model: str
    fingerprint: str
    weights: str
    windows: int
    text: tuple[str, ...]
    kl_mean: Mapping[str, float]
    kl_se: Mapping[str, float]
    ppl: Mapping[str, float]
    n_layers: int
    meta: Mapping[str, Any] = field(default_factory=dict)

    def _check(self, layer: int, kind: str, bits: int) -> None:
        if not isinstance(layer, int) or isinstance(layer, bool) or not (
                0 <= layer < self.n_layers):
            raise ConfigError(f"layer must be an int in [0, {self.n_layers}), got {layer!r}")
        if kind not in KINDS:
            raise ConfigError(f"kind must be 'k' or 'v', got {kind!r}")
        if bits not in (16, *BITS) or isinstance(bits, bool):
            raise ConfigError(f"bits must be 16, 8, 4 or 2, got {bits!r}")

    def kl(self, layer: int, kind: str, bits: int) -> float:
        """Mean KL (nats per scored token) with only this block quantized; 16 bits: 0."""
        self._check(layer, kind, bits)
        return 0.0 if bits == 16 else self.kl_mean[block_key(layer, kind, bits)]

    def se(self, layer: int, kind: str, bits: int) -> float:
        """Standard error of :meth:`kl` over the calibration windows."""
        self._check(layer, kind, bits)
        return 0.0 if bits == 16 else self.kl_se[block_key(layer, kind, bits)]

    def additive(self, plan: Mapping[tuple[int, str], int]) -> float:
        """Sum of the per-block KL of ``plan`` ({(layer, kind): bits}; missing: 16 bits)."""
        if not isinstance(plan, Mapping):
            raise ConfigError(f"a plan maps (layer, kind) to bits, got {type(plan).__name__}")
        total = 0.0
        for key, bits in plan.items():
            if not (isinstance(key, tuple) and len(key) == 2):
                raise ConfigError(f"plan keys are (layer, kind) pairs, got {key!r}")
            total += self.kl(key[0], key[1], bits)
        return total

    def mean_kl(self, kind: str, bits: int) -> float:
        """Mean over layers of :meth:`kl`."""
        return sum(self.kl(i, kind, bits) for i in range(self.n_layers)) / self.n_layers

    def ranked(self, kind: str, bits: int) -> list[tuple[int, float]]:
        """(layer, KL) from the most to the least sensitive."""
        return sorted(((i, self.kl(i, kind, bits)) for i in range(self.n_layers)),
                      key=lambda t: -t[1])

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "fingerprint": self.fingerprint,
                "weights": self.weights, "windows": self.windows, **dict(self.meta),
                "text": list(self.text), "kl": dict(self.kl_mean),
                "kl_se": dict(self.kl_se), "ppl": dict(self.ppl)}


# -- validation ----------------------------------------------------------------------------
def _number(where: str, v: Any, *, low: float, strict: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ConfigError(f"profile {where} must be a number, got {type(v).__name__}")
    x = float(v)
    if not math.isfinite(x) or x < low or (strict and x == low):
        raise ConfigError(f"profile {where} must be finite and {'>' if strict else '>='} "
                          f"{low}, got {v!r}")
    return x


def validate_profile(d: Any) -> Profile:
    """A :class:`Profile` from the parsed JSON ``d``, or a ConfigError naming the problem."""
    if not isinstance(d, dict):
        raise ConfigError(f"a profile is a JSON object, got {type(d).__name__}")
    unknown = sorted(set(d) - set(_REQUIRED) - set(_OPTIONAL))
    if unknown:
        raise ConfigError(f"unknown profile fields: {unknown[:5]}")
    for name, typ in (*_REQUIRED.items(), *_OPTIONAL.items()):
        if name not in d:
            if name in _REQUIRED:
                raise ConfigError(f"profile field {name!r} is missing")
            continue
        v = d[name]
        if isinstance(v, bool) or not isinstance(v, typ):
            raise ConfigError(f"profile field {name!r} has type {type(v).__name__}")
    if not 0 < len(d["model"]) <= 300:
        raise ConfigError("profile field 'model' must be 1..300 characters")
    if not _HEX.match(d["fingerprint"]):
        raise ConfigError("profile field 'fingerprint' must be 32 lowercase hex digits")
    if not 0 < len(d["weights"]) <= 100:
        raise ConfigError("profile field 'weights' must be 1..100 characters")
    if d["windows"] < 1:
        raise ConfigError("profile field 'windows' must be >= 1")
    if len(d["text"]) > 100 or not all(isinstance(t, str) and len(t) <= 1000
                                       for t in d["text"]):
        raise ConfigError("profile field 'text' must be a list of at most 100 strings")
    for name in ("prefix", "scored", "threads"):
        if name in d and d[name] < 0:
            raise ConfigError(f"profile field {name!r} must be >= 0")
    layers: set[int] = set()
    for key in d["kl"]:
        m = _KEY.match(key) if isinstance(key, str) else None
        if m is None:
            raise ConfigError(f"profile kl key {key!r} is not '<layer>:<k|v>:<2|4|8>'")
        layers.add(int(m.group(1)))
    n_layers = max(layers) + 1 if layers else 0
    if n_layers == 0 or n_layers > MAX_LAYERS:
        raise ConfigError("profile field 'kl' is empty")
    expected = {block_key(i, k, b) for i in range(n_layers) for k in KINDS for b in BITS}
    for name in ("kl", "kl_se", "ppl"):
        keys = set(d[name])
        if keys != expected:
            odd = sorted(keys ^ expected, key=str)[:3]
            raise ConfigError(f"profile field {name!r} must hold every layer 0..{n_layers - 1}"
                              f" x k,v x 8,4,2 and nothing else (first odd keys: {odd})")
    kl = {k: _number(f"kl[{k!r}]", d["kl"][k], low=0.0) for k in sorted(expected)}
    se = {k: _number(f"kl_se[{k!r}]", d["kl_se"][k], low=0.0) for k in sorted(expected)}
    ppl = {k: _number(f"ppl[{k!r}]", d["ppl"][k], low=0.0, strict=True)
           for k in sorted(expected)}
    meta = {}
    for name in _OPTIONAL:
        if name in d:
            meta[name] = (d[name] if name in ("quant",) or not isinstance(d[name], float)
                          else _number(name, d[name], low=0.0))
    return Profile(d["model"], d["fingerprint"], d["weights"], d["windows"], tuple(d["text"]),
                   kl, se, ppl, n_layers, meta)


def parse_profile(data: bytes | str, where: str = "profile") -> Profile:
    """Parse and validate a profile from JSON text (never anything but JSON)."""
    if len(data) > MAX_PROFILE_BYTES:
        raise ConfigError(f"{where} is larger than {MAX_PROFILE_BYTES} bytes")
    try:
        d = strict_json(data)
    except (ValueError, RecursionError) as exc:     # JSONDecodeError, UnicodeDecodeError
        raise ConfigError(f"{where} is not valid JSON: {exc}") from None
    try:
        return validate_profile(d)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def read_profile(path: str | Path) -> Profile:
    from rkv.inputs import read_bytes

    p = Path(path)
    try:
        data = read_bytes(p, "profile", limit=MAX_PROFILE_BYTES)
    except ConfigError as exc:
        raise ConfigError(f"cannot read {exc}") from None
    return parse_profile(data, str(p))


def write_profile(profile: Profile, path: str | Path) -> None:
    validate_profile(profile.to_dict())
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps(profile.to_dict(), indent=1, allow_nan=False) + "\n")
    tmp.replace(p)


def shipped_profiles() -> dict[str, Profile]:
    """The profiles that ship in ``rkv/profiles`` by file stem."""
    out = {}
    for entry in sorted(resources.files("rkv.profiles").iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".json"):
            out[entry.name[:-5]] = parse_profile(entry.read_bytes(), f"rkv/profiles/{entry.name}")
    return out


def load_profile(which: str | bytes | ModelSpec | Path) -> Profile:
    """The profile of a model: a shipped profile's name (``"smollm2-135m"``), model name or
    fingerprint (hex, bytes, or a :class:`ModelSpec`), or the path of a profile file."""
    if isinstance(which, ModelSpec):
        which = which.fingerprint()
    if isinstance(which, bytes):
        which = which.hex()
    if isinstance(which, Path) or (isinstance(which, str) and which.endswith(".json")):
        return read_profile(which)
    if not isinstance(which, str):
        raise ConfigError(f"load_profile takes a name, fingerprint or path, got "
                          f"{type(which).__name__}")
    shipped = shipped_profiles()
    for stem, p in shipped.items():
        if which in (stem, p.model, p.fingerprint):
            return p
    raise ConfigError(f"no quality profile for {which!r}; shipped: "
                      f"{[f'{s} ({p.model}, {p.fingerprint})' for s, p in shipped.items()]}"
                      "; run `rkv calibrate` to make one")


# -- the calibration run ---------------------------------------------------------------------
def calibrate(n_windows: int = 24, *, cache: str | Path | None = None,
              sources: tuple[str, ...] = ("topics", "docs"), threads: int = 2,
              quiet: bool = False, model_tok: tuple[Any, Any] | None = None,
              layers: list[int] | None = None, limit: int | None = None) -> Profile:
    """Measure the SmolLM2 profile on ``n_windows`` windows (only the first ``limit`` of
    them when given: a run that stops early, resumable up to all ``n_windows``). ``cache``
    (JSON Lines): every finished window is appended, and a rerun with the same settings
    resumes from it."""
    from rkv.eval.calibrate_measure import LENGTH, PREFIX, calibration_windows, window_cases
    from rkv.eval.quality import load_smollm2

    t0 = time.perf_counter()
    model, tok = model_tok or load_smollm2(threads)
    spec = smollm2_spec()
    windows, text = calibration_windows(tok, n_windows, sources)
    use = n_windows if limit is None else max(1, min(limit, n_windows))
    if use < n_windows:
        text = [f"the first {use} of {n_windows} windows, alternating:", *text]
    header = {"fingerprint": spec.fingerprint().hex(), "windows": windows, "prefix": PREFIX,
              "length": LENGTH, "bits": list(BITS), "quant": "kivi(group=32), 256-token blocks",
              "layers": layers}
    done: dict[int, dict[str, Any]] = {}
    cpath = Path(cache) if cache else None
    if cpath is not None and cpath.exists():
        from rkv.inputs import MAX_RESULTS_BYTES, read_text

        lines = read_text(cpath, "calibration cache", limit=MAX_RESULTS_BYTES).splitlines()
        try:
            if lines and json.loads(lines[0]) == header:
                for line in lines[1:]:
                    row = json.loads(line)
                    done[int(row["i"])] = row
            else:
                lines = []
        except (ValueError, KeyError, TypeError):
            lines, done = [], {}     # a torn or foreign cache: start again
        if not lines:
            cpath.write_text(json.dumps(header) + "\n")
    elif cpath is not None:
        cpath.parent.mkdir(parents=True, exist_ok=True)
        cpath.write_text(json.dumps(header) + "\n")
    n_l = len(layers) if layers is not None else spec.n_layers
    cached = sum(1 for i in done if i < use)
    with Progress("calibrate", use * n_l, unit="layer", quiet=quiet,
                  initial=cached * n_l) as bar:
        if cached:
            bar.write(f"calibrate: resuming, {cached} of {use} windows cached")
        for i, ids in enumerate(windows[:use]):
            if i in done:
                continue
            tw = time.perf_counter()
            kl, nll, nll_ref, floor = window_cases(model, ids, layers)
            row = {"i": i, "kl": kl, "nll": nll, "nll_ref": nll_ref, "floor": floor,
                   "seconds": time.perf_counter() - tw}
            done[i] = row
            if cpath is not None:
                with cpath.open("a") as f:
                    f.write(json.dumps(row) + "\n")
            log.info("calibrate: window %d of %d in %.1f s", i + 1, use, row["seconds"])
            bar.update(n_l)
    return summarize([done[i] for i in range(use)], text, spec,
                     seconds=time.perf_counter() - t0, threads=threads,
                     scored=len(windows[0]) - PREFIX)


def summarize(rows: list[dict[str, Any]], text: list[str], spec: ModelSpec, *,
              seconds: float, threads: int, scored: int) -> Profile:
    """The profile from per-window rows (``kl``, ``nll``, ``nll_ref``, ``floor``)."""
    from rkv.eval.calibrate_measure import PREFIX
    from rkv.eval.quality import SMOLLM2_ID

    n = len(rows)
    keys = sorted(rows[0]["kl"])
    kl, se, ppl = {}, {}, {}
    for k in keys:
        xs = [max(float(r["kl"][k]), 0.0) for r in rows]
        m = sum(xs) / n
        kl[k] = m
        se[k] = (math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1) / n) if n > 1 else 0.0)
        ppl[k] = math.exp(sum(float(r["nll"][k]) for r in rows) / (n * scored))
    meta = {"prefix": PREFIX, "scored": scored,
            "quant": "kivi(bits, group=32) per 256-token block; only the named layer's prefix "
                     "K or V quantized, all else exact; fp32 KV",
            "ppl_ref": math.exp(sum(float(r["nll_ref"]) for r in rows) / (n * scored)),
            "kl_floor": max(float(r["floor"]) for r in rows),
            "seconds": round(seconds, 1), "threads": threads, "version": 1}
    return Profile(SMOLLM2_ID if spec.model_id == SMOLLM2_ID else spec.model_id,
                   spec.fingerprint().hex(), "Q4_1", n, tuple(text), kl, se, ppl,
                   spec.n_layers, meta)


def cmd_calibrate(args: Any) -> int:
    """``rkv calibrate``: measure the SmolLM2 profile and write it (JSON)."""
    import os

    cache = args.cache or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "rkv",
        f"calibrate-{smollm2_spec().fingerprint().hex()[:12]}-{args.windows}.jsonl")
    prof = calibrate(args.windows, cache=cache, sources=tuple(args.text.split(",")),
                     threads=args.threads, quiet=args.quiet, limit=args.limit)
    write_profile(prof, args.out)
    print(f"wrote {args.out}: {prof.windows} windows, {prof.meta['seconds']:.0f} s "
          f"(cache {cache})")
    for kind in KINDS:
        print(f"  {kind.upper()}: mean KL " + ", ".join(
            f"{b} bits {prof.mean_kl(kind, b):.3g}" for b in BITS))
    return 0
