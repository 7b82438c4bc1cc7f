"""The vLLM connector tests: tests/vllm/vllm_jobs.py runs a real vLLM per job; the
two-instance test shares a real redis-server (tests/redis_server.py)."""

from redis_server import redis_server  # noqa: F401 - fixture
