"""Storage tiers."""

from rkv.tiers.base import Tier, TierReader
from rkv.tiers.lmdb_tier import LmdbTier

__all__ = ["LmdbTier", "Tier", "TierReader"]
