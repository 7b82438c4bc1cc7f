"""What a campaign runs and what it found: :class:`CampaignConfig` and :class:`Summary`.

Shared by the campaign's driver (:mod:`rkv.eval.faults.campaign`), its trials
(:mod:`rkv.eval.faults.bench`) and its report (:mod:`rkv.eval.faults.campaign_report`), which
import these from here and not from each other.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from rkv.checks import as_float, as_int, as_str, as_table, check_keys, one_of
from rkv.errors import ConfigError
from rkv.format.dtypes import NAMES
from rkv.format.model import ModelSpec
from rkv.reliability.analytic import Prediction
from rkv.reliability.protection import RAW
from rkv.store.config import TierConfig, default_tiers

__all__ = ["SAMPLING", "CampaignConfig", "Summary"]

SAMPLING = ("auto", "direct", "conditional")


@dataclass(frozen=True)
class CampaignConfig:
    """What a campaign runs. Round-trips to dicts and TOML (``[campaign]`` table or top level).

    ``tier`` picks a default tier (``dram``, ``cxl``, ``nvme``) for its fault model and
    protection; ``fault_model`` (a preset name, or a table with ``preset`` and overrides) and
    ``protection`` (a codec spec, ``none`` for the end-to-end checksum alone, ``raw`` for no
    protection at all) override it. The block shape defaults to one SmolLM2-135M block
    (256 tokens x 3 KV heads x 64 dims, fp16: 192 KiB). ``ber_multiplier`` accelerates the
    fault model (:func:`faultmodels.accelerate`: its raw fault rates times that factor); the
    analytic prediction judges the same accelerated model.
    """

    tier: str = "nvme"
    fault_model: str | dict[str, Any] = ""
    protection: str = ""
    hours: float = 24.0
    trials: int = 100
    blocks: int = 8
    chunk_tokens: int = 256
    kv_heads: int = 3
    head_dim: int = 64
    dtype: str = "float16"
    bits: int = 16
    seed: int = 0
    workers: int = 1
    sampling: str = "auto"
    rows: str = ""
    tilt: float | str = 0.0
    ber_multiplier: float = 1.0

    def __post_init__(self) -> None:
        one_of(self.tier, [t.name for t in default_tiers()], "campaign tier")
        for name in ("trials", "blocks", "chunk_tokens", "kv_heads", "head_dim", "workers"):
            as_int(getattr(self, name), f"campaign {name}", lo=1)
        as_float(self.hours, "campaign hours", lo=0)
        one_of(self.sampling, SAMPLING, "campaign sampling")
        one_of(self.bits, (16, 8, 4, 2), "campaign bits (16: values as they are)")
        one_of(self.dtype, NAMES, "campaign dtype")
        as_int(self.seed, "campaign seed", lo=0)
        if not isinstance(self.fault_model, str):
            as_table(self.fault_model, "campaign fault_model", what="a preset name or a table")
        as_str(self.protection, "campaign protection")
        as_str(self.rows, "campaign rows")
        if self.tilt != "auto":
            as_float(self.tilt, 'campaign tilt (0: off, a factor > 0, or "auto")', lo=0)
        import faultmodels

        try:
            faultmodels.check_multiplier(self.ber_multiplier)
        except faultmodels.FaultModelError as exc:
            raise ConfigError(f"campaign {exc}") from exc
        self.tier_config()  # validates the protection's codec spec
        model = self.model()        # validates the fault model
        if self.ber_multiplier != 1:
            try:            # an accelerated class past probability 1 says so now
                model.events(self.data_bytes, self.hours)
            except faultmodels.FaultModelError as exc:
                raise ConfigError(f"campaign ber_multiplier: {exc}") from exc

    # -- derived --------------------------------------------------------------------------
    def tier_config(self) -> TierConfig:
        base = next(t for t in default_tiers() if t.name == self.tier)
        prot = self.effective_protection()
        fm = self.fault_model if isinstance(self.fault_model, str) and self.fault_model else (
            base.fault_model if not self.fault_model else "custom")
        return replace(base, ecc="none" if prot == RAW else prot, fault_model=fm,
                       quant=self.quant_spec(), capacity_bytes=1 << 40, path="tier")

    def quant_spec(self) -> str:
        return "none" if self.bits >= 16 else f"kivi(bits={self.bits})"

    def effective_protection(self) -> str:
        if self.protection:
            return self.protection.strip()
        return next(t for t in default_tiers() if t.name == self.tier).ecc

    def protection_pipeline(self) -> Any:
        """What ``predict`` judges: the stored record's pipeline (quantizer and code; the
        record header lists both, so the framing counts them), or ``"raw"``."""
        prot = self.effective_protection()
        if prot == RAW:
            return RAW
        from rkv.codec.pipeline import Pipeline

        shape = (2, self.chunk_tokens, self.kv_heads, self.head_dim)
        return Pipeline.parse(self.quant_spec(), prot).for_block(shape, self.dtype)

    def record_bytes(self) -> int:
        """Bytes of one stored record (``data_bytes`` for raw storage): what ``predict``'s
        ``record_bytes`` says, from the record's framing alone, without the seconds a
        prediction takes (``--replay`` of one trial needs the size, not the prediction)."""
        pipe = self.protection_pipeline()
        return self.data_bytes if pipe == RAW else int(pipe.record_bytes_for(self.data_bytes))

    def model(self) -> Any:
        import faultmodels

        spec: Any = self.fault_model or next(
            t for t in default_tiers() if t.name == self.tier).fault_model
        try:
            return faultmodels.accelerate(faultmodels.get_model(spec), self.ber_multiplier)
        except ValueError as exc:
            raise ConfigError(f"bad fault model {spec!r}: {exc}") from exc

    def model_spec(self) -> ModelSpec:
        return ModelSpec("campaign/block", n_layers=1, n_kv_heads=self.kv_heads,
                         head_dim=self.head_dim, dtype=self.dtype)

    @property
    def data_bytes(self) -> int:
        """Bytes of one block's data as stored (after quantization, before any ECC)."""
        shape = (2, self.chunk_tokens, self.kv_heads, self.head_dim)
        if self.bits < 16:
            from rkv.codec.stages import quantizer_for

            q = quantizer_for(self.quant_spec())
            assert q is not None
            return int(q.encoded_size(shape, self.dtype))
        return 2 * self.chunk_tokens * self.kv_heads * self.head_dim * (
            4 if self.dtype == "float32" else 2)

    def trial_seed(self, trial: int) -> int:
        """The seed of trial ``trial``: replaying it needs nothing else."""
        return int(np.random.SeedSequence([self.seed, trial]).generate_state(1, np.uint64)[0])

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CampaignConfig:
        if not isinstance(d, dict):
            raise ConfigError("campaign config must be a table")
        d = d.get("campaign", d) if isinstance(d.get("campaign"), dict) else d
        check_keys(d, [f.name for f in fields(cls)], "campaign")
        try:
            return cls(**d)
        except TypeError as exc:
            raise ConfigError(f"bad campaign config: {exc}") from exc

    @classmethod
    def load(cls, path: str | Path) -> CampaignConfig:
        from rkv.inputs import read_toml

        return cls.from_dict(read_toml(path, "campaign config"))


@dataclass
class Summary:
    config: dict[str, Any]
    protection: str
    sampling: str
    trials: int
    blocks: int
    counts: dict[str, int]
    p_any_error: float
    rates: dict[str, tuple[float, float, float]]     # outcome -> (rate, low, high), per block
    prediction: Prediction
    seconds: float
    extra: dict[str, Any] = field(default_factory=dict)
    #: Under importance sampling: outcome -> estimate, stderr, rel_err, hits, ess; and "plan",
    #: "weight_ess".
    importance: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "trials": self.trials, "blocks": self.blocks, **self.counts,
            "protection": self.protection, "sampling": self.sampling,
            "p_any_error": self.p_any_error,
            "rates": {k: {"rate": r, "ci95": [lo, hi]} for k, (r, lo, hi) in self.rates.items()},
            "analytic": self.prediction.to_dict(),
            "seconds": self.seconds,
            "blocks_per_second": self.blocks / self.seconds if self.seconds else 0.0,
            "config": self.config, **self.extra,
            **({"importance": self.importance} if self.importance is not None else {}),
        }
