"""Expert weights as rkv records: keys, the record layout, the manifest, placement, and the
verified read (used by :mod:`rkv.adapters.moe`; docs/moe.md, "The adapter: experts in rkv").

**Record layout.** One record per expert, in the record format of docs/format.md. The three
matrices become rows of ``d_model`` values, ``gate`` (``n`` rows), ``up`` (``n`` rows) and
``down`` transposed (``n`` rows: row ``j`` is column ``j`` of ``down``), plus one zero row when
``3n`` is odd, so that the ``R`` rows split into the format's two halves: the record's block
shape is ``[2, R/2, 1, d_model]`` in the experts' dtype, its payload these rows in C order
(transposing is exact, so the weights come back bitwise). ``n`` is ``R // 3``. A low-bit copy
is the same block through the ``rowq`` quantizer (one scale per row: per neuron).

**Keys.** ``expert_key = blake2b(fingerprint || layer u16 || expert u32 || variant u8,
digest_size=32, person="rkv-expert-v1")``, variant 0 for the weights, 1 for the low-bit copy;
the tier key is the format's block key (the expert key, then the layer as u16 big-endian). The
header carries the expert key, the layer and the 16-byte model fingerprint, so a record read
for another expert, layer or model is a ``RecordMismatchError``.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import xxhash

from rkv.codec.blockcodec import read_block, reencode
from rkv.codec.pipeline import Pipeline
from rkv.codec.stages import header_stages
from rkv.errors import (
    ConfigError,
    CorruptStoreError,
    InputError,
    MissingRecordError,
    RecordMismatchError,
    ShapeError,
    StoreError,
    TierFullError,
    UncorrectableError,
)
from rkv.format.dtypes import DTYPES, NAMES, numpy_dtype
from rkv.format.keys import block_key
from rkv.format.record import RecordHeader, decode_record
from rkv.moe.experts import ExpertWeights
from rkv.store.config import TierConfig, default_tiers
from rkv.tiers import Tier, TierSpec, open_tier
from rkv.tiers.base import TierReader, fetch

if TYPE_CHECKING:
    from rkv.ecc.base import Codec

MANIFEST = "moe.json"
FORMAT = "rkv-moe-1"
FULL, LOW = 0, 1
_KEY = struct.Struct("<HIB")
_BATCH = 32           # records per write transaction when creating a store


def model_fingerprint(fingerprint: bytes | str) -> bytes:
    """16 bytes: a 16-byte value as it is, anything else hashed (``person="rkv-moe-model"``)."""
    raw = fingerprint.encode() if isinstance(fingerprint, str) else bytes(fingerprint)
    if len(raw) == 16 and not isinstance(fingerprint, str):
        return raw
    return hashlib.blake2b(raw, digest_size=16, person=b"rkv-moe-model").digest()


def expert_key(fp: bytes, layer: int, expert: int, variant: int = FULL) -> bytes:
    """The 32-byte record key of one expert (module docstring)."""
    return hashlib.blake2b(fp + _KEY.pack(layer, expert, variant), digest_size=32,
                           person=b"rkv-expert-v1").digest()


def tier_key(fp: bytes, layer: int, expert: int, variant: int = FULL) -> bytes:
    return block_key(expert_key(fp, layer, expert, variant), layer)


@dataclass(frozen=True)
class ExpertInfo:
    """What the manifest says about one expert."""

    n: int                  # neurons (rows of gate and up)
    d: int                  # d_model
    dtype: str
    tier: str               # where its record lives
    bits: int               # 16: exact
    nbytes: int             # decoded size (the device cache's unit)
    record_bytes: int
    backup: str | None = None     # a tier holding a second copy
    low_bytes: int = 0            # the low-bit copy's record (in the first tier), 0: none
    ecc: str = ""                 # the record's code ("": its tier's, as stores before 0.2)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        rows = 3 * self.n + (3 * self.n) % 2
        return (2, rows // 2, 1, self.d)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def dtype_of(w: ExpertWeights) -> str:
    name = np.dtype(w.gate.dtype).name
    if name not in DTYPES:
        raise ShapeError(f"expert weights must be one of {', '.join(NAMES)}, got {name}")
    return name


def pack(w: ExpertWeights) -> np.ndarray:
    """The expert's record block ``[2, R/2, 1, d]`` (module docstring)."""
    n, d = w.gate.shape if w.gate.ndim == 2 else (-1, -1)
    dt = dtype_of(w)
    if (n < 1 or w.up.shape != (n, d) or w.down.shape != (d, n)
            or {w.up.dtype, w.down.dtype} != {w.gate.dtype}):
        raise ShapeError(f"an expert is gate/up [n, d] and down [d, n] of one dtype, got "
                         f"{w.gate.shape}, {w.up.shape}, {w.down.shape}")
    rows = 3 * n + (3 * n) % 2
    out = np.zeros((rows, d), dtype=numpy_dtype(dt))
    out[:n], out[n:2 * n], out[2 * n:3 * n] = w.gate, w.up, w.down.T
    return out.reshape(2, rows // 2, 1, d)


def unpack(block: np.ndarray, n: int, d: int) -> ExpertWeights:
    """The three matrices back from a record block (C-contiguous copies)."""
    rows = block.reshape(-1, d)
    return ExpertWeights(np.ascontiguousarray(rows[:n]), np.ascontiguousarray(rows[n:2 * n]),
                         np.ascontiguousarray(rows[2 * n:3 * n].T))


def pipeline_for(bits: int, ecc: str) -> Pipeline:
    if bits not in (16, 8, 4):
        raise ConfigError(f"expert bits must be 16, 8 or 4, got {bits!r}")
    return Pipeline.parse("none" if bits == 16 else f"rowq(bits={bits})", ecc)


def encode_expert(fp: bytes, layer: int, expert: int, block: np.ndarray, dtype: str,
                  pipe: Pipeline, variant: int = FULL) -> Any:
    """The record of one expert's block under ``pipe`` (quantizer, then code)."""
    header = RecordHeader(key=expert_key(fp, layer, expert, variant), layer=layer,
                          fingerprint=fp, shape=tuple(block.shape), dtype=dtype,
                          data_len=0, payload_len=0, written_ns=time.time_ns())
    p = pipe.for_block(header.shape, dtype)
    return p.encode(header, block)


class Verified:
    """One verified read: the weights, what was fixed, the record rewritten from the corrected
    data (``rewrite``: None when nothing needed fixing or repair is off) and, when asked, the
    record re-encoded for the expert's primary tier (``heal``: restoring it from a copy)."""

    __slots__ = ("corrected", "heal", "record_bytes", "rewrite", "weights")

    def __init__(self, weights: ExpertWeights, corrected: int, record_bytes: int,
                 rewrite: Any, heal: Any) -> None:
        self.weights, self.corrected = weights, corrected
        self.record_bytes, self.rewrite, self.heal = record_bytes, rewrite, heal


def read_expert(reader: TierReader, fp: bytes, layer: int, expert: int, info: ExpertInfo,
                variant: int = FULL, *, repair: bool = False, heal: bool = False,
                heal_codec: Codec | None = None) -> Verified:
    """One expert's record through the verified read path: header vote, identity (key, layer,
    fingerprint, shape, dtype, bits), end-to-end checksum, ECC with the medium's erasures.
    ``heal``: also re-encode the verified data with ``heal_codec`` (the primary tier's code;
    quantized data is kept as it is). Raises an :class:`~rkv.errors.IntegrityError`
    (``MissingRecordError`` when the record is absent)."""
    key = tier_key(fp, layer, expert, variant)
    rec, erased = fetch(reader, key)
    if rec is None:
        raise MissingRecordError(f"expert {layer}/{expert} has no record here")
    dec = decode_record(rec, expect_key=expert_key(fp, layer, expert, variant),
                        expect_layer=layer, expect_fingerprint=fp)
    h = dec.header
    quant, codec = header_stages(h)
    bits = 16 if quant is None else int(quant.bits)
    want_bits = info.bits if variant == FULL else bits
    if h.shape != info.shape or h.dtype != info.dtype or bits != want_bits or (
            variant == LOW and quant is None):
        raise RecordMismatchError(f"record holds {h.dtype}{list(h.shape)} at {bits} bits, "
                                  f"expected {info.dtype}{list(info.shape)}")
    dest = np.empty(info.shape, dtype=numpy_dtype(info.dtype))
    v = read_block(dec, dest, erased)
    if v.degraded:
        raise UncorrectableError("expert record read back degraded (a tolerant byte plane "
                                 "failed): weights are never returned unverified")
    fixed = bool(v.corrected or dec.header_repairs or erased)
    now = time.time_ns()      # a rewritten record's write time (its age restarts)
    rewrite = _copy(reencode(rec, dec, codec, erased, now)) if fixed and repair else None
    healed = _copy(reencode(rec, dec, heal_codec, erased, now)) if heal else None
    return Verified(unpack(dest, info.n, info.d), int(v.corrected or fixed),
                    memoryview(rec).nbytes, rewrite, healed)


def _copy(record: Any) -> bytes:
    """A record as bytes that outlive the reader's snapshot."""
    return bytes(memoryview(record).cast("B"))


# -- placement -----------------------------------------------------------------------------
def place(infos: Mapping[tuple[int, int], Any], tiers: Sequence[TierConfig],
          usage: Mapping[tuple[int, int], float] | None, backup: str | None,
          sizes: Mapping[tuple[str, tuple[int, int]], int], low: Mapping[tuple[int, int], int],
          fixed: Mapping[tuple[int, int], str] | None = None
          ) -> dict[tuple[int, int], tuple[str, str | None]]:
    """(primary tier, backup tier) per expert: the most used experts (``usage``, default
    layer then id order) in the first tier with room, after the low-bit copies (first tier)
    and every backup copy (``backup`` tier) are reserved; ``fixed``: the planned tier of
    every expert instead (only checked). ``TierFullError`` when it cannot."""
    free = {t.name: t.capacity_bytes for t in tiers}
    first = tiers[0].name
    free[first] -= sum(low.values())
    if free[first] < 0:
        raise TierFullError(f"tier {first} cannot hold the low-bit copies ({sum(low.values())} "
                            f"bytes, capacity {tiers[0].capacity_bytes})")
    order = sorted(infos, key=lambda k: (-(usage or {}).get(k, 0.0), k))
    out: dict[tuple[int, int], tuple[str, str | None]] = {}
    for k in order:
        for t in tiers if fixed is None else [t for t in tiers if t.name == fixed[k]]:
            need = sizes[(t.name, k)]
            extra = sizes[(backup, k)] if backup is not None and backup != t.name else 0
            if need <= free[t.name] and (backup is None or extra <= free[backup]
                                         - (need if backup == t.name else 0)):
                free[t.name] -= need
                if extra:
                    assert backup is not None
                    free[backup] -= extra
                out[k] = (t.name, backup if extra else None)
                break
        else:
            raise TierFullError(f"expert {k[0]}/{k[1]} fits no tier (free: {free})")
    return out


# -- the manifest ----------------------------------------------------------------------------
def write_manifest(root: Path, body: dict[str, Any]) -> None:
    """``<root>/moe.json``: the JSON body and its xxh3_64 seal, written atomically."""
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    doc = {"body": text, "seal": xxhash.xxh3_64_hexdigest(text.encode())}
    tmp = root / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, root / MANIFEST)


def read_manifest(root: Path) -> dict[str, Any]:
    from rkv.inputs import MAX_DOC_BYTES, read_bytes

    path = root / MANIFEST
    if not path.exists():
        raise StoreError(f"no rkv expert store at {root} (no {MANIFEST})")
    try:   # a regular file of at most 4 MiB (a manifest is a few KiB)
        doc = json.loads(read_bytes(path, "expert store manifest", limit=MAX_DOC_BYTES,
                                    error=CorruptStoreError))
    except ValueError as exc:
        raise CorruptStoreError(f"{path} is unreadable: {exc}") from exc
    text = doc.get("body") if isinstance(doc, dict) else None
    if not isinstance(text, str) or xxhash.xxh3_64_hexdigest(text.encode()) != doc.get("seal"):
        raise CorruptStoreError(f"{path} fails its seal")
    body: dict[str, Any] = json.loads(text)
    if body.get("format") != FORMAT:
        raise CorruptStoreError(f"{path}: unknown format {body.get('format')!r}")
    return body


def infos_from(body: dict[str, Any]) -> list[list[ExpertInfo]]:
    """The manifest's experts, each with its record's code filled in (a manifest written
    before per-expert codes names none: the tier's). ``CorruptStoreError`` if malformed."""
    try:
        ecc = {t["name"]: t["ecc"] for t in body["tiers"]}
        out = [[ExpertInfo(**e) for e in layer] for layer in body["layers"]]
        return [[i if i.ecc else replace(i, ecc=ecc[i.tier]) for i in layer] for layer in out]
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptStoreError(f"expert manifest is malformed: {exc!r}") from exc


# -- tiers and the store ---------------------------------------------------------------------
def tier_path(root: Path, t: TierConfig) -> Path:
    """Where a tier's environment lives: ``<root>/tiers/<name>`` unless its config says."""
    if not t.path:
        return root / "tiers" / t.name
    p = Path(t.path)
    return p if p.is_absolute() else root / p


def open_tiers(root: Path, cfgs: Sequence[TierConfig], readonly: bool) -> dict[str, Tier]:
    # A redis tier opens as one (its settings ride on the spec), never as a local LMDB.
    return {t.name: open_tier(TierSpec(t.name, t.capacity_bytes, t.map_bytes, t.sync, t.reads,
                                       t.remote_settings()),
                              tier_path(root, t), readonly) for t in cfgs}


def tier_configs(tiers: Sequence[TierConfig] | None, ecc: Mapping[str, str] | None
                 ) -> tuple[TierConfig, ...]:
    """The tiers (default: rkv's dram/cxl/nvme) with ``ecc`` overrides applied, checked."""
    cfgs = tuple(default_tiers() if tiers is None else tiers)
    if not cfgs or len({t.name for t in cfgs}) != len(cfgs):
        raise ConfigError("RkvExperts needs at least one tier, with distinct names")
    unknown = set(ecc or {}) - {t.name for t in cfgs}
    if unknown:
        raise ConfigError(f"ecc names unknown tiers: {sorted(unknown)}")
    cfgs = tuple(replace(t, ecc=(ecc or {}).get(t.name, t.ecc)) for t in cfgs)
    for t in cfgs:
        if t.quant.strip().lower() != "none":
            raise ConfigError(f"tier {t.name}: quant {t.quant!r} is a KV quantizer; expert "
                              "bits are set per expert (bits=)")
    return cfgs


def write_store(root: Path, experts: Sequence[Sequence[ExpertWeights]], fp: bytes,
                cfgs: Sequence[TierConfig], *, bits: int | Mapping[tuple[int, int], int],
                low_bit_copy: int | None, backup_tier: str | None,
                usage: Mapping[tuple[int, int], float] | None,
                plan: Mapping[tuple[int, int], tuple[str, int, str]] | None = None,
                extra: Mapping[str, Any] | None = None) -> None:
    """Place and write every expert's records, then the manifest (``RkvExperts.create``).
    ``plan``: ``(tier, bits, code)`` per expert (:mod:`rkv.moe.expert_plans`), replacing
    ``bits``, the tiers' codes and placement by ``usage``; ``extra``: kept in the manifest."""
    names = [t.name for t in cfgs]
    if backup_tier is not None and backup_tier not in names:
        raise ConfigError(f"backup_tier {backup_tier!r} is not a tier ({names})")
    if low_bit_copy not in (None, 4, 8):
        raise ConfigError(f"low_bit_copy must be None, 4 or 8, got {low_bit_copy!r}")
    if not experts or any(not layer for layer in experts):
        raise InputError("experts must list at least one expert per layer")
    if (root / MANIFEST).exists():
        raise StoreError(f"{root} already holds an expert store (RkvExperts.destroy)")
    meta: dict[tuple[int, int], dict[str, Any]] = {}
    sizes: dict[tuple[str, tuple[int, int]], int] = {}
    low: dict[tuple[int, int], int] = {}
    ecc_of = {t.name: t.ecc for t in cfgs}
    if plan is not None:
        want = {(li, ei) for li, layer in enumerate(experts) for ei in range(len(layer))}
        if set(plan) != want or any(t not in ecc_of for t, _, _ in plan.values()):
            raise ConfigError("the plan must give every expert, and only them, a known tier")
    for li, layer in enumerate(experts):
        for ei, w in enumerate(layer):
            k = (li, ei)
            b = (plan[k][1] if plan is not None else
                 bits if isinstance(bits, int) else int(bits.get(k, 16)))
            shape = tuple(pack(w).shape)           # validates the matrices
            dt = dtype_of(w)
            for t in cfgs:
                code = plan[k][2] if plan is not None and plan[k][0] == t.name else t.ecc
                p = pipeline_for(b, code).for_block(shape, dt)
                sizes[(t.name, k)] = p.record_bytes(shape, dt)
            if low_bit_copy is not None:
                p = pipeline_for(low_bit_copy, cfgs[0].ecc).for_block(shape, dt)
                low[k] = p.record_bytes(shape, dt)
            meta[k] = {"n": int(w.gate.shape[0]), "d": int(w.gate.shape[1]), "dtype": dt,
                       "bits": b, "nbytes": w.nbytes}
    fixed = None if plan is None else {k: v[0] for k, v in plan.items()}
    where = place(meta, cfgs, usage, backup_tier, sizes, low, fixed)
    root.mkdir(parents=True, exist_ok=True)
    opened = open_tiers(root, cfgs, readonly=False)
    jobs: dict[str, list[tuple[bytes, Callable[[], Any]]]] = {n: [] for n in names}

    def job(k: tuple[int, int], tier: str, b: int, variant: int) -> None:
        w = experts[k[0]][k[1]]
        code = plan[k][2] if plan is not None and variant == FULL and tier == plan[k][0] \
            else ecc_of[tier]
        pipe = pipeline_for(b, code)
        jobs[tier].append((tier_key(fp, k[0], k[1], variant), lambda: encode_expert(
            fp, k[0], k[1], pack(w), dtype_of(w), pipe, variant)))
        if len(jobs[tier]) >= _BATCH:
            opened[tier].put_many(jobs[tier])
            jobs[tier] = []

    try:
        for k, m in meta.items():
            primary, backup = where[k]
            m.update(tier=primary, backup=backup, record_bytes=sizes[(primary, k)],
                     low_bytes=low.get(k, 0),
                     ecc=plan[k][2] if plan is not None else ecc_of[primary])
            job(k, primary, int(m["bits"]), FULL)
            if backup is not None:
                job(k, backup, int(m["bits"]), FULL)
            if low_bit_copy is not None:
                job(k, names[0], low_bit_copy, LOW)
        for name, items in jobs.items():
            if items:
                opened[name].put_many(items)
    finally:
        for tier in opened.values():
            tier.close()
    write_manifest(root, {
        "format": FORMAT, "fingerprint": fp.hex(), "low_bit_copy": low_bit_copy,
        "tiers": [t.to_dict() for t in cfgs], **(extra or {}),
        "layers": [[meta[(li, ei)] for ei in range(len(layer))]
                   for li, layer in enumerate(experts)]})
