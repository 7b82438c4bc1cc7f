"""Storage tiers: byte stores of opaque records. Nothing here knows about codecs, models or
policies (and nothing here imports :mod:`rkv.store.config`)."""

from pathlib import Path

from rkv.errors import CorruptStoreError, ReadOnlyStoreError, StoreError
from rkv.tiers.base import Tier, TierReader, TierSpec
from rkv.tiers.lmdb_tier import LmdbTier
from rkv.tiers.remote_config import is_cluster
from rkv.tiers.unavailable import UnavailableTier
from rkv.tiers.wrapper import TierWrapper, unwrap

__all__ = ["LmdbTier", "Tier", "TierReader", "TierSpec", "TierWrapper", "UnavailableTier",
           "open_tier", "unwrap"]


def open_tier(t: TierSpec, path: Path, readonly: bool) -> Tier:
    """The tier's LMDB environment, or a stand-in that fails its reads when it cannot be
    opened (damaged, or missing in a read-only open); a remote tier when ``t.remote`` holds
    its settings."""
    if t.remote is not None:
        if is_cluster(t.remote.url):
            from rkv.tiers.redis_cluster import RedisClusterTier  # (redis only when used)

            return RedisClusterTier(t, t.remote)
        from rkv.tiers.redis_tier import RedisTier  # (imports redis only when used)

        return RedisTier(t, t.remote)
    if path.exists() and not path.is_dir():    # e.g. a memory-tier path that became a file
        return UnavailableTier(t, path, "its path is not a directory")
    try:
        return LmdbTier(t, path, readonly=readonly)
    except CorruptStoreError as exc:
        return UnavailableTier(t, path, str(exc))
    except StoreError as exc:
        if not readonly or isinstance(exc, ReadOnlyStoreError):
            raise
        return UnavailableTier(t, path, "missing (wiped?)", missing=True)

