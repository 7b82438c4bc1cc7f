"""The Redis tier's contract runs against a real redis-server (tests/redis_server.py)."""

from redis_server import redis_server  # noqa: F401 - fixture
