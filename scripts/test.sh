#!/usr/bin/env bash
# Set up the environment, then run lint, type checks and the default test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-env.sh
# The remote-tier tests start their own redis-server on a loopback port (tests/redis_server.py).
command -v redis-server >/dev/null || (apt-get update -qq >/dev/null && \
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null)
.venv/bin/ruff check .
.venv/bin/mypy
.venv/bin/python -m pytest -q -n 2 "$@"
