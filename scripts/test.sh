#!/usr/bin/env bash
# Set up the environment, then run lint, type checks and the default test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-env.sh
# The remote-tier tests start their own redis-server on a loopback port (tests/redis_server.py)
# and a 3-master cluster with redis-cli --cluster create (tests/redis_cluster.py; redis-cli
# comes with the redis-server package).
{ command -v redis-server && command -v redis-cli; } >/dev/null || (apt-get update -qq >/dev/null && \
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null)
.venv/bin/ruff check .
.venv/bin/mypy
.venv/bin/python -m pytest -q -n 2 "$@"
# The vLLM connector's tests in .venv-vllm (made by setup-env.sh): a real vLLM on the CPU.
# In .venv they skip (no vLLM there); here they must run (a few minutes). Not when the
# command was given pytest arguments (a selection of the main suite).
if [ $# -eq 0 ] && [ "${RKV_SKIP_VLLM:-0}" != "1" ]; then
  bash scripts/vllm-env.sh .venv-vllm/bin/python -m pytest -q -p no:cacheprovider tests/vllm
fi
