"""The remote-tier tests run against a real redis-server (tests/redis_server.py)."""

from redis_server import auth_redis, own_redis, redis_server  # noqa: F401 - fixtures
