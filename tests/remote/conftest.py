"""The remote-tier tests run against a real redis-server (tests/redis_server.py) or a real
3-master Redis Cluster (tests/redis_cluster.py)."""

from redis_cluster import own_cluster, redis_cluster  # noqa: F401 - fixtures
from redis_server import auth_redis, own_redis, redis_server  # noqa: F401 - fixtures
