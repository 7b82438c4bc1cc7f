"""Quality profiles: the one :class:`QualityProfile` type, its file format and loaders
(:mod:`rkv.profiles.profile`), and the profiles shipped with rkv (JSON, one per model, in this
package; ``moe/`` holds expert profiles, :mod:`rkv.moe.profile`)."""

from __future__ import annotations

from rkv.profiles.profile import (
    BITS,
    KINDS,
    MAX_PROFILE_BYTES,
    KlFn,
    QualityProfile,
    as_profile,
    block_key,
    load_profile,
    parse_profile,
    read_profile,
    shipped_profiles,
    validate_profile,
    write_profile,
)

__all__ = [
    "BITS",
    "KINDS",
    "MAX_PROFILE_BYTES",
    "KlFn",
    "QualityProfile",
    "as_profile",
    "block_key",
    "load_profile",
    "parse_profile",
    "read_profile",
    "shipped_profiles",
    "validate_profile",
    "write_profile",
]
