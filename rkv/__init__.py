"""rkv: a reliability-aware tiered storage engine for LLM KV caches."""

from rkv.config import EngineConfig, TierConfig
from rkv.engine import BlockStatus, Engine, GetResult, PutResult, VerifyReport
from rkv.errors import (
    ChecksumError,
    ConfigError,
    CorruptRecordError,
    CorruptStoreError,
    InputError,
    IntegrityError,
    MediumError,
    MissingRecordError,
    ReadOnlyStoreError,
    RecordMismatchError,
    RkvError,
    ShapeError,
    StaleRecordError,
    StoreClosedError,
    StoreError,
    TierFullError,
    TruncatedRecordError,
    UncorrectableError,
    UnknownFormatError,
)
from rkv.model import ModelSpec

__version__ = "0.1.0"

__all__ = [
    "BlockStatus",
    "ChecksumError",
    "ConfigError",
    "CorruptRecordError",
    "CorruptStoreError",
    "Engine",
    "EngineConfig",
    "GetResult",
    "InputError",
    "IntegrityError",
    "MediumError",
    "MissingRecordError",
    "ModelSpec",
    "PutResult",
    "ReadOnlyStoreError",
    "RecordMismatchError",
    "RkvError",
    "ShapeError",
    "StaleRecordError",
    "StoreClosedError",
    "StoreError",
    "TierConfig",
    "TierFullError",
    "TruncatedRecordError",
    "UncorrectableError",
    "UnknownFormatError",
    "VerifyReport",
    "__version__",
]
