"""Storage tiers."""

from rkv.tiers.base import Tier, TierReader
from rkv.tiers.lmdb_tier import LmdbTier
from rkv.tiers.unavailable import UnavailableTier

__all__ = ["LmdbTier", "Tier", "TierReader", "UnavailableTier"]
