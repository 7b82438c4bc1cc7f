"""rkv: a reliability-aware tiered storage engine for LLM KV caches."""

from rkv.config import EngineConfig, TierConfig
from rkv.engine import BlockStatus, Engine, GetResult, PutResult, VerifyReport
from rkv.errors import (
    ChecksumError,
    ConfigError,
    CorruptRecordError,
    InputError,
    IntegrityError,
    MissingRecordError,
    RecordMismatchError,
    RkvError,
    ShapeError,
    StoreClosedError,
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
    "Engine",
    "EngineConfig",
    "GetResult",
    "InputError",
    "IntegrityError",
    "MissingRecordError",
    "ModelSpec",
    "PutResult",
    "RecordMismatchError",
    "RkvError",
    "ShapeError",
    "StoreClosedError",
    "TierConfig",
    "TierFullError",
    "TruncatedRecordError",
    "UncorrectableError",
    "UnknownFormatError",
    "VerifyReport",
    "__version__",
]
