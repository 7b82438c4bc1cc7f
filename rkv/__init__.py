"""rkv: a reliability-aware tiered storage engine for LLM KV caches."""

from typing import TYPE_CHECKING, Any

from rkv.errors import (
    ChecksumError,
    ConfigError,
    CorruptRecordError,
    CorruptStoreError,
    InputError,
    IntegrityError,
    MediumError,
    MissingRecordError,
    PolicyContractError,
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

if TYPE_CHECKING:
    from rkv.format.model import ModelSpec
    from rkv.store.config import EngineConfig, TierConfig
    from rkv.store.engine import BlockStatus, Engine, GetResult, PutResult, VerifyReport

#: Public names loaded on first use, so that ``import rkv`` (and ``rkv --help``, or a
#: serving engine's launcher that forks workers) does not load numpy, numba, LMDB and the
#: engine: the errors above are plain Python.
_LAZY = {
    "EngineConfig": "rkv.store.config", "TierConfig": "rkv.store.config",
    "ModelSpec": "rkv.format.model", "BlockStatus": "rkv.store.engine",
    "Engine": "rkv.store.engine", "GetResult": "rkv.store.engine",
    "PutResult": "rkv.store.engine", "VerifyReport": "rkv.store.engine",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'rkv' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value          # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


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
    "PolicyContractError",
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
