"""Quality profiles: the KL of the next-token distribution when one block's KV is stored at
``bits`` bits, per (layer, kind, bits), 16 bits costing nothing; the file that holds them and
its loaders.

A :class:`QualityProfile` is made from a mapping ``{(layer, "k"|"v", bits): kl}`` (or keys
``"<layer>:<k|v>:<bits>"``), a callable ``(layer, kind, bits) -> kl``, or a profile file. A
block of kind ``"kv"`` (K and V in one record) costs the sum of its K and V entries. The
planner (:mod:`rkv.placement`) prices bit-widths with it; ``rkv calibrate``
(:mod:`rkv.eval.calibrate`) measures it.

A profile file is one JSON object. The planner needs only its KL table,
``{"model": ..., "kl": {"<layer>:<k|v>:<bits>": kl}}`` (:meth:`QualityProfile.load` reads that
much of any profile file). What ``rkv calibrate`` writes is a *measured* profile keyed by the
model fingerprint (:func:`read_profile`, :func:`write_profile`)::

    {"model": "...", "fingerprint": "<32 hex>", "weights": "Q4_1", "windows": 24,
     "text": ["..."], "kl": {"<layer>:<k|v>:<bits>": mean KL, ...},
     "kl_se": {same keys: standard error over windows}, "ppl": {same keys: perplexity}}

plus optional metadata (``prefix``, ``scored``, ``quant``, ``ppl_ref``, ``kl_floor``,
``seconds``, ``threads``, ``version``). The SmolLM2-135M-Instruct profile (weights 4-bit
Q4_1) ships in this package as ``rkv/profiles/smollm2-135m.json``::

    p = load_profile("smollm2-135m")          # or the fingerprint hex, the model name, a path
    p.kl(3, "k", 2)                           # mean KL of layer 3's keys at 2 bits
    p.additive({(0, "k"): 8, (0, "v"): 4})    # the additive estimate of a mixed plan

Profiles are JSON only and size-limited; a measured profile is validated field by field:
anything malformed is a :class:`rkv.errors.ConfigError` that says what and where.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from numbers import Integral
from pathlib import Path
from typing import Any

from rkv.checks import check_keys
from rkv.errors import ConfigError
from rkv.format.model import ModelSpec
from rkv.inputs import read_bytes, read_json
from rkv.specs import strict_json

KlFn = Callable[[int, str, int], float]

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


def block_key(layer: int, kind: str, bits: int) -> str:
    """The file's key of one block at ``bits`` bits: ``"<layer>:<k|v>:<bits>"``."""
    return f"{layer}:{kind}:{bits}"


class QualityProfile:
    """KL per (layer, kind, bits) of one model; a missing entry raises :class:`ConfigError`.

    ``source``: a mapping of KL by (layer, kind, bits) or by block key, a callable, another
    profile (copied), or a profile document (its ``model`` and ``kl``, the document's model
    over ``model``). ``kl_mean`` is the KL by block key (empty for a callable) and
    ``n_layers`` one more than its deepest layer. A measured profile
    (:func:`validate_profile`) also says how it was measured: ``fingerprint`` (32 hex; empty:
    not measured), ``weights``, ``windows``, ``text``, ``kl_se`` and ``ppl`` (by block key)
    and ``meta`` (the optional fields)."""

    def __init__(self, source: Mapping[Any, Any] | KlFn | QualityProfile,
                 model: str | None = None, *, fingerprint: str = "", weights: str = "",
                 windows: int = 0, text: Sequence[str] = (),
                 kl_se: Mapping[str, float] | None = None,
                 ppl: Mapping[str, float] | None = None,
                 meta: Mapping[str, Any] | None = None) -> None:
        if isinstance(source, QualityProfile):
            self.__dict__.update(source.__dict__)
            return
        self.model = model
        self.fingerprint, self.weights, self.windows = fingerprint, weights, windows
        self.text = tuple(text)
        self.kl_se: Mapping[str, float] = dict(kl_se or {})
        self.ppl: Mapping[str, float] = dict(ppl or {})
        self.meta: Mapping[str, Any] = dict(meta or {})
        self._fn: KlFn | None = None
        table: dict[str, float] = {}
        deepest = -1
        if callable(source) and not isinstance(source, Mapping):
            self._fn = source
        elif isinstance(source, Mapping):
            if "kl" in source and isinstance(source["kl"], Mapping):
                self.model = str(source.get("model", "")) or model
                source = source["kl"]
            for key, v in source.items():
                layer, kind, bits = _parse_key(key)
                table[block_key(layer, kind, bits)] = _kl_value(key, v)
                deepest = max(deepest, layer)
        else:
            raise ConfigError(f"quality profile: expected a mapping, a callable or a JSON "
                              f"profile, got {type(source).__name__}")
        self.kl_mean: Mapping[str, float] = table
        self.n_layers = deepest + 1

    @classmethod
    def load(cls, path: str | Path) -> QualityProfile:
        """The KL table of a profile file: what ``rkv calibrate`` writes or any object with
        a ``kl`` table (a regular file of at most 4 MiB, strict JSON:
        :func:`rkv.inputs.read_json`); a measured profile's statistics are not read
        (:func:`read_profile` reads and checks them)."""
        doc = read_json(path, "quality profile")
        if not isinstance(doc, dict):
            raise ConfigError(f"quality profile {path}: expected a JSON object, got "
                              f"{type(doc).__name__}")
        return cls(doc)

    def kl(self, layer: int, kind: str, bits: int) -> float:
        """KL (nats per scored token) with only this block stored at ``bits`` bits (16: 0);
        a ``"kv"`` block costs its K plus its V."""
        _check(layer, kind, bits, ("k", "v", "kv"))
        if bits == 16:
            return 0.0
        if kind == "kv":
            return self.kl(layer, "k", bits) + self.kl(layer, "v", bits)
        if self._fn is not None:
            return _kl_value(block_key(layer, kind, bits), self._fn(layer, kind, bits))
        try:
            return self.kl_mean[block_key(layer, kind, bits)]
        except KeyError:
            raise ConfigError(f"quality profile has no entry for layer {layer} "
                              f"{kind.upper()} at {bits} bits (key \"{layer}:{kind}:{bits}\")"
                              ) from None

    def width_kl(self, layer: int, width: tuple[int, int]) -> float:
        """KL of a ``"kv"`` block whose keys have ``width[0]`` bits and values ``width[1]``:
        its K entry plus its V entry (16 bits: 0)."""
        kb, vb = width
        return self.kl(layer, "k", kb) + self.kl(layer, "v", vb)

    def degraded_kl(self, layer: int, kind: str) -> float:
        """What a degraded read of the block costs: its KL at the fewest bits the profile
        has (2, else 4, else 8). A failed tolerant low byte plane leaves every float16 value
        within one unit of its E5M2 high byte, finer than 2-bit KIVI, so this bounds it."""
        for bits in (2, 4, 8):
            try:
                return self.kl(layer, kind, bits)
            except ConfigError:
                continue
        raise ConfigError(f"quality profile has no lossy entry for layer {layer} "
                          f"{kind.upper()}: a degraded read's cost is unknown")

    def se(self, layer: int, kind: str, bits: int) -> float:
        """Standard error of :meth:`kl` over the calibration windows (a measured profile)."""
        _check(layer, kind, bits, KINDS)
        if bits == 16:
            return 0.0
        try:
            return self.kl_se[block_key(layer, kind, bits)]
        except KeyError:
            raise ConfigError(f"quality profile has no standard error for layer {layer} "
                              f"{kind.upper()} at {bits} bits (not a measured profile?)"
                              ) from None

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
        return sum(self.kl(i, kind, bits) for i in self._layers()) / self.n_layers

    def ranked(self, kind: str, bits: int) -> list[tuple[int, float]]:
        """(layer, KL) from the most to the least sensitive."""
        return sorted(((i, self.kl(i, kind, bits)) for i in self._layers()),
                      key=lambda t: -t[1])

    def _layers(self) -> range:
        if self.n_layers == 0:
            raise ConfigError("quality profile has no table of layers (made from a callable?)")
        return range(self.n_layers)

    def to_dict(self) -> dict[str, Any]:
        """The profile's file document: every field of a measured profile, else its ``model``
        (when it has one) and ``kl``."""
        if self._fn is not None:
            raise ConfigError("a quality profile made from a callable has no file form")
        if not self.fingerprint:
            return {**({"model": self.model} if self.model else {}), "kl": dict(self.kl_mean)}
        return {"model": self.model, "fingerprint": self.fingerprint,
                "weights": self.weights, "windows": self.windows, **dict(self.meta),
                "text": list(self.text), "kl": dict(self.kl_mean),
                "kl_se": dict(self.kl_se), "ppl": dict(self.ppl)}

    def _fields(self) -> tuple[Any, ...]:
        return (self.model, self.kl_mean, self._fn, self.fingerprint, self.weights,
                self.windows, self.text, self.kl_se, self.ppl, self.meta)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, QualityProfile):
            return NotImplemented
        return self._fields() == other._fields()

    def __repr__(self) -> str:
        what = ("a callable" if self._fn is not None else
                f"{self.n_layers} layers{', measured' if self.fingerprint else ''}")
        return f"QualityProfile(model={self.model!r}, {what})"


def as_profile(p: QualityProfile | Mapping[Any, Any] | KlFn | None) -> QualityProfile | None:
    """``p`` as a :class:`QualityProfile` (a profile itself; None stays None)."""
    return None if p is None else (p if isinstance(p, QualityProfile) else QualityProfile(p))


def _check(layer: Any, kind: Any, bits: Any, kinds: tuple[str, ...]) -> None:
    # Integral, not int: numpy's integers are layers and bit-widths too; bools are not.
    if isinstance(layer, bool) or not isinstance(layer, Integral) or layer < 0:
        raise ConfigError(f"layer must be an int >= 0, got {layer!r}")
    if kind not in kinds:
        raise ConfigError(f"kind must be one of {', '.join(map(repr, kinds))}, got {kind!r}")
    if isinstance(bits, bool) or not isinstance(bits, Integral) or bits not in (16, *BITS):
        raise ConfigError(f"bits must be 16, 8, 4 or 2, got {bits!r}")


def _parse_key(key: Any) -> tuple[int, str, int]:
    try:
        if isinstance(key, str):
            layer_s, kind, bits_s = key.split(":")
            layer, bits = int(layer_s), int(bits_s)
        else:
            layer, kind, bits = key
            layer, bits = int(layer), int(bits)
    except (ValueError, TypeError):
        raise ConfigError(f"quality profile: bad key {key!r} (want \"<layer>:<k|v>:<bits>\" "
                          f"or (layer, kind, bits))") from None
    kind = str(kind).lower()
    if kind not in KINDS or layer < 0 or bits not in (2, 4, 8, 16):
        raise ConfigError(f"quality profile: bad key {key!r} (layer >= 0, kind k or v, "
                          f"bits 2/4/8/16)")
    return layer, kind, bits


def _kl_value(key: Any, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
        raise ConfigError(f"quality profile: KL for {key!r} must be a finite number >= 0, "
                          f"got {v!r}")
    return float(v)


# -- the measured profile's file ----------------------------------------------------------
def _number(where: str, v: Any, *, low: float, strict: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ConfigError(f"profile {where} must be a number, got {type(v).__name__}")
    x = float(v)
    if not math.isfinite(x) or x < low or (strict and x == low):
        raise ConfigError(f"profile {where} must be finite and {'>' if strict else '>='} "
                          f"{low}, got {v!r}")
    return x


def validate_profile(d: Any) -> QualityProfile:
    """The measured :class:`QualityProfile` of the parsed JSON ``d``, or a ConfigError naming
    the problem."""
    if not isinstance(d, dict):
        raise ConfigError(f"a profile is a JSON object, got {type(d).__name__}")
    check_keys(d, (*_REQUIRED, *_OPTIONAL), "profile", noun="field")
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
    return QualityProfile(kl, d["model"], fingerprint=d["fingerprint"], weights=d["weights"],
                          windows=d["windows"], text=d["text"], kl_se=se, ppl=ppl, meta=meta)


def parse_profile(data: bytes | str, where: str = "profile") -> QualityProfile:
    """Parse and validate a measured profile from JSON text (never anything but JSON)."""
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


def read_profile(path: str | Path) -> QualityProfile:
    """The measured profile in the file ``path`` (:func:`parse_profile`)."""
    p = Path(path)
    try:
        data = read_bytes(p, "profile", limit=MAX_PROFILE_BYTES)
    except ConfigError as exc:
        raise ConfigError(f"cannot read {exc}") from None
    return parse_profile(data, str(p))


def write_profile(profile: QualityProfile, path: str | Path) -> None:
    """Write a measured profile to ``path`` (validated first; replaces the file whole)."""
    validate_profile(profile.to_dict())
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps(profile.to_dict(), indent=1, allow_nan=False) + "\n")
    tmp.replace(p)


def shipped_profiles() -> dict[str, QualityProfile]:
    """The profiles that ship in ``rkv/profiles`` by file stem."""
    out = {}
    for entry in sorted(resources.files("rkv.profiles").iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".json"):
            out[entry.name[:-5]] = parse_profile(entry.read_bytes(), f"rkv/profiles/{entry.name}")
    return out


def load_profile(which: str | bytes | ModelSpec | Path) -> QualityProfile:
    """The measured profile of a model: a shipped profile's name (``"smollm2-135m"``), model
    name or fingerprint (hex, bytes, or a :class:`ModelSpec`), or the path of a profile
    file."""
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
